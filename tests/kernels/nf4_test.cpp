// NF4 on the CPU (kernels/cpu/nf4.h) against bitsandbytes, bit for bit: codes, absmax and dequantised
// values of vectors bitsandbytes made (tests/reference/make_nf4_reference.py -> nf4_reference.h), the same
// for its double quantisation of the absmax, and the properties that hold for any input.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/nf4.h"
#include "tests/kernels/nf4_reference.h"

namespace strata::kernels::cpu {
namespace {

std::vector<float> floats(std::span<const std::uint32_t> bits) {
  std::vector<float> v;
  for (std::uint32_t b : bits) v.push_back(std::bit_cast<float>(b));
  return v;
}

struct Case {
  const char* name;
  std::span<const std::uint32_t> in;
  std::span<const std::uint8_t> codes;
  std::span<const std::uint32_t> absmax, out;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

class Nf4Bitsandbytes : public ::testing::TestWithParam<Case> {};

TEST_P(Nf4Bitsandbytes, CodesAbsmaxAndDequantisedValuesAreBitsandbytesBitForBit) {
  const Case& c = GetParam();
  const std::vector<float> x = floats(c.in);
  const std::size_t n = x.size();
  std::vector<std::uint8_t> codes(nf4_code_bytes(n));
  std::vector<float> absmax(nf4_blocks(n, 64)), out(n);
  ASSERT_EQ(codes.size(), c.codes.size());
  ASSERT_EQ(absmax.size(), c.absmax.size());
  quantize_nf4(x.data(), n, 64, codes.data(), absmax.data());
  for (std::size_t b = 0; b < absmax.size(); ++b)
    EXPECT_EQ(std::bit_cast<std::uint32_t>(absmax[b]), c.absmax[b]) << "absmax of block " << b;
  for (std::size_t j = 0; j < codes.size(); ++j)
    EXPECT_EQ(int(codes[j]), int(c.codes[j]))
        << "code byte " << j << " (values " << 2 * j << ", " << 2 * j + 1 << ": " << x[2 * j] << ", "
        << (2 * j + 1 < n ? x[2 * j + 1] : 0.f) << ")";
  dequantize_nf4(codes.data(), absmax.data(), n, 64, out.data());
  for (std::size_t i = 0; i < n; ++i)
    EXPECT_EQ(std::bit_cast<std::uint32_t>(out[i]), c.out[i]) << "dequantised value " << i;
}

using namespace kernels::test;
INSTANTIATE_TEST_SUITE_P(Vectors, Nf4Bitsandbytes,
                         ::testing::Values(Case{"ragged", kRaggedIn, kRaggedCodes, kRaggedAbsmax, kRaggedOut},
                                           Case{"zeros", kZerosIn, kZerosCodes, kZerosAbsmax, kZerosOut},
                                           Case{"boundaries", kBoundariesIn, kBoundariesCodes,
                                                kBoundariesAbsmax, kBoundariesOut}),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// For any input: each value comes back as the level nearest its scaled value (to within the rounding of
// the scale), the block's largest comes back exactly, and levels are exact: quantising a dequantised
// tensor gives the same codes.
TEST(Nf4, ValuesReturnAsTheirNearestLevelAndLevelsAreFixedPoints) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const std::size_t n = 64 * 50 + 31, B = 64;
  std::vector<float> x(n), out(n), again(n), absmax(nf4_blocks(n, B)), absmax2(absmax.size());
  for (float& v : x) v = normal(rng);
  std::vector<std::uint8_t> codes(nf4_code_bytes(n)), codes2(codes.size());
  quantize_nf4(x.data(), n, B, codes.data(), absmax.data());
  dequantize_nf4(codes.data(), absmax.data(), n, B, out.data());
  for (std::size_t i = 0; i < n; ++i) {
    const double a = absmax[i / B], s = x[i] / a;
    double best = 2;
    for (float l : kNf4Levels) best = std::min(best, std::abs(s - l));
    ASSERT_LE(std::abs(double(out[i]) / a - s), best + 1e-6)
        << "value " << i << " is not at its nearest level";
    if (std::fabs(x[i]) == absmax[i / B]) {
      EXPECT_EQ(std::fabs(out[i]), absmax[i / B]);
    }
  }
  quantize_nf4(out.data(), n, B, codes2.data(), absmax2.data());
  EXPECT_EQ(codes, codes2);
  EXPECT_EQ(absmax, absmax2);
}

TEST(Nf4, TheLevelsAreAscendingWithZeroAtSevenAndOneAtFifteen) {
  for (std::size_t i = 1; i < kNf4Levels.size(); ++i) EXPECT_LT(kNf4Levels[i - 1], kNf4Levels[i]);
  EXPECT_EQ(kNf4Levels[0], -1.0f);
  EXPECT_EQ(kNf4Levels[7], 0.0f);
  EXPECT_EQ(kNf4Levels[15], 1.0f);
}

// ---- double quantisation ----------------------------------------------------------------------------------

// make_nf4_reference.py's dq_input: value i is a uniform in [-1, 1) on a 2^-23 grid times its 64-block's
// scale, (16 + a) x 2^-(9 + b), or 0 for one block in 8 (both sides round the same two products).
std::uint32_t fmix32(std::uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}

std::vector<float> dq_input(std::size_t n, std::uint32_t seed) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto u = std::int32_t(fmix32(std::uint32_t(i) * 0x9E3779B9u + seed) >> 8) - (1 << 23);
    const std::uint32_t g = fmix32(std::uint32_t(i / 64) * 0x7FEB352Du + seed + 1);
    const float scale = (g >> 8) % 8 == 0 ? 0.0f : std::ldexp(float(16 + (g & 15)), -int(9 + ((g >> 4) & 3)));
    x[i] = float(u) * 0x1p-23f * scale;
  }
  return x;
}

std::vector<float> plus_minus_quarter(std::size_t n) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = i % 2 == 0 ? 0.25f : -0.25f;
  return x;
}

