// The host backend: an accelerator made of host memory (DESIGN.md §1, §7).
//
// Note [host streams are threads]: each Stream owns one worker thread that runs its queue in order, so a
// copy enqueued on a stream runs while the caller computes, exactly as on a GPU, and the same ordering
// bugs show up without one. An event record is a queue entry that marks a fresh completion state; wait()
// captures the state current at call time (CUDA semantics: the most recent record), so a later record of
// the same event never changes what an earlier wait waits for.
//
// Note [host thread device]: the host backend's half of Note [thread device] (core/device.h). Each
// thread has an emulated current ordinal, t_current_ordinal, 0 until it binds a device, as CUDA's current
// device is. bind_thread(), open_device() and every stream worker at its start set it to the device's
// ordinal. With DeviceOptions::check_thread_device, the device, its streams and its events share one
// ThreadCheck that each entry point calls first; a thread whose current ordinal differs gets a
// strata::Error naming the call (and stream), the thread (id and name) and both ordinals. Off, the
// check is one load and an untaken branch, and nothing else changes: the ordinal is only compared.
#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "core/device_impl.h"
#include "core/error.h"
#include "core/log.h"

namespace strata::detail {
namespace {

thread_local int t_current_ordinal = 0;  // this thread's current device, emulated (Note [host thread device])

// "thread 1234 ("name")": the kernel's thread id and the name the thread was given, if any.
std::string this_thread_text() {
  char name[32] = {};
  std::string s = cat("thread ", ::gettid());
  if (::pthread_getname_np(::pthread_self(), name, sizeof name) == 0 && name[0])
    s += cat(" (\"", name, "\")");
  return s;
}

// The entry-point check of Note [host thread device], shared by a device and its streams and events.
struct ThreadCheck {
  int ordinal = 0;
  bool on = false;
  // `what`: the entry point ("Device::allocate", "copy_async"); `stream`: its stream's name, or null.
  void operator()(const char* what, const std::string* stream = nullptr) const {
    if (on && t_current_ordinal != ordinal) [[unlikely]]
      fail(what, stream);
  }
  [[noreturn]] void fail(const char* what, const std::string* stream) const {
    throw Error(cat("host device ", ordinal, ": ", stream ? cat("stream '", *stream, "' ") : std::string(),
                    what, " called from ", this_thread_text(), ", whose current device is ",
                    t_current_ordinal, ", not ", ordinal,
                    ". Every thread that uses a device calls Device::bind_thread() first (Note [thread "
                    "device] in core/device.h); on a GPU this thread's CUDA calls would run on device ",
                    t_current_ordinal, " and create a context there"));
  }
};
using ThreadCheckPtr = std::shared_ptr<const ThreadCheck>;

class HostEvent final : public Event {
 public:
  explicit HostEvent(ThreadCheckPtr check) : check_(std::move(check)) {}
  bool query() const override {
    (*check_)("Event::query");
    auto c = current();
    return !c || c->ready();
  }
  void synchronize() const override {
    (*check_)("Event::synchronize");
    if (auto c = current()) c->wait();
  }
  std::shared_ptr<Completion> current() const {
    std::lock_guard<std::mutex> lk(m_);
    return cur_;
  }
  void set_current(std::shared_ptr<Completion> c) {
    std::lock_guard<std::mutex> lk(m_);
    cur_ = std::move(c);
  }

 private:
  ThreadCheckPtr check_;
  mutable std::mutex m_;
  std::shared_ptr<Completion> cur_;  // null: never recorded
};

class HostStream;

// The live streams of one device, so Device::synchronize can reach them all.
struct StreamSet {
  std::mutex m;
  std::unordered_map<HostStream*, bool> live;
};

class HostStream final : public Stream {
 public:
  HostStream(const std::string& name, std::shared_ptr<StreamSet> set, ThreadCheckPtr check)
      : Stream(name), set_(std::move(set)), check_(std::move(check)), worker_([this] { run(); }) {
    std::lock_guard<std::mutex> lk(set_->m);
    set_->live[this] = true;
  }
  ~HostStream() override {
    {
      std::lock_guard<std::mutex> lk(set_->m);
      set_->live.erase(this);
    }
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();  // drains the queue first
  }

