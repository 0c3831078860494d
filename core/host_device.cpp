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
//
// Note [host held streams]: the host backend's half of Note [held streams] (core/stream_hold.h). Each
// HostStream keeps the holds it carries (from hold_stream, and those of the events it waits for) in a
// list under its own mutex, with their number in an atomic that copy_async and record() read first: 0,
// the product's case, and nothing else happens. Otherwise released holds are dropped, and if any is left a
// copy with a pageable host side is refused (HostMemory::owns, a search of the device's ordered maps of
// allocations, which the device shares with its streams), and record() gives the event the live holds,
// which a stream that waits for the event takes over. A hold is released by the test (the gate), never by
// the stream, so a stream is held until the gate opens, not until its worker has passed the gate.
#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/device_impl.h"
#include "core/error.h"
#include "core/log.h"
#include "core/stream_hold.h"

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

using HoldList = std::vector<std::shared_ptr<const StreamHold>>;  // Note [host held streams]

// The most recent record of an event: its completion (null: never recorded) and the holds of the stream
// it was recorded on, as they were then (null: none).
struct Recorded {
  std::shared_ptr<Completion> done;
  std::shared_ptr<const HoldList> holds;
};

class HostEvent final : public Event {
 public:
  explicit HostEvent(ThreadCheckPtr check) : check_(std::move(check)) {}
  bool query() const override {
    (*check_)("Event::query");
    auto c = current().done;
    return !c || c->ready();
  }
  void synchronize() const override {
    (*check_)("Event::synchronize");
    if (auto c = current().done) c->wait();
  }
  Recorded current() const {
    std::lock_guard<std::mutex> lk(m_);
    return cur_;
  }
  void set_current(Recorded r) {
    std::lock_guard<std::mutex> lk(m_);
    cur_ = std::move(r);
  }

 private:
  ThreadCheckPtr check_;
  mutable std::mutex m_;
  Recorded cur_;
};

// The allocations of one device, which it shares with its streams for Note [host held streams].
struct HostMemory {
  mutable std::mutex m;  // guards the members below and the device's caps_.capacity
  DeviceMemoryStats stats;
  std::map<void*, std::size_t, std::less<>> device;  // allocate(): base -> bytes
  std::map<void*, std::size_t, std::less<>> pinned;  // allocate_pinned(): base -> bytes

  // True when [p, p + n) lies inside one allocation of this device, pinned or device.
  bool owns(const void* p, std::size_t n) const {
    std::lock_guard<std::mutex> lk(m);
    return inside(pinned, p, n) || inside(device, p, n);
  }

 private:
  static bool inside(const std::map<void*, std::size_t, std::less<>>& allocs, const void* p, std::size_t n) {
    auto it = allocs.upper_bound(p);  // the first allocation that starts after p
    if (it == allocs.begin()) return false;
    --it;
    const auto off = reinterpret_cast<std::uintptr_t>(p) - reinterpret_cast<std::uintptr_t>(it->first);
    return off < it->second && n <= it->second - off;
  }
};

class HostStream;

// The live streams of one device, so Device::synchronize can reach them all.
struct StreamSet {
  std::mutex m;
  std::unordered_map<HostStream*, bool> live;
};

class HostStream final : public Stream {
 public:
  HostStream(const std::string& name, std::shared_ptr<StreamSet> set, ThreadCheckPtr check,
             std::shared_ptr<const HostMemory> memory)
      : Stream(name),
        set_(std::move(set)),
        check_(std::move(check)),
        memory_(std::move(memory)),
        worker_([this] { run(); }) {
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

  void copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind) override {
    (*check_)("copy_async", &name());
    if (bytes == 0) return;
    STRATA_CHECK(dst && src, "copy_async on stream ", name(), ": null pointer");
    if (hold_count_.load(std::memory_order_acquire) != 0) [[unlikely]]
      check_held_copy(dst, src, bytes, kind);
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
    dynamic_cast<HostEvent&>(e).set_current({c, live_holds()});
    enqueue([c] { c->set(); }, /*busy=*/false);
  }
  void wait(const Event& e) override {
    (*check_)("wait", &name());
    Recorded r = dynamic_cast<const HostEvent&>(e).current();
    if (r.holds) [[unlikely]]
      add_holds(*r.holds);
    if (r.done) enqueue([c = std::move(r.done)] { c->wait(); }, /*busy=*/false);
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

  // Note [host held streams]: adds the holds not yet released.
  void add_holds(const HoldList& holds) {
    std::lock_guard<std::mutex> lk(hold_m_);
    for (const auto& h : holds)
      if (!h->released()) holds_.push_back(h);
    hold_count_.store(holds_.size(), std::memory_order_release);
  }

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

  // The holds this stream carries that are not released yet, or null: none (the released ones are dropped).
  std::shared_ptr<const HoldList> live_holds() {
    if (hold_count_.load(std::memory_order_acquire) == 0) return nullptr;
    std::lock_guard<std::mutex> lk(hold_m_);
    std::erase_if(holds_, [](const auto& h) { return h->released(); });
    hold_count_.store(holds_.size(), std::memory_order_release);
    return holds_.empty() ? nullptr : std::make_shared<const HoldList>(holds_);
  }
  // Note [held streams] (core/stream_hold.h): on a held stream, a copy with a pageable host side is refused.
  void check_held_copy(const void* dst, const void* src, std::size_t bytes, CopyKind kind) {
    if (!live_holds()) return;
    const bool host_src = kind == CopyKind::host_to_device || kind == CopyKind::host_to_host;
    const bool host_dst = kind == CopyKind::device_to_host || kind == CopyKind::host_to_host;
    if (host_src && !memory_->owns(src, bytes)) refuse_held_copy("from", src, bytes);
    if (host_dst && !memory_->owns(dst, bytes)) refuse_held_copy("to", dst, bytes);
  }
  [[noreturn]] void refuse_held_copy(const char* direction, const void* host, std::size_t bytes) const {
    throw Error(
        cat("copy ", direction, " pageable host memory queued on stream '", name(),
            "' while it is held (by a test's gate, tests/common/stream_gate.h, or waiting for an event "
            "recorded on a held stream); on cuda the copy waits for the stream's queued work first, "
            "so it would deadlock; stage it in pinned memory (Device::allocate_pinned, "
            "strata::PinnedBuffer). The host side: ",
            bytes, " bytes at ", host,
            ", inside no pinned or device allocation of this device (Note [held streams] in "
            "core/stream_hold.h)"));
  }

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
  std::shared_ptr<const HostMemory> memory_;  // the device's allocations
  // Note [host held streams]: the holds, and their number, read without the lock.
  std::atomic<std::size_t> hold_count_{0};
  std::mutex hold_m_;
  HoldList holds_;      // guarded by hold_m_
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
    std::lock_guard<std::mutex> lk(mem_->m);  // a stream that outlives the device owns nothing
    for (auto& [p, n] : mem_->pinned) release_pinned(p, n);
    for (auto& [p, n] : mem_->device) std::free(p);
    mem_->pinned.clear();
    mem_->device.clear();
  }

