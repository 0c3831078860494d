// The cuda backend: a real GPU through the CUDA runtime. Compiled only when STRATA_WITH_CUDA. Also holds the
// helpers core/cuda_check.h declares (the device guard, the kernel check and STRATA_CUDA_SYNC).
//
// Note [cuda device capacity]: caps().capacity is what this process may really use: the memory the driver
// reports free (so the context, other processes and other contexts are already subtracted) plus what our
// own pool holds, less a headroom of max(256 MiB, 2% of the device) for what allocates outside the Device
// after that, then clamped by a configured strata.device_memory_cap. It is read at open, once the context
// exists, and again by measure_capacity() — which the engine calls once its NCCL communicators (connected
// by one small collective each), cuBLASLt and cuDNN handles and the compute interface's workspace exist,
// before it plans — so what those libraries took at creation is already out of it, and what we took
// through the Device is in our count. The headroom (caps().reserved, shown in the plan) is for what they
// take later on their own: NCCL connections made lazily for another algorithm or protocol, the kernel
// modules CUDA loads on a kernel's first launch (lazy loading, the default since CUDA 12), cuDNN and
// cuBLASLt plans and their kernels, kernels' local memory. Every allocation the runtime makes on the
// device goes through allocate() (kernels/cuda takes its GEMM workspace and scratch from its caller), so
// the count in memory_stats() is the device footprint, and a request past the capacity gets the same
// OutOfMemory as on the host backend before the driver is asked.
//
// Note [cuda device allocator]: cudaFree synchronises the whole device, which would stall every stream
// at each release in the steady state. allocate()/deallocate() instead use a memory pool of this device
// (cudaMallocFromPoolAsync / cudaFreeAsync) on an internal stream that carries nothing else. The pool
// keeps freed memory up to the capacity (its release threshold) and hands it out again without a driver
// call; beyond that it gives memory back at its synchronisation points, so the libraries beside it keep
// their headroom. allocate() waits for its own allocation on that stream, so the pointer it
// returns is usable on any stream at once. deallocate(p) has the host backend's contract: work that uses
// p must have completed (or be ordered before the next user of the memory by the caller) — the free is
// not ordered after other streams' work. When the pool cannot grow, allocate() trims the pool's unused
// memory back to the driver and tries once more before raising OutOfMemory.
//
// Note [pinned memory placement]: cudaHostAlloc pins the pages in the calling thread, so they are placed
// by that thread's NUMA memory policy. allocate_pinned() prefers the GPU's NUMA node (caps().numa_node,
// from hwloc) for the duration of the call (set_mempolicy MPOL_PREFERRED, then the previous policy is
// restored), so staging buffers sit next to the GPU's PCIe root. Where the policy cannot be set (a
// seccomp profile, one node), the pages go where the kernel puts them, with one warning.
//
// Note [cuda host functions]: Stream::host_fn(fn) must run fn after the stream's earlier work and before
// its later work. cudaLaunchHostFunc would run fn on the driver's single callback thread, where fn may not
// call CUDA and where a blocking fn (the tier manager waits inside one) stalls the host functions of
// every other stream. Instead each CudaStream owns a worker thread (its device made current):
//   host_fn(fn):  seq = ++next_seq; record event E on the stream; enqueue a device-side wait
//                 "*flag == seq" (cuStreamWaitValue32 on a pinned, mapped host word); queue {E, fn, seq}
//                 for the worker.
//   worker:       cudaEventSynchronize(E) (earlier work done; blocking-sync event, no spinning); run fn,
//                 keeping its exception; store seq into *flag, which releases the stream's later work.
// The wait compares for equality and needs no reset: *flag becomes seq + 1 only after the event recorded
// after wait(seq), so after the device has passed wait(seq). seq is taken, recorded and queued under one
// lock, so the queue order is the stream order. An exception from fn is kept by the stream and rethrown by
// its next synchronize() (and by Device::synchronize()), as on the host backend; the later work still
// runs. Limits: (1) fn must not enqueue work on its own stream and wait for it (it would wait for itself),
// as documented in core/device.h. (2) the stream waits on a host-written word, an order CUDA cannot see:
// if more streams exist than hardware queues (CUDA_DEVICE_MAX_CONNECTIONS, 8 by default), work of another
// stream may be queued behind the waiting one; a fn that waits for such work would wait forever. So the
// cuda device sets CUDA_DEVICE_MAX_CONNECTIONS to 32, the most, before it creates its context, unless the
// environment already sets it (a process whose context exists, a framework's, keeps its own).
// Fallback: when the driver lacks cuStreamWaitValue32 (the entry point is missing, or the call answers
// with an error: CUDA_ERROR_NOT_SUPPORTED, or another where a virtualised driver refuses the operation;
// nothing was enqueued then), the stream instead gets a cudaLaunchHostFunc of a short function that only
// waits (mutex and condition variable, no CUDA call) until the worker has run fn. fn still runs on the
// worker, so it may call CUDA, but the driver's callback thread is held while fn runs, as before.
#include <cuda.h>
#include <cuda_runtime.h>
#include <linux/mempolicy.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/cuda_check.h"
#include "core/device_impl.h"
#include "core/log.h"
#include "core/topology.h"