// make_nf4_reference.py's near_mean_input: absmax around their mean by up to 11 x 2^-20, where the
// dynamic map's levels are closer together than its grid's points.
std::vector<float> near_mean_input() {
  std::vector<float> x(64 * 40, 0.0f);
  for (int b = 1; b < 39; ++b) x[64 * b] = 0.5f + float((7 * b) % 23 - 11) * 0x1p-20f;
  x[64 * 39] = 1.0f;
  return x;
}

// FNV-1a 64 over the values' little-endian bytes (make_nf4_reference.py's fnv1a64).
std::uint64_t fnv1a64(std::span<const float> v) {
  std::uint64_t h = 0xCBF29CE484222325u;
  for (float f : v) {
    const std::uint32_t b = std::bit_cast<std::uint32_t>(f);
    for (int k = 0; k < 4; ++k) h = (h ^ ((b >> (8 * k)) & 0xFF)) * 0x100000001B3u;
  }
  return h;
}

struct DqCase {
  const char* name;
  std::vector<float> (*input)();
  std::span<const std::uint8_t> codes;
  std::span<const std::uint32_t> absmax2;
  std::uint32_t offset;
  std::uint64_t absmax_hash, out_hash;
  std::span<const std::uint32_t> out;  // empty: only the hash
};

// What bitsandbytes' quantize_4bit(compress_statistics=True) then dequantize_4bit compute, here.
struct DqRun {
  std::vector<float> x, absmax, absmax_dq, out;
  Nf4DoubleQuant q;
};

DqRun run_dq(const DqCase& c) {
  DqRun r;
  r.x = c.input();
  const std::size_t n = r.x.size(), nb = nf4_blocks(n, 64);
  std::vector<std::uint8_t> codes(nf4_code_bytes(n));
  r.absmax.resize(nb);
  quantize_nf4(r.x.data(), n, 64, codes.data(), r.absmax.data());
  r.q = quantize_nf4_absmax(r.absmax.data(), nb);
  r.absmax_dq.resize(nb);
  dequantize_nf4_absmax(r.q, nb, r.absmax_dq.data());
  r.out.resize(n);
  dequantize_nf4(codes.data(), r.absmax_dq.data(), n, 64, r.out.data());
  return r;
}

void PrintTo(const DqCase& c, std::ostream* os) {
  *os << c.name;
}

class Nf4DoubleQuantBitsandbytes : public ::testing::TestWithParam<DqCase> {};

TEST_P(Nf4DoubleQuantBitsandbytes, CodesAbsmax2AndOffsetAreBitsandbytesBitForBit) {
  const DqCase& c = GetParam();
  const DqRun r = run_dq(c);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(r.q.offset), c.offset) << "offset " << r.q.offset;
  ASSERT_EQ(r.q.absmax2.size(), c.absmax2.size());
  for (std::size_t b = 0; b < c.absmax2.size(); ++b)
    EXPECT_EQ(std::bit_cast<std::uint32_t>(r.q.absmax2[b]), c.absmax2[b]) << "absmax2 of block " << b;
  ASSERT_EQ(r.q.codes.size(), c.codes.size());
  for (std::size_t b = 0; b < c.codes.size(); ++b)
    EXPECT_EQ(int(r.q.codes[b]), int(c.codes[b])) << "code of absmax " << b << " (" << r.absmax[b]
                                                  << ", minus the offset " << r.absmax[b] - r.q.offset << ")";
}

TEST_P(Nf4DoubleQuantBitsandbytes, DequantisedAbsmaxAndValuesAreBitsandbytesBitForBit) {
  const DqCase& c = GetParam();
  const DqRun r = run_dq(c);
  EXPECT_EQ(fnv1a64(r.absmax_dq), c.absmax_hash) << "the dequantised absmax differ from bitsandbytes'";
  EXPECT_EQ(fnv1a64(r.out), c.out_hash) << "the dequantised values differ from bitsandbytes'";
  for (std::size_t i = 0; i < c.out.size(); ++i)
    EXPECT_EQ(std::bit_cast<std::uint32_t>(r.out[i]), c.out[i]) << "dequantised value " << i;
}

template <std::size_t N, std::uint32_t Seed>
std::vector<float> dq_input_of() {
  return dq_input(N, Seed);
}

