// strata/core/cuda_check.h: check macros for CUDA runtime, NCCL and kernel launches, and the device guard
// every CUDA entry point uses.
//
// Example:
//   strata::detail::CudaDeviceGuard guard(stream);  // the stream's device is current until scope exit
//   STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream));
//   my_kernel<<<grid, block, 0, stream>>>(...);
//   STRATA_KERNEL_CHECK(stream);                  // cudaGetLastError after every launch
//   STRATA_NCCL_CHECK(ncclAllReduce(...));
//
// Note [STRATA_CUDA_SYNC]: a kernel fault (an illegal address, say) is reported by whichever CUDA call
// happens to run next, often far from the launch that caused it. With the environment variable
// STRATA_CUDA_SYNC=1 (read once, at the first check) STRATA_KERNEL_CHECK(stream) also synchronises that
// stream, so the fault is reported at the launch that caused it, with its file and line. It is a
// debugging mode: it serialises the host with every launch. STRATA_KERNEL_CHECK() without a stream
// synchronises the whole device instead; kernels/cuda always passes the stream, because a device-wide
// synchronisation made inside a Stream::host_fn would wait for the stream that waits for that function.
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

namespace strata::detail {
[[noreturn]] void throw_backend(const char* file, int line, const char* stmt, const char* api, int code,
                                const char* text);

// True when STRATA_CUDA_SYNC=1 was set when the process first asked (Note [STRATA_CUDA_SYNC]).
bool cuda_sync_after_launch();

// After a kernel launch: the launch error, then (STRATA_CUDA_SYNC=1) the stream's or device's completion.
void kernel_check(const char* file, int line, cudaStream_t stream);
void kernel_check(const char* file, int line);

// Makes a CUDA device current for the scope and restores the previous one at exit, so an entry point runs
// its allocations, launches and library calls on the stream's device whatever device the calling thread
// had current (a thread's current device is per thread; a stream belongs to one device). Throws
// BackendError when a CUDA call fails; the restore at exit cannot throw and is best effort.
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device);
  explicit CudaDeviceGuard(cudaStream_t stream);  // the device the stream was created on
  ~CudaDeviceGuard();
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;
  int device() const { return device_; }

 private:
  void enter(int device);
  int previous_ = -1;
  int device_ = -1;
};

}  // namespace strata::detail

#define STRATA_CUDA_CHECK(stmt)                                                          \
  do {                                                                                   \
    cudaError_t strata_e_ = (stmt);                                                      \
    if (strata_e_ != cudaSuccess)                                                        \
      ::strata::detail::throw_backend(__FILE__, __LINE__, #stmt, "CUDA", int(strata_e_), \
                                      cudaGetErrorString(strata_e_));                    \
  } while (0)

// STRATA_KERNEL_CHECK(stream) after a launch on stream; STRATA_KERNEL_CHECK() when there is none.
#define STRATA_KERNEL_CHECK(...) ::strata::detail::kernel_check(__FILE__, __LINE__ __VA_OPT__(, ) __VA_ARGS__)

#if __has_include(<nccl.h>)
#include <nccl.h>
#define STRATA_NCCL_CHECK(stmt)                                                          \
  do {                                                                                   \
    ncclResult_t strata_r_ = (stmt);                                                     \
    if (strata_r_ != ncclSuccess)                                                        \
      ::strata::detail::throw_backend(__FILE__, __LINE__, #stmt, "NCCL", int(strata_r_), \
                                      ncclGetErrorString(strata_r_));                    \
  } while (0)
#endif