  const DeviceCaps& caps() const override { return caps_; }
  void bind_thread() const override { t_current_ordinal = caps_.ordinal; }
  void limit_capacity(std::size_t bytes) override {
    std::lock_guard<std::mutex> lk(mem_->m);
    caps_.capacity = std::min(caps_.capacity, bytes);
  }

  void* allocate(std::size_t bytes, const char* what) override {
    (*check_)("Device::allocate");
    if (bytes == 0) bytes = 1;
    {
      std::lock_guard<std::mutex> lk(mem_->m);
      if (bytes > caps_.capacity - std::min(caps_.capacity, mem_->stats.in_use))
        throw OutOfMemory(device_oom_message(caps_, mem_->stats.in_use, bytes, what, ""));
      mem_->stats.in_use += bytes;  // reserve before allocating outside the lock
    }
    void* p = std::aligned_alloc(kDeviceAlign, (bytes + kDeviceAlign - 1) / kDeviceAlign * kDeviceAlign);
    std::lock_guard<std::mutex> lk(mem_->m);
    if (!p) {
      mem_->stats.in_use -= bytes;
      throw OutOfMemory(device_oom_message(caps_, mem_->stats.in_use, bytes, what,
                                           "the host is out of memory (aligned_alloc failed)"));
    }
    mem_->device[p] = bytes;
    mem_->stats.allocations = mem_->device.size();
    mem_->stats.peak_in_use = std::max(mem_->stats.peak_in_use, mem_->stats.in_use);
    return p;
  }
  void deallocate(void* p) override {
    (*check_)("Device::deallocate");
    if (!p) return;
    {
      std::lock_guard<std::mutex> lk(mem_->m);
      auto it = mem_->device.find(p);
      STRATA_CHECK(it != mem_->device.end(), "deallocate of a pointer this device did not allocate");
      mem_->stats.in_use -= it->second;
      mem_->device.erase(it);
      mem_->stats.allocations = mem_->device.size();
    }
    std::free(p);
  }
  DeviceMemoryStats memory_stats() const override {
    std::lock_guard<std::mutex> lk(mem_->m);
    return mem_->stats;
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
    std::lock_guard<std::mutex> lk(mem_->m);
    mem_->pinned[p] = bytes;
    mem_->stats.pinned_in_use += bytes;
    return p;
  }
  void deallocate_pinned(void* p) override {
    (*check_)("Device::deallocate_pinned");
    if (!p) return;
    std::size_t n;
    {
      std::lock_guard<std::mutex> lk(mem_->m);
      auto it = mem_->pinned.find(p);
      STRATA_CHECK(it != mem_->pinned.end(), "deallocate_pinned of a pointer this device did not allocate");
      n = it->second;
      mem_->stats.pinned_in_use -= n;
      mem_->pinned.erase(it);
    }
    release_pinned(p, n);
  }

  std::unique_ptr<Stream> create_stream(const std::string& name) override {
    (*check_)("Device::create_stream");
    return std::make_unique<HostStream>(name, streams_, check_, mem_);
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
  std::shared_ptr<HostMemory> mem_ = std::make_shared<HostMemory>();  // its mutex guards caps_.capacity too
  std::shared_ptr<StreamSet> streams_ = std::make_shared<StreamSet>();
};

}  // namespace

std::unique_ptr<Device> make_host_device(const DeviceOptions& opts) {
  return std::make_unique<HostDevice>(opts);
}

// Note [held streams]: a host stream carries the hold; any other stream (cuda) is left as it is.
void hold_stream(Stream& s, std::shared_ptr<const StreamHold> hold) {
  if (auto* h = dynamic_cast<HostStream*>(&s)) h->add_holds({std::move(hold)});
}

}  // namespace strata::detail
