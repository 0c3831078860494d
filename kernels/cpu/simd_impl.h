// strata/kernels/cpu/simd_impl.h: per-element arithmetic the CPU ops vectorise — e^x as plain arithmetic,
// fixed-order lane reductions — and the choice of SIMD target at run time (internal to kernels/cpu).
//
// Note [SIMD row passes]: the per-token work between the matrix products (softmax exponentials of the
// attention and the cross-entropy, SwiGLU's sigmoid) is compiled for x86-64's baseline, AVX2 and AVX-512
// and one copy is picked at run time (simd_target()); no -march=native, so a binary runs on any x86-64.
// Every copy gives the same bits: the library is built with -ffp-contract=off (no FMA), and every sum runs
// in the order the source gives — kLanes interleaved partial sums, then the tail — whatever the vector
// width, so a run does not depend on the machine it runs on either. The files that use these are built
// with -fno-trapping-math (kernels/CMakeLists.txt): without it GCC keeps the clamps' compares as branches
// and vectorises none of the loops; it changes no value.
#pragma once

#include <bit>
#include <cstdint>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define STRATA_SIMD_X86 1  // the target attributes and __builtin_cpu_supports exist
#else
#define STRATA_SIMD_X86 0
#endif

namespace strata::kernels::cpu::impl {

// e^x in fp32 as plain arithmetic the compiler vectorises: without -ffast-math std::exp stays a scalar libm
// call per element. Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, a degree-6 polynomial for e^r, 2^n built
// in the exponent bits (n read from the bits of the rounding sum, so no float-to-int conversion). Within
// 1.5 ulp of e^x for x <= 88 (88 and above give e^88); 0 below ln(2^-126), where e^x would be subnormal,
// and for -inf; NaN stays NaN.
[[gnu::always_inline]] inline float exp_f32(float x) {
  constexpr float kMin = -87.336544f;    // ln(2^-126)
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: in xc log2(e) + kRound the low bits hold round(n)
  float xc = x < kMin ? kMin : x;        // written so that NaN passes through
  xc = xc > 88.0f ? 88.0f : xc;
  const float sum = xc * 1.44269504f + kRound;
  const float n = sum - kRound;
  const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;  // ln2 in two parts: r exact enough
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const std::uint32_t two_n = (std::bit_cast<std::uint32_t>(sum) - 0x4B400000u + 127u) << 23;
  return x < kMin ? 0.0f : p * std::bit_cast<float>(two_n);
}

// Reductions over a row in a fixed order: kLanes interleaved partial results, then the tail.
constexpr int kLanes = 8;

[[gnu::always_inline]] inline float max_row(const float* x, int n, float init) {
  float lane[kLanes];
  for (float& l : lane) l = init;
  int i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
  float m = init;
  for (float l : lane) m = l > m ? l : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

[[gnu::always_inline]] inline float sum_row(const float* x, int n) {
  float lane[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lane[j] += x[i + j];
  float s = 0.0f;
  for (float l : lane) s += l;
  for (; i < n; ++i) s += x[i];
  return s;
}

// The SIMD targets a pass is compiled for, best last.
enum class SimdTarget { baseline, avx2, avx512 };

// The best target this CPU runs (decided once). A file compiles one always-inline body three times —
// plain, [[gnu::target("avx2")]], [[gnu::target("avx512f,avx512bw,avx512vl")]] — and calls the copy this
// names.
inline SimdTarget simd_target() {
#if STRATA_SIMD_X86
  static const SimdTarget t = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                      __builtin_cpu_supports("avx512vl")
                                  ? SimdTarget::avx512
                              : __builtin_cpu_supports("avx2") ? SimdTarget::avx2
                                                               : SimdTarget::baseline;
  return t;
#else
  return SimdTarget::baseline;
#endif
}

}  // namespace strata::kernels::cpu::impl