  void copy_async(void* dst, const void* src, std::size_t bytes, CopyKind) override {
    (*check_)("copy_async", &name());
    if (bytes == 0) return;
    STRATA_CHECK(dst && src, "copy_async on stream ", name(), ": null pointer");
    enqueue([=] { std::memcpy(dst, src, bytes); });
  }
  void memset_async(void* dst, int value, std::size_t bytes) override {
    (*check_)("memset_async", &name());
    if (bytes == 0) return;
    STRATA_CHECK(dst, "memset_async on stream ", name(), ": null pointer");
    enqueue([=] { std::memset(dst, value, bytes); });
  }
  void host_fn(std::function<void()> fn) override {
    (*check_)("host_fn", &name());
    enqueue(std::move(fn));
  }
  void record(Event& e) override {
    (*check_)("record", &name());
    auto c = std::make_shared<Completion>();
    dynamic_cast<HostEvent&>(e).set_current(c);
    enqueue([c] { c->set(); }, /*busy=*/false);
  }
  void wait(const Event& e) override {
    (*check_)("wait", &name());
    if (auto c = dynamic_cast<const HostEvent&>(e).current()) enqueue([c] { c->wait(); }, /*busy=*/false);
  }
  void synchronize() override {
    (*check_)("synchronize", &name());
    auto c = std::make_shared<Completion>();
    enqueue([c] { c->set(); }, /*busy=*/false);
    c->wait();
    std::exception_ptr err;
    {
      std::lock_guard<std::mutex> lk(m_);
      std::swap(err, error_);
    }
    if (err) std::rethrow_exception(err);
  }
  void* native_handle() override { return nullptr; }
  double busy_seconds() const override {
    std::lock_guard<std::mutex> lk(busy_m_);
    const std::chrono::duration<double> running =
        busy_since_ ? BusyClock::now() - *busy_since_ : BusyClock::duration::zero();
    return (busy_ + running).count();
  }

 private:
  using BusyClock = std::chrono::steady_clock;
  struct Work {
    std::function<void()> fn;
    bool busy;  // false: an event wait or a completion marker, which is not work
  };

  void enqueue(std::function<void()> fn, bool busy = true) {
    {
      std::lock_guard<std::mutex> lk(m_);
      q_.push_back({std::move(fn), busy});
    }
    cv_.notify_one();
  }
  void run() {
    t_current_ordinal = check_->ordinal;  // as a cuda stream's worker makes its device current
    for (;;) {
      Work w;
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
        if (q_.empty()) return;  // stop_ and drained
        w = std::move(q_.front());
        q_.pop_front();
      }
      if (w.busy) {
        std::lock_guard<std::mutex> lk(busy_m_);
        busy_since_ = BusyClock::now();
      }
      try {
        w.fn();
      } catch (...) {
        std::lock_guard<std::mutex> lk(m_);
        if (!error_) error_ = std::current_exception();
      }
      if (w.busy) {
        std::lock_guard<std::mutex> lk(busy_m_);
        busy_ += BusyClock::now() - *busy_since_;
        busy_since_.reset();
      }
    }
  }

  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Work> q_;
  mutable std::mutex busy_m_;                        // guards the two below, read by busy_seconds()
  BusyClock::duration busy_{};                       // finished work
  std::optional<BusyClock::time_point> busy_since_;  // the work running now
  bool stop_ = false;
  std::exception_ptr error_;
  std::shared_ptr<StreamSet> set_;
  ThreadCheckPtr check_;
  std::thread worker_;  // last: starts after the members it uses exist
};

constexpr std::size_t kDeviceAlign = 4096;  // page: device buffers can be O_DIRECT targets

class HostDevice final : public Device {
 public:
  explicit HostDevice(const DeviceOptions& opts) {
    if (opts.ordinal < 0)
      throw ConfigError(cat("strata.device: ", opts.ordinal, " is not a device ordinal; use 0 or more"));
    caps_.backend = BackendKind::host;
    caps_.name = "host";
    caps_.ordinal = opts.ordinal;
    caps_.physical_bytes = physical_ram_bytes();
    caps_.capacity = opts.memory_cap ? opts.memory_cap : caps_.physical_bytes;
    caps_.host_addressable = true;
    check_ = std::make_shared<const ThreadCheck>(
        ThreadCheck{.ordinal = opts.ordinal, .on = opts.check_thread_device});
    bind_thread();
  }
  ~HostDevice() override {
    for (auto& [p, n] : pinned_) release_pinned(p, n);
    for (auto& [p, n] : live_) std::free(p);
  }

  const DeviceCaps& caps() const override { return caps_; }
  void bind_thread() const override { t_current_ordinal = caps_.ordinal; }
  void limit_capacity(std::size_t bytes) override {
    std::lock_guard<std::mutex> lk(m_);
    caps_.capacity = std::min(caps_.capacity, bytes);
  }

