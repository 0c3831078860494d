// strata/kernels/cuda/cast.cu: fp32 <-> bf16 / fp16 with the CPU's rounding, bit for bit.
#include "kernels/cuda/common_impl.cuh"

namespace strata::kernels::cuda {
namespace {

__global__ void f32_to_bf16_kernel(bf16* out, const float* in, std::size_t n) {
  const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __ushort_as_bfloat16(impl::f32_to_bf16_bits(in[i]));
}

__global__ void bf16_to_f32_kernel(float* out, const bf16* in, std::size_t n) {
  const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __uint_as_float(std::uint32_t(__bfloat16_as_ushort(in[i])) << 16);
}

__global__ void f32_to_f16_kernel(fp16* out, const float* in, std::size_t n) {
  const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __ushort_as_half(impl::f32_to_f16_bits(in[i]));
}

// fp16 -> fp32 is exact, NaN payloads included, in the hardware conversion.
__global__ void f16_to_f32_kernel(float* out, const fp16* in, std::size_t n) {
  const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __half2float(in[i]);
}

}  // namespace

void cast_f32_to_bf16(bf16* out, const float* in, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  f32_to_bf16_kernel<<<impl::blocks_for(n), impl::kThreads, 0, stream>>>(out, in, n);
  STRATA_KERNEL_CHECK();
}

void cast_bf16_to_f32(float* out, const bf16* in, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  bf16_to_f32_kernel<<<impl::blocks_for(n), impl::kThreads, 0, stream>>>(out, in, n);
  STRATA_KERNEL_CHECK();
}

void cast_f32_to_f16(fp16* out, const float* in, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  f32_to_f16_kernel<<<impl::blocks_for(n), impl::kThreads, 0, stream>>>(out, in, n);
  STRATA_KERNEL_CHECK();
}

void cast_f16_to_f32(float* out, const fp16* in, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  f16_to_f32_kernel<<<impl::blocks_for(n), impl::kThreads, 0, stream>>>(out, in, n);
  STRATA_KERNEL_CHECK();
}

}  // namespace strata::kernels::cuda
