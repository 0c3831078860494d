// strata/kernels/cpu/cast.cpp: fp32 <-> bf16 / fp16, and fp16 <-> bf16 through fp32, in bulk, each element
// by core/dtype.h's scalar conversions (round to nearest even, NaN kept NaN).
#include "kernels/cpu/ops.h"
#include "kernels/cpu/parallel_impl.h"

namespace strata::kernels::cpu {

void cast_f32_to_bf16(bf16_t* out, const float* in, std::size_t n) {
  impl::parallel_for_range(n, impl::kElementGrain, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) out[i] = f32_to_bf16(in[i]);
  });
}

void cast_bf16_to_f32(float* out, const bf16_t* in, std::size_t n) {
  impl::parallel_for_range(n, impl::kElementGrain, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) out[i] = bf16_to_f32(in[i]);
  });
}

void cast_f32_to_f16(fp16_t* out, const float* in, std::size_t n) {
  impl::parallel_for_range(n, impl::kElementGrain, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) out[i] = f32_to_f16(in[i]);
  });
}

void cast_f16_to_f32(float* out, const fp16_t* in, std::size_t n) {
  impl::parallel_for_range(n, impl::kElementGrain, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) out[i] = f16_to_f32(in[i]);
  });
}

void cast_f16_to_bf16(bf16_t* out, const fp16_t* in, std::size_t n) {
  impl::parallel_for_range(n, impl::kElementGrain, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) out[i] = f32_to_bf16(f16_to_f32(in[i]));
  });
}

void cast_bf16_to_f16(fp16_t* out, const bf16_t* in, std::size_t n) {
  impl::parallel_for_range(n, impl::kElementGrain, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) out[i] = f32_to_f16(bf16_to_f32(in[i]));
  });
}

}  // namespace strata::kernels::cpu