  void* allocate(std::size_t bytes, const char* what) override {
    (*check_)("Device::allocate");
    if (bytes == 0) bytes = 1;
    {
      std::lock_guard<std::mutex> lk(m_);
      if (bytes > caps_.capacity - std::min(caps_.capacity, stats_.in_use))
        throw OutOfMemory(device_oom_message(caps_, stats_.in_use, bytes, what, ""));
      stats_.in_use += bytes;  // reserve before allocating outside the lock
    }
    void* p = std::aligned_alloc(kDeviceAlign, (bytes + kDeviceAlign - 1) / kDeviceAlign * kDeviceAlign);
    std::lock_guard<std::mutex> lk(m_);
    if (!p) {
      stats_.in_use -= bytes;
      throw OutOfMemory(device_oom_message(caps_, stats_.in_use, bytes, what,
                                           "the host is out of memory (aligned_alloc failed)"));
    }
    live_[p] = bytes;
    stats_.allocations = live_.size();
    stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
    return p;
  }
  void deallocate(void* p) override {
    (*check_)("Device::deallocate");
    if (!p) return;
    {
      std::lock_guard<std::mutex> lk(m_);
      auto it = live_.find(p);
      STRATA_CHECK(it != live_.end(), "deallocate of a pointer this device did not allocate");
      stats_.in_use -= it->second;
      live_.erase(it);
      stats_.allocations = live_.size();
    }
    std::free(p);
  }
  DeviceMemoryStats memory_stats() const override {
    std::lock_guard<std::mutex> lk(m_);
    return stats_;
  }

  void* allocate_pinned(std::size_t bytes) override {
    (*check_)("Device::allocate_pinned");
    if (bytes == 0) bytes = 1;
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      throw OutOfMemory(cat("cannot allocate ", format_bytes(bytes),
                            " of pinned host memory (mmap: ", errno_text(errno),
                            "); lower offload buffer sizes (offload_param.buffer_size / buffer_count, "
                            "offload_optimizer.buffer_count) or the model's host-resident state"));
    if (::mlock(p, bytes) != 0) {
      int err = errno;
      struct rlimit rl {};
      ::getrlimit(RLIMIT_MEMLOCK, &rl);
      STRATA_WARN_ONCE("pinned host memory: mlock of ", format_bytes(bytes), " failed (", errno_text(err),
                       "; RLIMIT_MEMLOCK ",
                       rl.rlim_cur == RLIM_INFINITY ? std::string("unlimited") : format_bytes(rl.rlim_cur),
                       "); using unlocked memory instead. Raise the limit (ulimit -l unlimited, or "
                       "memlock in /etc/security/limits.conf) to pin it.");
    }
    std::lock_guard<std::mutex> lk(m_);
    pinned_[p] = bytes;
    stats_.pinned_in_use += bytes;
    return p;
  }
  void deallocate_pinned(void* p) override {
    (*check_)("Device::deallocate_pinned");
    if (!p) return;
    std::size_t n;
    {
      std::lock_guard<std::mutex> lk(m_);
      auto it = pinned_.find(p);
      STRATA_CHECK(it != pinned_.end(), "deallocate_pinned of a pointer this device did not allocate");
      n = it->second;
      stats_.pinned_in_use -= n;
      pinned_.erase(it);
    }
    release_pinned(p, n);
  }

  std::unique_ptr<Stream> create_stream(const std::string& name) override {
    (*check_)("Device::create_stream");
    return std::make_unique<HostStream>(name, streams_, check_);
  }
  std::unique_ptr<Event> create_event() override {
    (*check_)("Device::create_event");
    return std::make_unique<HostEvent>(check_);
  }
  void synchronize() override {
    (*check_)("Device::synchronize");
    // Holding the set's lock keeps every listed stream alive while it drains.
    std::lock_guard<std::mutex> lk(streams_->m);
    for (auto& [s, _] : streams_->live) s->synchronize();
  }

 private:
  static void release_pinned(void* p, std::size_t n) {
    ::munlock(p, n);
    ::munmap(p, n);
  }

  DeviceCaps caps_;
  ThreadCheckPtr check_;
  mutable std::mutex m_;
  DeviceMemoryStats stats_;
  std::unordered_map<void*, std::size_t> live_;
  std::unordered_map<void*, std::size_t> pinned_;
  std::shared_ptr<StreamSet> streams_ = std::make_shared<StreamSet>();
};

}  // namespace

std::unique_ptr<Device> make_host_device(const DeviceOptions& opts) {
  return std::make_unique<HostDevice>(opts);
}

}  // namespace strata::detail