namespace strata::detail {

// ---- core/cuda_check.h ----------------------------------------------------------------------------------

bool cuda_sync_after_launch() {
  static const bool on = [] {
    const char* v = std::getenv("STRATA_CUDA_SYNC");
    return v != nullptr && std::string_view(v) == "1";
  }();
  return on;
}

void kernel_check(const char* file, int line, cudaStream_t stream) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw_backend(file, line, "kernel launch (cudaGetLastError)", "CUDA", int(e), cudaGetErrorString(e));
  if (!cuda_sync_after_launch()) return;
  const cudaError_t s = cudaStreamSynchronize(stream);
  if (s != cudaSuccess)
    throw_backend(file, line, "cudaStreamSynchronize after the launch (STRATA_CUDA_SYNC=1)", "CUDA", int(s),
                  cudaGetErrorString(s));
}

void kernel_check(const char* file, int line) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw_backend(file, line, "kernel launch (cudaGetLastError)", "CUDA", int(e), cudaGetErrorString(e));
  if (!cuda_sync_after_launch()) return;
  const cudaError_t s = cudaDeviceSynchronize();
  if (s != cudaSuccess)
    throw_backend(file, line, "cudaDeviceSynchronize after the launch (STRATA_CUDA_SYNC=1)", "CUDA", int(s),
                  cudaGetErrorString(s));
}

namespace {

// The driver's context calls behind Note [device guard], through the runtime (no link against libcuda);
// null when the driver does not have them.
struct ContextCalls {
  CUresult (*get_current)(CUcontext*) = nullptr;
  CUresult (*set_current)(CUcontext) = nullptr;
};

template <class F>
F driver_entry_point(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  const cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e == cudaSuccess && found == cudaDriverEntryPointSuccess ? reinterpret_cast<F>(fn) : nullptr;
}

const ContextCalls& context_calls() {
  static const ContextCalls calls = [] {
    ContextCalls c;
    c.get_current = driver_entry_point<decltype(c.get_current)>("cuCtxGetCurrent");
    c.set_current = driver_entry_point<decltype(c.set_current)>("cuCtxSetCurrent");
    if (!c.get_current || !c.set_current) c = {};
    return c;
  }();
  return calls;
}

}  // namespace

// Note [device guard] (core/cuda_check.h). cudaGetDevice reads the thread's current device without
// creating a context.
CudaDeviceGuard::CudaDeviceGuard(int device) {
  enter(device);
}

CudaDeviceGuard::CudaDeviceGuard(cudaStream_t stream) {
  int device = 0;
  STRATA_CUDA_CHECK(cudaStreamGetDevice(stream, &device));
  enter(device);
}

void CudaDeviceGuard::enter(int device) {
  device_ = device;
  int current = -1;
  STRATA_CUDA_CHECK(cudaGetDevice(&current));
  if (current == device_) return;
  const ContextCalls& ctx = context_calls();
  CUcontext previous = nullptr;
  if (ctx.get_current && ctx.get_current(&previous) != CUDA_SUCCESS) previous = nullptr;
  STRATA_CUDA_CHECK(cudaSetDevice(device_));
  restore_ = previous;  // null (a fresh thread): keep the device
}

CudaDeviceGuard::~CudaDeviceGuard() {
  if (restore_) (void)context_calls().set_current(static_cast<CUcontext>(restore_));  // cannot throw here
}

void make_device_current_noexcept(int device) noexcept {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current == device) return;
  if (cudaSetDevice(device) != cudaSuccess) (void)cudaGetLastError();
}