// A case of nf4_reference.h by its name there (kDq<Name>...).
#define STRATA_DQ_CASE(name, Name, input, out)                                                   \
  DqCase {                                                                                       \
    name, input, kDq##Name##Codes, kDq##Name##Absmax2, kDq##Name##Offset, kDq##Name##AbsmaxHash, \
        kDq##Name##OutHash, out                                                                  \
  }

INSTANTIATE_TEST_SUITE_P(
    Vectors, Nf4DoubleQuantBitsandbytes,
    ::testing::Values(STRATA_DQ_CASE("small", Small, (dq_input_of<64 * 2 + 21, 1>), kDqSmallOut),
                      STRATA_DQ_CASE("odd", Odd, (dq_input_of<64 * 257 + 37, 2>), {}),
                      STRATA_DQ_CASE("sixteens", Sixteens, (dq_input_of<64 * 260, 3>), {}),
                      STRATA_DQ_CASE("even", Even, (dq_input_of<64 * 20 + 10, 4>), {}),
                      STRATA_DQ_CASE("flat", Flat, [] { return plus_minus_quarter(640); }, {}),
                      STRATA_DQ_CASE("near_mean", NearMean, near_mean_input, {})),
    [](const ::testing::TestParamInfo<DqCase>& i) { return std::string(i.param.name); });
#undef STRATA_DQ_CASE

// For any absmax: each comes back within half the widest gap between neighbouring levels of the dynamic
// map, times its block's absmax2 (plus the grid's half step, 1 / 65535, and fp32 rounding); absmax2 is at
// most the spread of the absmax (the offset, their mean, lies between the least and the largest), so the
// error is bounded by 0.0071 x (max - min). Each code is also within the grid's step of the nearest level.
TEST(Nf4DoubleQuant, DequantisedAbsmaxIsWithinHalfALevelGapTimesTheSpread) {
  double widest = 0;
  for (std::size_t k = 1; k < kDynamicMap.size(); ++k)
    widest = std::max(widest, double(kDynamicMap[k] - kDynamicMap[k - 1]));
  ASSERT_LT(widest / 2, 0.0071);
  const std::uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 20; ++trial) {
    const std::size_t nb = 1 + rng() % 3000;
    std::lognormal_distribution<float> spread(std::log(0.02f), 0.1f + 0.2f * float(trial % 5));
    std::vector<float> absmax(nb), back(nb);
    for (float& a : absmax) a = spread(rng);
    if (trial % 4 == 0) absmax[rng() % nb] = 0.0f;  // a block of zeros
    const Nf4DoubleQuant q = quantize_nf4_absmax(absmax.data(), nb);
    dequantize_nf4_absmax(q, nb, back.data());
    const auto [lo, hi] = std::minmax_element(absmax.begin(), absmax.end());
    for (std::size_t b = 0; b < nb; ++b) {
      const double a2 = q.absmax2[b / kNf4AbsmaxBlocksize];
      ASSERT_LE(a2, double(*hi - *lo) * (1 + 1e-6)) << "absmax2 of block " << b / kNf4AbsmaxBlocksize;
      const double err = std::abs(double(back[b]) - absmax[b]);
      ASSERT_LE(err, (widest / 2 + 1.0 / 65535) * a2 + 1e-6 * absmax[b]) << "absmax " << b << " of " << nb;
      ASSERT_LE(err, 0.0072 * double(*hi - *lo) + 1e-6 * absmax[b]) << "absmax " << b << " of " << nb;
      if (a2 == 0) continue;
      const double s = (double(absmax[b]) - q.offset) / a2;
      double nearest = 2;
      for (float l : kDynamicMap) nearest = std::min(nearest, std::abs(s - l));
      ASSERT_LE(std::abs(kDynamicMap[q.codes[b]] - s), nearest + 2.0 / 65535) << "code of absmax " << b;
    }
  }
}

TEST(Nf4DoubleQuant, TheDynamicMapIsAscendingWithZeroAt127AndOneAt255) {
  for (std::size_t i = 1; i < kDynamicMap.size(); ++i) EXPECT_LT(kDynamicMap[i - 1], kDynamicMap[i]);
  EXPECT_EQ(kDynamicMap[127], 0.0f);
  EXPECT_EQ(kDynamicMap[255], 1.0f);
  EXPECT_NEAR(kDynamicMap[0], -0.99297, 1e-5);
}

TEST(Nf4DoubleQuant, NoBlocksGiveAnEmptyStateAndAMismatchedCountIsRefused) {
  const Nf4DoubleQuant empty = quantize_nf4_absmax(nullptr, 0);
  EXPECT_TRUE(empty.codes.empty());
  EXPECT_TRUE(empty.absmax2.empty());
  EXPECT_EQ(empty.offset, 0.0f);
  const std::vector<float> absmax(300, 0.5f);
  const Nf4DoubleQuant q = quantize_nf4_absmax(absmax.data(), absmax.size());
  std::vector<float> out(absmax.size());
  EXPECT_THROW(dequantize_nf4_absmax(q, 299, out.data()), strata::Error);
}

}  // namespace
}  // namespace strata::kernels::cpu
