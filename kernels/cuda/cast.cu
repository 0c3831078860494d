// strata/kernels/cuda/cast.cu: fp32 <-> bf16 / fp16, and fp16 <-> bf16 through fp32, with the CPU's
// rounding, bit for bit; 8 elements per
// thread with 16-byte loads (Note [vectorised element-wise kernels] in common_impl.cuh).
#include "kernels/cuda/common_impl.cuh"

namespace strata::kernels::cuda {
namespace {

using impl::kVec;
using impl::Pack8;

// One functor per conversion: bits in, bits out, as kernels/cpu/cast.cpp.
struct F32ToBF16 {
  __device__ bf16 operator()(float x) const { return __ushort_as_bfloat16(impl::f32_to_bf16_bits(x)); }
};
struct BF16ToF32 {
  __device__ float operator()(bf16 x) const {
    return __uint_as_float(std::uint32_t(__bfloat16_as_ushort(x)) << 16);
  }
};
struct F32ToF16 {
  __device__ fp16 operator()(float x) const { return __ushort_as_half(impl::f32_to_f16_bits(x)); }
};
// fp16 -> fp32 is exact, NaN payloads included, in the hardware conversion.
struct F16ToF32 {
  __device__ float operator()(fp16 x) const { return __half2float(x); }
};

// fp16 <-> bf16: widened exactly to fp32, then rounded once (kernels/cpu/cast.cpp's composition).
struct F16ToBF16 {
  __device__ bf16 operator()(fp16 x) const { return F32ToBF16{}(F16ToF32{}(x)); }
};
struct BF16ToF16 {
  __device__ fp16 operator()(bf16 x) const { return F32ToF16{}(BF16ToF32{}(x)); }
};

template <typename Out, typename In, typename Op>
__global__ void cast_kernel(Out* out, const In* in, std::size_t n, bool vec) {
  const std::size_t i = impl::group_start();
  if (i >= n) return;
  const Pack8<In> x = impl::load8(in, i, n, vec);
  Pack8<Out> y;
#pragma unroll
  for (int k = 0; k < kVec; ++k) y.v[k] = Op{}(x.v[k]);
  impl::store8(out, i, n, vec, y);
}

template <typename Op, typename Out, typename In>
void cast(Out* out, const In* in, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  detail::CudaDeviceGuard guard(stream);
  const bool vec = impl::aligned16(out) && impl::aligned16(in);
  cast_kernel<Out, In, Op><<<impl::vec_blocks_for(n), impl::kThreads, 0, stream>>>(out, in, n, vec);
  STRATA_KERNEL_CHECK(stream);
}

}  // namespace

void cast_f32_to_bf16(bf16* out, const float* in, std::size_t n, cudaStream_t stream) {
  cast<F32ToBF16>(out, in, n, stream);
}

void cast_bf16_to_f32(float* out, const bf16* in, std::size_t n, cudaStream_t stream) {
  cast<BF16ToF32>(out, in, n, stream);
}

void cast_f32_to_f16(fp16* out, const float* in, std::size_t n, cudaStream_t stream) {
  cast<F32ToF16>(out, in, n, stream);
}

void cast_f16_to_f32(float* out, const fp16* in, std::size_t n, cudaStream_t stream) {
  cast<F16ToF32>(out, in, n, stream);
}

void cast_f16_to_bf16(bf16* out, const fp16* in, std::size_t n, cudaStream_t stream) {
  cast<F16ToBF16>(out, in, n, stream);
}

void cast_bf16_to_f16(fp16* out, const bf16* in, std::size_t n, cudaStream_t stream) {
  cast<BF16ToF16>(out, in, n, stream);
}

}  // namespace strata::kernels::cuda
