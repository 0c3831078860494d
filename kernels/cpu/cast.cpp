// strata/kernels/cpu/cast.cpp: fp32 <-> bf16 / fp16, round to nearest even, NaN kept NaN.
#include <bit>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/parallel_impl.h"

namespace strata::kernels::cpu {

bf16_t f32_to_bf16(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return bf16_t((u >> 16) | 0x0040u);  // NaN: keep sign, set quiet bit
  // Adding 0x7FFF plus the lowest kept bit rounds to nearest, ties to even; a carry out of the mantissa
  // moves to the next binade and past the largest finite value to infinity, as it should.
  return bf16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

float bf16_to_f32(bf16_t x) {
  return std::bit_cast<float>(std::uint32_t(x) << 16);
}

fp16_t f32_to_f16(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return fp16_t(sign | 0x7E00u | ((a >> 13) & 0x3FFu));  // NaN: quiet, top payload bits
  if (a >= 0x477FF000u) return fp16_t(sign | 0x7C00u);  // >= 65520 rounds to infinity (and inf stays inf)
  const std::uint32_t e = a >> 23;                      // biased fp32 exponent
  std::uint32_t m, shift, h;
  if (e >= 113) {  // normal fp16: keep 10 of the 23 mantissa bits, rebias the exponent by 127 - 15
    m = a & 0x7FFFFFu;
    shift = 13;
    h = ((e - 112) << 10) | (m >> shift);
  } else {                                      // fp16 subnormal or zero: the result counts units of 2^-24
    if (a <= 0x33000000u) return fp16_t(sign);  // <= 2^-25: ties to the even zero
    m = (a & 0x7FFFFFu) | 0x800000u;
    shift = 126 - e;  // 14..24
    h = m >> shift;
  }
  const std::uint32_t rem = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (h & 1u))) ++h;  // a carry may reach the next binade: still exact
  return fp16_t(sign | h);
}

float f16_to_f32(fp16_t x) {
  const std::uint32_t sign = std::uint32_t(x & 0x8000u) << 16;
  const std::uint32_t e = (x >> 10) & 0x1Fu, m = x & 0x3FFu;
  if (e == 0) {  // zero or subnormal: m * 2^-24, exact in fp32
    const float v = float(m) * 0x1p-24f;
    return sign ? -v : v;
  }
  if (e == 31) return std::bit_cast<float>(sign | 0x7F800000u | (m << 13));  // inf, NaN (payload kept)
  return std::bit_cast<float>(sign | ((e + 112) << 23) | (m << 13));
}

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

}  // namespace strata::kernels::cpu