namespace {

// ---- events ---------------------------------------------------------------------------------------------

// Host waits on our events block the thread instead of spinning (cudaEventBlockingSync); no timing.
constexpr unsigned kEventFlags = cudaEventBlockingSync | cudaEventDisableTiming;

// A query that answers cudaErrorNotReady also leaves it in the thread's last-error slot, where the next
// STRATA_KERNEL_CHECK (cudaGetLastError) would report it as a launch failure: clear it.
void clear_not_ready() {
  if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
}

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(int dev) : dev_(dev) {
    CudaDeviceGuard guard(dev_);
    STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&ev_, kEventFlags));
  }
  ~CudaEvent() override {
    make_device_current_noexcept(dev_);
    (void)cudaEventDestroy(ev_);
  }
  bool query() const override {
    CudaDeviceGuard guard(dev_);
    const cudaError_t e = cudaEventQuery(ev_);
    if (e == cudaErrorNotReady) {
      clear_not_ready();
      return false;
    }
    STRATA_CUDA_CHECK(e);
    return true;
  }
  void synchronize() const override {
    CudaDeviceGuard guard(dev_);
    STRATA_CUDA_CHECK(cudaEventSynchronize(ev_));
  }
  cudaEvent_t get() const { return ev_; }

 private:
  int dev_;
  cudaEvent_t ev_ = nullptr;
};

cudaMemcpyKind to_cuda(CopyKind k) {
  switch (k) {
    case CopyKind::host_to_device:
      return cudaMemcpyHostToDevice;
    case CopyKind::device_to_host:
      return cudaMemcpyDeviceToHost;
    case CopyKind::device_to_device:
      return cudaMemcpyDeviceToDevice;
    case CopyKind::host_to_host:
      return cudaMemcpyHostToHost;
  }
  return cudaMemcpyDefault;
}

// ---- host functions (Note [cuda host functions]) ----------------------------------------------------------

using WaitValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

// cuStreamWaitValue32 from the driver, through the runtime (no link against libcuda); null if missing.
WaitValue32Fn find_wait_value32() {
  return driver_entry_point<WaitValue32Fn>("cuStreamWaitValue32");
}

class CudaStream;

// What a device's streams share: how host functions hold a stream, and the live streams (for
// Device::synchronize). Locking: `m` guards `live`; the atomic needs no lock.
struct StreamShared {
  int device = 0;
  WaitValue32Fn wait_value32 = nullptr;      // null: use the cudaLaunchHostFunc fallback
  std::atomic<bool> mem_ops_refused{false};  // the driver answered CUDA_ERROR_NOT_SUPPORTED once
  std::mutex m;
  std::unordered_map<CudaStream*, bool> live;
};

// Runs on the driver's callback thread in the fallback: waits for the worker, calls no CUDA API.
void CUDART_CB wait_for_worker(void* p) {
  std::unique_ptr<std::shared_ptr<Completion>> done(static_cast<std::shared_ptr<Completion>*>(p));
  (*done)->wait();
}

