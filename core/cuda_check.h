// strata/core/cuda_check.h: check macros for CUDA runtime, NCCL and kernel launches.
//
// Example:
//   STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream));
//   my_kernel<<<grid, block, 0, stream>>>(...);
//   STRATA_KERNEL_CHECK();                       // cudaGetLastError after every launch
//   STRATA_NCCL_CHECK(ncclAllReduce(...));
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

namespace strata::detail {
[[noreturn]] void throw_backend(const char* file, int line, const char* stmt, const char* api, int code,
                                const char* text);
}  // namespace strata::detail

#define STRATA_CUDA_CHECK(stmt)                                                          \
  do {                                                                                   \
    cudaError_t strata_e_ = (stmt);                                                      \
    if (strata_e_ != cudaSuccess)                                                        \
      ::strata::detail::throw_backend(__FILE__, __LINE__, #stmt, "CUDA", int(strata_e_), \
                                      cudaGetErrorString(strata_e_));                    \
  } while (0)

#define STRATA_KERNEL_CHECK() STRATA_CUDA_CHECK(cudaGetLastError())

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
