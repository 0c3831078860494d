// NF4 on the CPU (kernels/cpu/nf4.h) against bitsandbytes, bit for bit: codes, absmax and dequantised
// values of vectors bitsandbytes made (tests/reference/make_nf4_reference.py -> nf4_reference.h), and the
// properties that hold for any input.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

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

}  // namespace
}  // namespace strata::kernels::cpu
