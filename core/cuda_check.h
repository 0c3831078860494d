// strata/core/cuda_check.h: check macros for CUDA runtime, NCCL and kernel launches, and the device guard
// every CUDA entry point uses.
//
// Example:
//   strata::detail::CudaDeviceGuard guard(stream);  // the stream's device is current in this scope
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

// Makes a CUDA device the calling thread's current device for the scope, so an entry point runs its
// allocations, launches and library calls on the stream's device whatever thread calls it. At scope exit
// it gives the thread back the context it had current before, and only that: a thread that had none (a
// fresh thread) keeps the device (Note [device guard]). Throws BackendError when a CUDA call fails; the
// restore at exit cannot throw and is best effort.
//
// Note [device guard]: the guard used to restore the thread's previous *device* at scope exit. On a thread
// that never chose a device the previous device is 0, and since CUDA 12 cudaSetDevice creates that
// device's primary context: every rank, through any entry point called from a fresh thread, made a context
// on GPU 0 and held its memory there. Now the guard asks the driver which context the thread has current
// (cuCtxGetCurrent) and restores that context (cuCtxSetCurrent), which exists already: nothing is created
// on another GPU. A thread with no context current keeps the guard's device, the rank's device (a rank
// uses one device: core/device.h, Note [thread device]), which is where its later CUDA calls belong. A
// thread that had chosen a device itself (a test driving two GPUs, a framework's thread) gets it back.
// Where the driver's entry points cannot be found, the guard only sets, never restores.
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
  int device_ = -1;
  void* restore_ = nullptr;  // CUcontext to make current again at exit; null: none (keep the device)
};

// Makes `device` current (no restore), for destructors: never throws (a failure is cleared from the
// thread's last-error slot and ignored).
void make_device_current_noexcept(int device) noexcept;

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