// Locking contract: public methods may be called from any thread. m_ guards the job queue, the event
// free list, stop_ and error_; enqueue_m_ makes "take seq, record, wait, queue" one step so the queue
// order is the stream order. enqueue_m_ is taken before m_, never the reverse.
class CudaStream final : public Stream {
 public:
  CudaStream(const std::string& name, std::shared_ptr<StreamShared> shared)
      : Stream(name), shared_(std::move(shared)) {
    CudaDeviceGuard guard(shared_->device);
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
    const cudaError_t e =
        cudaHostAlloc(&flag_, sizeof(std::uint32_t), cudaHostAllocMapped | cudaHostAllocPortable);
    if (e != cudaSuccess) {
      (void)cudaStreamDestroy(s_);
      STRATA_CUDA_CHECK(e);
    }
    *flag_ = 0;
    void* dflag = nullptr;
    STRATA_CUDA_CHECK(cudaHostGetDevicePointer(&dflag, flag_, 0));
    dflag_ = reinterpret_cast<CUdeviceptr>(dflag);
    worker_ = std::thread([this] { run(); });
    std::lock_guard<std::mutex> lk(shared_->m);
    shared_->live[this] = true;
  }
  ~CudaStream() override {
    {
      std::lock_guard<std::mutex> lk(shared_->m);
      shared_->live.erase(this);
    }
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();  // runs the queued host functions first, which releases the stream's waits
    make_device_current_noexcept(shared_->device);
    (void)cudaStreamSynchronize(s_);
    (void)cudaStreamDestroy(s_);
    for (cudaEvent_t e : free_events_) (void)cudaEventDestroy(e);
    (void)cudaFreeHost(flag_);
  }
  void copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind) override {
    if (bytes == 0) return;
    CudaDeviceGuard guard(shared_->device);
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, to_cuda(kind), s_));
  }
  void memset_async(void* dst, int value, std::size_t bytes) override {
    if (bytes == 0) return;
    CudaDeviceGuard guard(shared_->device);
    STRATA_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, s_));
  }
  void host_fn(std::function<void()> fn) override {
    CudaDeviceGuard guard(shared_->device);
    std::lock_guard<std::mutex> order(enqueue_m_);
    Job job{take_event(), std::move(fn), ++next_seq_, nullptr};
    STRATA_CUDA_CHECK(cudaEventRecord(job.ready, s_));
    if (!hold_with_mem_op(job.seq)) {
      job.done = std::make_shared<Completion>();
      auto* arg = new std::shared_ptr<Completion>(job.done);
      const cudaError_t e = cudaLaunchHostFunc(s_, &wait_for_worker, arg);
      if (e != cudaSuccess) {
        delete arg;
        STRATA_CUDA_CHECK(e);
      }
    }
    {
      std::lock_guard<std::mutex> lk(m_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }
  void record(Event& e) override {
    CudaDeviceGuard guard(shared_->device);
    STRATA_CUDA_CHECK(cudaEventRecord(dynamic_cast<CudaEvent&>(e).get(), s_));
  }
  void wait(const Event& e) override {
    CudaDeviceGuard guard(shared_->device);
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(s_, dynamic_cast<const CudaEvent&>(e).get(), 0));
  }
  void synchronize() override {
    CudaDeviceGuard guard(shared_->device);
    STRATA_CUDA_CHECK(cudaStreamSynchronize(s_));
    std::exception_ptr err;
    {
      std::lock_guard<std::mutex> lk(m_);
      std::swap(err, error_);
    }
    if (err) std::rethrow_exception(err);
  }
  void* native_handle() override { return s_; }

 private:
  struct Job {
    cudaEvent_t ready = nullptr;  // recorded after the work before fn
    std::function<void()> fn;
    std::uint32_t seq = 0;             // written to *flag_ once fn has run
    std::shared_ptr<Completion> done;  // fallback only: what the stream's host function waits for
  };

  // Enqueues "wait until *flag == seq" on the stream; false when the driver cannot (use the fallback).
  bool hold_with_mem_op(std::uint32_t seq) {
    if (shared_->wait_value32 == nullptr || shared_->mem_ops_refused.load()) return false;
    const CUresult r =
        shared_->wait_value32(reinterpret_cast<CUstream>(s_), dflag_, seq, CU_STREAM_WAIT_VALUE_EQ);
    if (r == CUDA_SUCCESS) return true;
    // Refused (nothing was enqueued): the fallback, for this and every later host_fn of the device. A real
    // failure of the context shows again at the next CUDA call.
    STRATA_WARN_ONCE(
        "cuda: the driver refused a stream memory operation (cuStreamWaitValue32: CUresult ", int(r),
        r == CUDA_ERROR_NOT_SUPPORTED ? ", not supported" : "",
        "); Stream::host_fn falls back to a host callback that holds the driver's callback thread "
        "while the function runs");
    shared_->mem_ops_refused.store(true);
    return false;
  }

  cudaEvent_t take_event() {
    {
      std::lock_guard<std::mutex> lk(m_);
      if (!free_events_.empty()) {
        cudaEvent_t e = free_events_.back();
        free_events_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&e, kEventFlags));
    return e;
  }

  void keep_error(std::exception_ptr e) {
    std::lock_guard<std::mutex> lk(m_);
    if (!error_) error_ = std::move(e);
  }

  // The worker: runs each host function once the work recorded before it is done, then releases the
  // stream. A failure to make the device current or to wait is kept like an exception from fn.
  void run() {
    try {
      STRATA_CUDA_CHECK(cudaSetDevice(shared_->device));
    } catch (...) {
      keep_error(std::current_exception());
    }
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stop_ and drained
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      try {
        STRATA_CUDA_CHECK(cudaEventSynchronize(job.ready));
        job.fn();
      } catch (...) {
        keep_error(std::current_exception());
      }
      {
        std::lock_guard<std::mutex> lk(m_);
        free_events_.push_back(job.ready);
      }
      if (job.done) {
        job.done->set();
      } else {
        std::atomic_ref<std::uint32_t>(*flag_).store(job.seq, std::memory_order_release);
      }
    }
  }

  std::shared_ptr<StreamShared> shared_;
  cudaStream_t s_ = nullptr;
  std::uint32_t* flag_ = nullptr;  // pinned, mapped host word the stream's waits read (1)
  CUdeviceptr dflag_ = 0;          // its device address
  std::mutex enqueue_m_;
  std::uint32_t next_seq_ = 0;  // guarded by enqueue_m_
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  std::vector<cudaEvent_t> free_events_;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread worker_;  // started last in the constructor, after the members it uses exist
};

