// The bf16 / fp16 conversions: the scalar ones of dtype.h against independent oracles, and the SIMD
// ones of every target against the scalar ones, over every 16-bit pattern and the fp32 values where
// rounding is delicate (ties, overflow, subnormals, NaN payloads).
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "tests/cpu_optim/common.h"

namespace strata::cpu_optim::test {
namespace {

bool is_nan16(std::uint16_t h, bool bf16) {
  return bf16 ? ((h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0)
              : ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0);
}

// fp32 values worth rounding: a sweep of bit patterns, and for each 16-bit value the points just
// below, at and above the midpoint to its successor, plus the range edges.
std::vector<float> probe_values() {
  std::vector<float> v;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 0x10001ull)
    v.push_back(std::bit_cast<float>(std::uint32_t(u)));
  for (std::uint32_t h = 0; h < 0x8000u; ++h) {
    for (bool bf16 : {true, false}) {
      const float a = bf16 ? bf16_to_f32(std::uint16_t(h)) : f16_to_f32(std::uint16_t(h));
      const float b = bf16 ? bf16_to_f32(std::uint16_t(h + 1)) : f16_to_f32(std::uint16_t(h + 1));
      if (!std::isfinite(a) || !std::isfinite(b)) continue;
      const float mid = float((double(a) + double(b)) / 2);  // exact: the midpoint has few bits
      for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
        v.push_back(x);
        v.push_back(-x);
      }
    }
  }
  for (float x : {65504.0f, 65519.996f, 65520.0f, 65536.0f, 0x1p-14f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f,
                  3.3895314e38f, 3.4028235e38f, INFINITY, -INFINITY, 0.0f, -0.0f, 0x1p-149f, 0x1p-126f}) {
    v.push_back(x);
  }
  // NaNs: quiet and signalling, with payloads in the high and low bits, both signs.
  for (std::uint32_t u : {0x7fc00000u, 0x7f800001u, 0x7fbfffffu, 0x7fc12345u, 0xffc00000u, 0xff800001u,
                          0x7f8000ffu, 0x7fa00000u}) {
    v.push_back(std::bit_cast<float>(u));
  }
  return v;
}

TEST(ScalarConversion, WideningFp16IsExactForEveryPattern) {
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    const float got = f16_to_f32(std::uint16_t(h));
    _Float16 hf;
    const std::uint16_t bits = std::uint16_t(h);
    std::memcpy(&hf, &bits, 2);
    const float want = float(hf);
    if (is_nan16(bits, false)) {
      const std::uint32_t u = std::bit_cast<std::uint32_t>(got);
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
      ASSERT_EQ(u >> 31, h >> 15u) << "sign of NaN " << std::hex << h;
      ASSERT_EQ((u >> 13) & 0x3ffu, h & 0x3ffu) << "payload of NaN " << std::hex << h;
    } else {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(got), std::bit_cast<std::uint32_t>(want)) << std::hex << h;
    }
  }
}

TEST(ScalarConversion, WideningBf16IsExactForEveryPattern) {
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(bf16_to_f32(std::uint16_t(h))), h << 16) << std::hex << h;
  }
}

TEST(ScalarConversion, NarrowingToFp16RoundsToNearestEven) {
  for (float x : probe_values()) {
    const std::uint16_t got = f32_to_f16(x);
    if (std::isnan(x)) {
      const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
      ASSERT_TRUE(is_nan16(got, false)) << x;
      ASSERT_EQ(got, std::uint16_t(((u >> 16) & 0x8000u) | 0x7e00u | ((u >> 13) & 0x3ffu))) << std::hex << u;
      continue;
    }
    const _Float16 want = _Float16(x);  // GCC's conversion: round to nearest even
    std::uint16_t want_bits;
    std::memcpy(&want_bits, &want, 2);
    ASSERT_EQ(got, want_bits) << std::hexfloat << x;
  }
}

