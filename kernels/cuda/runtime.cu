// The runtime's element-wise kernels: fill and the fp32 gradient add (dst += src). Grid-stride loops; each
// element is one correctly rounded fp32 add, so the result equals the CPU's bit for bit.
#include <cuda_runtime.h>

#include <cstddef>

#include "core/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace strata::kernels::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks(std::size_t n) {
  const std::size_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 65535 * 32 ? b : 65535 * 32);
}

__global__ void fill_kernel(float* x, float value, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    x[i] = value;
}

__global__ void add_kernel(float* dst, const float* src, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    dst[i] = __fadd_rn(dst[i], src[i]);
}

}  // namespace

void fill_f32(float* x, float value, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  strata::detail::CudaDeviceGuard guard(stream);
  fill_kernel<<<blocks(n), kThreads, 0, stream>>>(x, value, n);
  STRATA_KERNEL_CHECK(stream);
}

void add_f32(float* dst, const float* src, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  strata::detail::CudaDeviceGuard guard(stream);
  add_kernel<<<blocks(n), kThreads, 0, stream>>>(dst, src, n);
  STRATA_KERNEL_CHECK(stream);
}

}  // namespace strata::kernels::cuda