// ---- NUMA placement of pinned memory (Note [pinned memory placement]) -------------------------------------

class PreferNumaNode {
 public:
  explicit PreferNumaNode(int node) {
    if (node < 0 || static_cast<unsigned long>(node) >= kMaxNodes - 1) return;
    if (::syscall(SYS_get_mempolicy, &old_mode_, old_mask_, kMaxNodes, nullptr, 0UL) != 0) return;  // unknown
    unsigned long mask[kWords] = {};
    mask[node / kBits] = 1UL << (node % kBits);
    if (::syscall(SYS_set_mempolicy, int(MPOL_PREFERRED), mask, kMaxNodes) != 0) {
      STRATA_WARN_ONCE("pinned host memory: cannot prefer NUMA node ", node,
                       " (set_mempolicy: ", errno_text(errno),
                       "); pinned buffers are placed by the default policy");
      return;
    }
    active_ = true;
  }
  ~PreferNumaNode() {
    if (active_) (void)::syscall(SYS_set_mempolicy, old_mode_, old_mask_, kMaxNodes);
  }
  PreferNumaNode(const PreferNumaNode&) = delete;
  PreferNumaNode& operator=(const PreferNumaNode&) = delete;

 private:
  static constexpr unsigned long kBits = 8 * sizeof(unsigned long);
  static constexpr unsigned long kMaxNodes = 1024;
  static constexpr unsigned long kWords = kMaxNodes / kBits;
  bool active_ = false;
  int old_mode_ = 0;
  unsigned long old_mask_[kWords] = {};
};

// ---- the device -----------------------------------------------------------------------------------------