TEST(ScalarConversion, NarrowingToBf16RoundsToNearestEven) {
  for (float x : probe_values()) {
    const std::uint16_t got = f32_to_bf16(x);
    if (std::isnan(x)) {
      const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
      ASSERT_EQ(got, std::uint16_t((u >> 16) | 0x40u)) << std::hex << u;
      continue;
    }
    const double want = reference::round_to_bf16(double(x));
    ASSERT_EQ(double(bf16_to_f32(got)), want) << std::hexfloat << x;
  }
}

// Lion with lr = 0 and beta2 = 0 leaves params unchanged except for quieting a signalling NaN, and
// sets the momentum to the gradient exactly: so a step exposes the target's widening of the gradients
// (in exp_avg, fp32) and its rounding of params (in out).
class SimdConversion : public ::testing::TestWithParam<std::string> {};

TEST_P(SimdConversion, RoundingOfParamsMatchesScalarForEveryProbe) {
  STRATA_SKIP_UNLESS_RUNNABLE(GetParam());
  Optimizer opt(options_for(GetParam()));
  std::vector<float> p = probe_values();
  for (Out out : {Out::bf16, Out::f16}) {
    const Case c{Opt::lion, DType::fp32, DType::fp32, out, GetParam()};
    TestShard ts(c, p.size(), true, 1);
    std::memcpy(ts.params(), p.data(), p.size() * 4);
    std::memset(ts.g.get(), 0, p.size() * 4);
    std::memset(ts.m.get(), 0, p.size() * 4);
    LionParams hp;
    hp.lr = 0.0f;
    ShardStep st;
    opt.lion(st, hp, 1, ts.shard());
    const auto* o = static_cast<const std::uint16_t*>(ts.out.get());
    for (std::size_t i = 0; i < p.size(); ++i) {
      const float after = ts.params()[i];
      if (!std::isnan(p[i])) {
        ASSERT_EQ(std::bit_cast<std::uint32_t>(after), std::bit_cast<std::uint32_t>(p[i]));
      }
      const std::uint16_t want = out == Out::bf16 ? f32_to_bf16(after) : f32_to_f16(after);
      ASSERT_EQ(o[i], want) << (out == Out::bf16 ? "bf16" : "fp16") << " of " << std::hexfloat << after;
    }
  }
}

TEST_P(SimdConversion, WideningOfGradientsMatchesScalarForEveryPattern) {
  STRATA_SKIP_UNLESS_RUNNABLE(GetParam());
  Optimizer opt(options_for(GetParam()));
  for (DType gt : {DType::bf16, DType::fp16}) {
    const Case c{Opt::lion, gt, DType::fp32, Out::none, GetParam()};
    TestShard ts(c, 0x10000, true, 1);
    auto* g = static_cast<std::uint16_t*>(ts.g.get());
    auto* m = static_cast<float*>(ts.m.get());
    for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
      g[h] = std::uint16_t(h);
      m[h] = -0.0f;  // 0 * -0 + g keeps the sign of a zero gradient
      ts.params()[h] = 1.0f;
    }
    LionParams hp;
    hp.lr = 0.0f;
    hp.beta2 = 0.0f;
    ShardStep st;
    opt.lion(st, hp, 1, ts.shard());
    for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
      const float want = gt == DType::bf16 ? bf16_to_f32(std::uint16_t(h)) : f16_to_f32(std::uint16_t(h));
      std::uint32_t want_bits = std::bit_cast<std::uint32_t>(want);
      if (std::isnan(want)) want_bits |= 0x00400000u;  // arithmetic quiets a signalling NaN
      ASSERT_EQ(std::bit_cast<std::uint32_t>(m[h]), want_bits)
          << dtype_name(gt) << " pattern " << std::hex << h;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, SimdConversion, ::testing::ValuesIn(compiled_targets()));

}  // namespace
}  // namespace strata::cpu_optim::test
