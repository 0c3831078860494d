// fp32 <-> bf16 / fp16 casts: round to nearest, ties to even, exactly; NaN stays NaN; 16 -> 32 exact.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/ops.h"

namespace strata::kernels::test {
namespace {

namespace cpu = strata::kernels::cpu;

float from_bits(std::uint32_t u) {
  return std::bit_cast<float>(u);
}
std::uint32_t bits(float x) {
  return std::bit_cast<std::uint32_t>(x);
}

bool is_bf16_nan(cpu::bf16_t h) {
  return (h & 0x7F80u) == 0x7F80u && (h & 0x7Fu) != 0;
}
bool is_f16_nan(cpu::fp16_t h) {
  return (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0;
}

// The nearest bf16 to a finite x, ties to even, decided in float64 from the two bf16 neighbours of x.
cpu::bf16_t nearest_bf16(float x) {
  const std::uint32_t down = bits(x) & 0xFFFF0000u;  // truncation: toward zero
  const std::uint32_t up = down + 0x10000u;          // next bf16 away from zero (may be infinity)
  const double dd = std::abs(double(x) - double(from_bits(down)));
  const double du = std::abs(double(from_bits(up)) - double(x));  // inf - x is inf: never chosen
  if ((up & 0x7FFFFFFFu) == 0x7F800000u) {
    // Past the largest finite bf16 the rounding boundary is the midpoint to 2^128, as if the exponent
    // range continued: x rounds to infinity from that midpoint on.
    const double mid = double(from_bits(down & 0x7FFFFFFFu)) + 0.5 * std::ldexp(1.0, 128 - 8);
    return cpu::bf16_t((std::abs(double(x)) >= mid ? up : down) >> 16);
  }
  if (dd < du) return cpu::bf16_t(down >> 16);
  if (du < dd) return cpu::bf16_t(up >> 16);
  return cpu::bf16_t(((down >> 16) & 1u) ? up >> 16 : down >> 16);
}

TEST(Cast, Bf16RoundTripsEvery16BitPattern) {
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const cpu::bf16_t back = cpu::f32_to_bf16(cpu::bf16_to_f32(cpu::bf16_t(h)));
    if (is_bf16_nan(cpu::bf16_t(h))) {
      EXPECT_TRUE(is_bf16_nan(back)) << std::hex << h;
      EXPECT_EQ(back & 0x8000u, h & 0x8000u) << "sign of NaN " << std::hex << h;
    } else {
      EXPECT_EQ(back, h) << std::hex << h;
    }
  }
}

TEST(Cast, Bf16RoundsToNearestEvenAtEveryMidpoint) {
  // Adjacent finite bf16 values a < b (positive and negative): the midpoint goes to the even one, one
  // fp32 ulp either side goes to the nearer one.
  for (std::uint32_t sign : {0u, 0x8000u}) {
    for (std::uint32_t h = 0; h < 0x7F7Fu; ++h) {
      const std::uint32_t a = (sign | h) << 16, b = (sign | (h + 1)) << 16;
      const std::uint32_t mid = a + 0x8000u;  // the exact midpoint in fp32 (same sign, magnitude between)
      const cpu::bf16_t even = (h & 1u) ? cpu::bf16_t(b >> 16) : cpu::bf16_t(a >> 16);
      ASSERT_EQ(cpu::f32_to_bf16(from_bits(mid)), even) << std::hex << mid;
      ASSERT_EQ(cpu::f32_to_bf16(from_bits(mid - 1)), a >> 16) << std::hex << mid - 1;
      ASSERT_EQ(cpu::f32_to_bf16(from_bits(mid + 1)), b >> 16) << std::hex << mid + 1;
    }
  }
}

TEST(Cast, Bf16MatchesFloat64NearestOnASweepOfAllFloats) {
  for (std::uint64_t u = 0; u < (1ull << 32); u += 4099) {
    const float x = from_bits(std::uint32_t(u));
    if (std::isnan(x)) continue;
    if (std::isinf(x)) {
      ASSERT_EQ(cpu::f32_to_bf16(x), std::uint32_t(u) >> 16);
      continue;
    }
    ASSERT_EQ(cpu::f32_to_bf16(x), nearest_bf16(x)) << std::hex << u;
  }
  EXPECT_EQ(cpu::f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80u);  // overflows to +inf
  EXPECT_EQ(cpu::f32_to_bf16(from_bits(0x7F7F7FFFu)), 0x7F7Fu);             // just below the midpoint
  EXPECT_EQ(cpu::f32_to_bf16(from_bits(0x00000001u)), 0x0000u);             // smallest subnormal -> +0
  EXPECT_EQ(cpu::f32_to_bf16(-0.0f), 0x8000u);
}

TEST(Cast, NanStaysNanEvenWithOnlyLowPayloadBits) {
  // Truncation alone would turn these into infinities.
  for (std::uint32_t u : {0x7F800001u, 0xFF800001u, 0x7FC00000u, 0x7F80FFFFu, 0xFFFFFFFFu}) {
    const cpu::bf16_t b = cpu::f32_to_bf16(from_bits(u));
    EXPECT_TRUE(is_bf16_nan(b)) << std::hex << u;
    EXPECT_EQ(b & 0x8000u, (u >> 16) & 0x8000u);
    const cpu::fp16_t h = cpu::f32_to_f16(from_bits(u));
    EXPECT_TRUE(is_f16_nan(h)) << std::hex << u;
    EXPECT_EQ(h & 0x8000u, (u >> 16) & 0x8000u);
    EXPECT_TRUE(std::isnan(cpu::bf16_to_f32(b)));
    EXPECT_TRUE(std::isnan(cpu::f16_to_f32(h)));
  }
}

TEST(Cast, Fp16WidensExactlyAndRoundTripsEvery16BitPattern) {
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const _Float16 ref = std::bit_cast<_Float16>(std::uint16_t(h));  // the compiler's IEEE conversion
    const float wide = cpu::f16_to_f32(cpu::fp16_t(h));
    if (is_f16_nan(cpu::fp16_t(h))) {
      EXPECT_TRUE(std::isnan(wide));
      const cpu::fp16_t back = cpu::f32_to_f16(wide);
      EXPECT_TRUE(is_f16_nan(back)) << std::hex << h;
      EXPECT_EQ(back & 0x8000u, h & 0x8000u);
      continue;
    }
    ASSERT_EQ(bits(wide), bits(float(ref))) << std::hex << h;
    ASSERT_EQ(cpu::f32_to_f16(wide), h) << std::hex << h;
  }
}

TEST(Cast, Fp16RoundsLikeIeeeOnMidpointsAndASweepOfAllFloats) {
  auto ieee = [](float x) { return std::bit_cast<std::uint16_t>(static_cast<_Float16>(x)); };
  // Midpoints between adjacent fp16 values (exact in fp32), and one fp32 ulp either side.
  for (std::uint32_t h = 0; h < 0x7BFFu; ++h) {
    const double a = cpu::f16_to_f32(cpu::fp16_t(h)), b = cpu::f16_to_f32(cpu::fp16_t(h + 1));
    const float mid = float((a + b) / 2);
    ASSERT_EQ(double(mid), (a + b) / 2);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      ASSERT_EQ(cpu::f32_to_f16(x), ieee(x)) << x;
      ASSERT_EQ(cpu::f32_to_f16(-x), ieee(-x)) << -x;
    }
  }
  for (std::uint64_t u = 0; u < (1ull << 32); u += 4099) {
    const float x = from_bits(std::uint32_t(u));
    if (std::isnan(x)) continue;
    ASSERT_EQ(cpu::f32_to_f16(x), ieee(x)) << std::hex << u;
  }
  EXPECT_EQ(cpu::f32_to_f16(65504.0f), 0x7BFFu);
  EXPECT_EQ(cpu::f32_to_f16(65519.996f), 0x7BFFu);
  EXPECT_EQ(cpu::f32_to_f16(65520.0f), 0x7C00u);  // the midpoint to 2^16 ties to infinity
  EXPECT_EQ(cpu::f32_to_f16(0x1p-24f), 0x0001u);  // smallest subnormal
  EXPECT_EQ(cpu::f32_to_f16(0x1p-25f), 0x0000u);  // half of it ties to even zero
}

TEST(Cast, BulkFormsMatchTheScalarForms) {
  std::vector<float> in;
  for (std::uint64_t u = 0; u < (1ull << 32); u += 65537) in.push_back(from_bits(std::uint32_t(u)));
  const std::size_t n = in.size();
  std::vector<cpu::bf16_t> b(n);
  std::vector<cpu::fp16_t> h(n);
  std::vector<float> bw(n), hw(n);
  cpu::cast_f32_to_bf16(b.data(), in.data(), n);
  cpu::cast_f32_to_f16(h.data(), in.data(), n);
  cpu::cast_bf16_to_f32(bw.data(), b.data(), n);
  cpu::cast_f16_to_f32(hw.data(), h.data(), n);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(b[i], cpu::f32_to_bf16(in[i]));
    ASSERT_EQ(h[i], cpu::f32_to_f16(in[i]));
    ASSERT_EQ(bits(bw[i]), bits(cpu::bf16_to_f32(b[i])));
    ASSERT_EQ(bits(hw[i]), bits(cpu::f16_to_f32(h[i])));
  }
}

}  // namespace
}  // namespace strata::kernels::test