constexpr std::size_t kMinHeadroom = std::size_t(256) << 20;

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(const DeviceOptions& opts) {
    dev_ = opts.ordinal;
    std::string why;
    const int count = cuda_count(&why);
    if (dev_ < 0 || dev_ >= count)
      throw Error(cat("cuda device ordinal ", dev_, " is not visible: ", count, " CUDA device(s) visible",
                      count == 0 ? cat(" (", why, ")") : std::string(),
                      "; choose an ordinal below the count (CUDA_VISIBLE_DEVICES renumbers them)"));
    bind_thread();  // open_device binds its caller (Note [thread device] in core/device.h)
    STRATA_CUDA_CHECK(cudaFree(nullptr));  // create the context now, so the free memory below excludes it
    cudaDeviceProp p{};
    STRATA_CUDA_CHECK(cudaGetDeviceProperties(&p, dev_));
    caps_.backend = BackendKind::cuda;
    caps_.name = p.name;
    caps_.ordinal = dev_;
    caps_.physical_bytes = p.totalGlobalMem;
    caps_.cc_major = p.major;
    caps_.cc_minor = p.minor;
    caps_.multiprocessors = p.multiProcessorCount;
    caps_.numa_node = Topology::get().gpu_numa_node(dev_);
    caps_.host_addressable = false;
    memory_cap_ = opts.memory_cap;

    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev_;
    STRATA_CUDA_CHECK(cudaMemPoolCreate(&pool_, &props));
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&alloc_stream_, cudaStreamNonBlocking));
    measure();
    shared_->device = dev_;
    shared_->wait_value32 = find_wait_value32();
  }
  ~CudaDevice() override {
    make_device_current_noexcept(dev_);
    for (auto& [p, n] : pinned_) (void)cudaFreeHost(p);
    for (auto& [p, n] : live_) (void)cudaFreeAsync(p, alloc_stream_);
    (void)cudaStreamSynchronize(alloc_stream_);
    (void)cudaStreamDestroy(alloc_stream_);
    (void)cudaMemPoolDestroy(pool_);
  }
  const DeviceCaps& caps() const override { return caps_; }
  void bind_thread() const override { STRATA_CUDA_CHECK(cudaSetDevice(dev_)); }
  void measure_capacity() override {
    bind_thread();
    measure();
  }
  void limit_capacity(std::size_t bytes) override {
    bind_thread();
    std::lock_guard<std::mutex> lk(m_);
    memory_cap_ = memory_cap_ ? std::min(memory_cap_, bytes) : bytes;
    caps_.capacity = std::min(caps_.capacity, bytes);  // not measured again: the ranks agreed this figure
    std::uint64_t keep = caps_.capacity;
    STRATA_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep));
  }

  void* allocate(std::size_t bytes, const char* what) override {
    if (bytes == 0) bytes = 1;
    {
      std::lock_guard<std::mutex> lk(m_);
      if (bytes > caps_.capacity - std::min(caps_.capacity, stats_.in_use))
        throw OutOfMemory(device_oom_message(caps_, stats_.in_use, bytes, what, capacity_detail()));
      stats_.in_use += bytes;  // reserve before allocating outside the lock
    }
    CudaDeviceGuard guard(dev_);
    void* p = nullptr;
    cudaError_t e = cudaMallocFromPoolAsync(&p, bytes, pool_, alloc_stream_);
    if (e == cudaErrorMemoryAllocation) {  // give the pool's unused memory back and try once more
      (void)cudaGetLastError();
      STRATA_CUDA_CHECK(cudaStreamSynchronize(alloc_stream_));
      STRATA_CUDA_CHECK(cudaMemPoolTrimTo(pool_, 0));
      e = cudaMallocFromPoolAsync(&p, bytes, pool_, alloc_stream_);
    }
    if (e == cudaSuccess) e = cudaStreamSynchronize(alloc_stream_);  // usable on every stream
    std::lock_guard<std::mutex> lk(m_);
    if (e != cudaSuccess) {
      stats_.in_use -= bytes;
      (void)cudaGetLastError();
      std::size_t free_b = 0, total_b = 0;
      if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
      throw OutOfMemory(
          device_oom_message(caps_, stats_.in_use, bytes, what,
                             cat("cudaMallocFromPoolAsync: ", cudaGetErrorString(e), "; the driver reports ",
                                 format_bytes(free_b), " free of ", format_bytes(total_b),
                                 " (other processes or libraries may hold the rest)")));
    }
    live_[p] = bytes;
    stats_.allocations = live_.size();
    stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
    return p;
  }
  void deallocate(void* p) override {
    if (!p) return;
    {
      std::lock_guard<std::mutex> lk(m_);
      auto it = live_.find(p);
      STRATA_CHECK(it != live_.end(), "deallocate of a pointer this device did not allocate");
      stats_.in_use -= it->second;
      live_.erase(it);
      stats_.allocations = live_.size();
    }
    CudaDeviceGuard guard(dev_);
    STRATA_CUDA_CHECK(cudaFreeAsync(p, alloc_stream_));  // Note [cuda device allocator]: no device sync
  }
  DeviceMemoryStats memory_stats() const override {
    std::lock_guard<std::mutex> lk(m_);
    return stats_;
  }
  void* allocate_pinned(std::size_t bytes) override {
    if (bytes == 0) bytes = 1;
    void* p = nullptr;
    CudaDeviceGuard guard(dev_);
    cudaError_t e;
    {
      PreferNumaNode near_gpu(caps_.numa_node);
      e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    }
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      throw OutOfMemory(cat("cannot allocate ", format_bytes(bytes),
                            " of pinned host memory (cudaHostAlloc: ", cudaGetErrorString(e),
                            "); lower offload buffer sizes (offload_param.buffer_size / buffer_count, "
                            "offload_optimizer.buffer_count) or the model's host-resident state"));
    }
    std::lock_guard<std::mutex> lk(m_);
    pinned_[p] = bytes;
    stats_.pinned_in_use += bytes;
    return p;
  }
  void deallocate_pinned(void* p) override {
    if (!p) return;
    {
      std::lock_guard<std::mutex> lk(m_);
      auto it = pinned_.find(p);
      STRATA_CHECK(it != pinned_.end(), "deallocate_pinned of a pointer this device did not allocate");
      stats_.pinned_in_use -= it->second;
      pinned_.erase(it);
    }
    CudaDeviceGuard guard(dev_);  // any thread frees: it must not make a context on device 0
    STRATA_CUDA_CHECK(cudaFreeHost(p));
  }
  std::unique_ptr<Stream> create_stream(const std::string& name) override {
    return std::make_unique<CudaStream>(name, shared_);
  }
  std::unique_ptr<Event> create_event() override { return std::make_unique<CudaEvent>(dev_); }
  // Every stream of this device (host-function errors surface here too, as on the host backend), then the
  // whole device (work queued on streams the runtime did not create).
  void synchronize() override {
    {
      std::lock_guard<std::mutex> lk(shared_->m);  // keeps every listed stream alive while it drains
      for (auto& [s, _] : shared_->live) s->synchronize();
    }
    CudaDeviceGuard guard(dev_);
    STRATA_CUDA_CHECK(cudaDeviceSynchronize());
  }

 private:
  std::string capacity_detail() const {
    return cat("the cuda capacity is the memory free once the CUDA libraries exist less ",
               format_bytes(caps_.reserved),
               " headroom for what they allocate later, clamped by the configured cap (Note [cuda device "
               "capacity] in core/cuda_device.cpp)");
  }

  // Note [cuda device capacity]: capacity from the driver's free memory and our pool's holding; the pool
  // keeps up to the capacity (its release threshold).
  void measure() {
    std::size_t free_b = 0, total_b = 0;
    STRATA_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    std::uint64_t pool_held = 0;  // reserved by our pool: ours, whether in use or kept for reuse
    STRATA_CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &pool_held));
    const std::size_t headroom = std::max(kMinHeadroom, total_b / 50);
    const std::size_t ours = free_b + std::size_t(pool_held);
    const std::size_t usable = ours > headroom ? ours - headroom : 0;
    std::lock_guard<std::mutex> lk(m_);
    caps_.capacity = memory_cap_ ? std::min(memory_cap_, usable) : usable;
    caps_.reserved = headroom;
    if (memory_cap_ > usable && !warned_cap_) {
      warned_cap_ = true;
      STRATA_LOG_WARN("cuda device ", dev_, ": the configured memory cap ", format_bytes(memory_cap_),
                      " exceeds what is usable (", format_bytes(free_b), " free and ",
                      format_bytes(std::size_t(pool_held)), " held, less ", format_bytes(headroom),
                      " headroom); using ", format_bytes(usable));
    }
    std::uint64_t keep = caps_.capacity;
    STRATA_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep));
  }

  int dev_ = 0;
  DeviceCaps caps_;
  std::size_t memory_cap_ = 0;  // DeviceOptions.memory_cap
  bool warned_cap_ = false;
  cudaMemPool_t pool_ = nullptr;
  cudaStream_t alloc_stream_ = nullptr;  // carries only this device's pool allocations and frees
  std::shared_ptr<StreamShared> shared_ = std::make_shared<StreamShared>();
  mutable std::mutex m_;
  DeviceMemoryStats stats_;
  std::unordered_map<void*, std::size_t> live_;
  std::unordered_map<void*, std::size_t> pinned_;
};

}  // namespace

std::unique_ptr<Device> make_cuda_device(const DeviceOptions& opts) {
  // Note [cuda host functions], limit (2): as many hardware queues as the driver gives, read when the
  // context is created; a value the environment sets is kept.
  if (std::getenv("CUDA_DEVICE_MAX_CONNECTIONS") == nullptr) {
    ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);
    STRATA_LOG_INFO(
        "cuda: CUDA_DEVICE_MAX_CONNECTIONS=32 (unset in the environment): streams held by host "
        "functions share their hardware queue with fewer others (Note [cuda host functions])");
  }
  return std::make_unique<CudaDevice>(opts);
}

int cuda_count(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (why) *why = cat("cudaGetDeviceCount: ", cudaGetErrorString(e));
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount: 0 devices";
  return n;
}

}  // namespace strata::detail
