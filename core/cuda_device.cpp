// The cuda backend: a real GPU through the CUDA runtime. Compiled only when STRATA_WITH_CUDA.
//
// Note [cuda device cap]: a configured strata.device_memory_cap makes a large GPU act as a small one: the
// backend counts its own allocations against the cap and refuses past it with the same OutOfMemory as
// the host backend, before cudaMalloc is asked.
#include <cuda_runtime.h>

#include <mutex>
#include <unordered_map>

#include "core/cuda_check.h"
#include "core/device_impl.h"
#include "core/log.h"
#include "core/topology.h"

namespace strata::detail {
namespace {

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(int dev) : dev_(dev) {
    STRATA_CUDA_CHECK(cudaSetDevice(dev_));
    STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&ev_, cudaEventDisableTiming));
  }
  ~CudaEvent() override { cudaEventDestroy(ev_); }
  bool query() const override {
    cudaError_t e = cudaEventQuery(ev_);
    if (e == cudaErrorNotReady) return false;
    STRATA_CUDA_CHECK(e);
    return true;
  }
  void synchronize() const override { STRATA_CUDA_CHECK(cudaEventSynchronize(ev_)); }
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

class CudaStream final : public Stream {
 public:
  CudaStream(const std::string& name, int dev) : Stream(name), dev_(dev) {
    STRATA_CUDA_CHECK(cudaSetDevice(dev_));
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
  }
  ~CudaStream() override {
    cudaStreamSynchronize(s_);
    cudaStreamDestroy(s_);
  }
  void copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind) override {
    if (bytes == 0) return;
    STRATA_CUDA_CHECK(cudaSetDevice(dev_));
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, to_cuda(kind), s_));
  }
  void memset_async(void* dst, int value, std::size_t bytes) override {
    if (bytes == 0) return;
    STRATA_CUDA_CHECK(cudaSetDevice(dev_));
    STRATA_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, s_));
  }
  void host_fn(std::function<void()> fn) override {
    auto* heap = new Job{std::move(fn), this};
    STRATA_CUDA_CHECK(cudaLaunchHostFunc(s_, &CudaStream::trampoline, heap));
  }
  void record(Event& e) override {
    STRATA_CUDA_CHECK(cudaSetDevice(dev_));
    STRATA_CUDA_CHECK(cudaEventRecord(dynamic_cast<CudaEvent&>(e).get(), s_));
  }
  void wait(const Event& e) override {
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(s_, dynamic_cast<const CudaEvent&>(e).get(), 0));
  }
  void synchronize() override {
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
    std::function<void()> fn;
    CudaStream* self;
  };
  static void CUDART_CB trampoline(void* p) {
    std::unique_ptr<Job> job(static_cast<Job*>(p));
    try {
      job->fn();
    } catch (...) {
      std::lock_guard<std::mutex> lk(job->self->m_);
      if (!job->self->error_) job->self->error_ = std::current_exception();
    }
  }
  int dev_;
  cudaStream_t s_ = nullptr;
  std::mutex m_;
  std::exception_ptr error_;
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(const DeviceOptions& opts) {
    dev_ = opts.ordinal;
    STRATA_CUDA_CHECK(cudaSetDevice(dev_));
    cudaDeviceProp p{};
    STRATA_CUDA_CHECK(cudaGetDeviceProperties(&p, dev_));
    caps_.backend = BackendKind::cuda;
    caps_.name = p.name;
    caps_.ordinal = dev_;
    caps_.physical_bytes = p.totalGlobalMem;
    caps_.capacity =
        opts.memory_cap ? std::min<std::size_t>(opts.memory_cap, p.totalGlobalMem) : p.totalGlobalMem;
    caps_.cc_major = p.major;
    caps_.cc_minor = p.minor;
    caps_.multiprocessors = p.multiProcessorCount;
    caps_.numa_node = Topology::get().gpu_numa_node(dev_);
    caps_.host_addressable = false;
  }
  ~CudaDevice() override {
    cudaSetDevice(dev_);
    for (auto& [p, n] : pinned_) cudaFreeHost(p);
    for (auto& [p, n] : live_) cudaFree(p);
  }
  const DeviceCaps& caps() const override { return caps_; }

  void* allocate(std::size_t bytes, const char* what) override {
    if (bytes == 0) bytes = 1;
    {
      std::lock_guard<std::mutex> lk(m_);
      if (bytes > caps_.capacity - std::min(caps_.capacity, stats_.in_use))
        throw OutOfMemory(device_oom_message(caps_, stats_.in_use, bytes, what, ""));
      stats_.in_use += bytes;
    }
    void* p = nullptr;
    STRATA_CUDA_CHECK(cudaSetDevice(dev_));
    cudaError_t e = cudaMalloc(&p, bytes);
    std::lock_guard<std::mutex> lk(m_);
    if (e != cudaSuccess) {
      stats_.in_use -= bytes;
      cudaGetLastError();  // clear the sticky-free error state of a failed malloc
      std::size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw OutOfMemory(device_oom_message(
          caps_, stats_.in_use, bytes, what,
          cat("cudaMalloc: ", cudaGetErrorString(e), "; the driver reports ", format_bytes(free_b),
              " free of ", format_bytes(total_b), " (other processes or CUDA contexts may hold the rest)")));
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
    STRATA_CUDA_CHECK(cudaSetDevice(dev_));
    STRATA_CUDA_CHECK(cudaFree(p));
  }
  DeviceMemoryStats memory_stats() const override {
    std::lock_guard<std::mutex> lk(m_);
    return stats_;
  }
  void* allocate_pinned(std::size_t bytes) override {
    if (bytes == 0) bytes = 1;
    void* p = nullptr;
    STRATA_CUDA_CHECK(cudaSetDevice(dev_));
    cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) {
      cudaGetLastError();
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
    STRATA_CUDA_CHECK(cudaFreeHost(p));
  }
  std::unique_ptr<Stream> create_stream(const std::string& name) override {
    return std::make_unique<CudaStream>(name, dev_);
  }
  std::unique_ptr<Event> create_event() override { return std::make_unique<CudaEvent>(dev_); }
  void synchronize() override {
    STRATA_CUDA_CHECK(cudaSetDevice(dev_));
    STRATA_CUDA_CHECK(cudaDeviceSynchronize());
  }

 private:
  int dev_ = 0;
  DeviceCaps caps_;
  mutable std::mutex m_;
  DeviceMemoryStats stats_;
  std::unordered_map<void*, std::size_t> live_;
  std::unordered_map<void*, std::size_t> pinned_;
};

}  // namespace

std::unique_ptr<Device> make_cuda_device(const DeviceOptions& opts) {
  return std::make_unique<CudaDevice>(opts);
}

int cuda_count(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = cat("cudaGetDeviceCount: ", cudaGetErrorString(e));
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount: 0 devices";
  return n;
}

}  // namespace strata::detail
