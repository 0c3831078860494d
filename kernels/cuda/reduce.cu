// strata/kernels/cuda/reduce.cu: scaling, the non-finite check and the squared L2 norm.
#include <type_traits>

#include "kernels/cuda/common_impl.cuh"

namespace strata::kernels::cuda {
namespace {

constexpr std::size_t kNormBlock = 4096;  // elements per partial sum, as on the CPU

// 8 elements per thread (Note [vectorised element-wise kernels] in common_impl.cuh): fp32 in place; bf16
// widened, multiplied in fp32 and rounded to nearest even, one rounding per element.
template <typename T>
__global__ void scale_kernel(T* x, float s, std::size_t n, bool vec) {
  const std::size_t i = impl::group_start();
  if (i >= n) return;
  impl::Pack8<T> v = impl::load8(x, i, n, vec);
#pragma unroll
  for (int k = 0; k < impl::kVec; ++k) {
    if constexpr (std::is_same_v<T, float>)
      v.v[k] *= s;
    else
      v.v[k] = impl::to_bf16(__bfloat162float(v.v[k]) * s);
  }
  impl::store8(x, i, n, vec, v);
}

template <typename T>
void launch_scale(T* x, float s, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  detail::CudaDeviceGuard guard(stream);
  scale_kernel<<<impl::vec_blocks_for(n), impl::kThreads, 0, stream>>>(x, s, n, impl::aligned16(x));
  STRATA_KERNEL_CHECK(stream);
}

__global__ void nonfinite_kernel(int* found, const float* x, std::size_t n) {
  const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n && (__float_as_uint(x[i]) & 0x7F800000u) == 0x7F800000u) *found = 1;  // every writer writes 1
}

// Block b sums elements [b * kNormBlock, (b + 1) * kNormBlock) in double, in a fixed order.
__global__ void norm_partial_kernel(double* partial, const float* x, std::size_t n) {
  __shared__ double shared[impl::kThreads];
  const std::size_t i0 = std::size_t(blockIdx.x) * kNormBlock, i1 = min(n, i0 + kNormBlock);
  double s = 0.0;
  for (std::size_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) s += double(x[i]) * double(x[i]);
  s = impl::block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void norm_total_kernel(double* out, const double* partial, std::size_t blocks) {
  __shared__ double shared[impl::kThreads];
  double s = 0.0;
  for (std::size_t b = threadIdx.x; b < blocks; b += blockDim.x) s += partial[b];
  s = impl::block_sum(s, shared);
  if (threadIdx.x == 0) *out = s;
}

std::size_t norm_blocks(std::size_t n) {
  return (n + kNormBlock - 1) / kNormBlock;
}

}  // namespace

void scale(float* x, float s, std::size_t n, cudaStream_t stream) {
  launch_scale(x, s, n, stream);
}

void scale(bf16* x, float s, std::size_t n, cudaStream_t stream) {
  launch_scale(x, s, n, stream);
}

void nonfinite_check(int* found, const float* x, std::size_t n, cudaStream_t stream) {
  detail::CudaDeviceGuard guard(stream);
  STRATA_CUDA_CHECK(cudaMemsetAsync(found, 0, sizeof(int), stream));
  if (n == 0) return;
  nonfinite_kernel<<<impl::blocks_for(n), impl::kThreads, 0, stream>>>(found, x, n);
  STRATA_KERNEL_CHECK(stream);
}

std::size_t squared_norm_scratch_bytes(std::size_t n) {
  return norm_blocks(n) * sizeof(double);
}

void squared_norm(double* out, const float* x, std::size_t n, void* scratch, std::size_t scratch_bytes,
                  cudaStream_t stream) {
  detail::CudaDeviceGuard guard(stream);
  if (n == 0) {
    STRATA_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), stream));
    return;
  }
  STRATA_CHECK(scratch != nullptr && scratch_bytes >= squared_norm_scratch_bytes(n),
               "squared_norm: scratch of ", scratch_bytes, " bytes, needs squared_norm_scratch_bytes(", n,
               ") = ", squared_norm_scratch_bytes(n));
  const std::size_t blocks = norm_blocks(n);
  double* partial = static_cast<double*>(scratch);
  norm_partial_kernel<<<unsigned(blocks), impl::kThreads, 0, stream>>>(partial, x, n);
  STRATA_KERNEL_CHECK(stream);
  norm_total_kernel<<<1, impl::kThreads, 0, stream>>>(out, partial, blocks);
  STRATA_KERNEL_CHECK(stream);
}

}  // namespace strata::kernels::cuda
