// Dropout (kernels/cpu/ops.h): nn.Dropout's x * keep / (1 - p) with a mask that is a pure function of
// (key, element index) — the identity at p = 0, the same mask for the same key, another for another key,
// the kept fraction 1 - p within a binomial bound, and each kept value exactly in * fp32(1 / (1 - p)).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/ops.h"
#include "tests/kernels/reference.h"

namespace strata::kernels::test {
namespace {

namespace cpu = strata::kernels::cpu;

std::vector<float> dropped(const std::vector<float>& x, double p, std::uint64_t key) {
  std::vector<float> out(x.size());
  cpu::dropout(out.data(), x.data(), x.size(), p, key);
  return out;
}

std::vector<cpu::bf16_t> dropped(const std::vector<cpu::bf16_t>& x, double p, std::uint64_t key) {
  std::vector<cpu::bf16_t> out(x.size());
  cpu::dropout(out.data(), x.data(), x.size(), p, key);
  return out;
}

// Which elements were kept: nonzero outputs of an input with no zero.
std::vector<bool> kept(const std::vector<float>& out) {
  std::vector<bool> k(out.size());
  for (std::size_t i = 0; i < out.size(); ++i) k[i] = out[i] != 0.0f;
  return k;
}

bool same_bits(const void* a, const void* b, std::size_t bytes) {
  return std::memcmp(a, b, bytes) == 0;
}

TEST(Dropout, ZeroProbabilityIsTheIdentityBitForBit) {
  std::vector<float> x = random_floats(10007, 1);
  x[3] = -0.0f, x[4] = INFINITY, x[5] = NAN;  // every value, non-finite ones too, passes unchanged
  const std::vector<float> out = dropped(x, 0.0, 42);
  EXPECT_TRUE(same_bits(out.data(), x.data(), x.size() * sizeof(float)));
  const std::vector<cpu::bf16_t> xb = to_bf16(x), ob = dropped(xb, 0.0, 42);
  EXPECT_TRUE(same_bits(ob.data(), xb.data(), xb.size() * sizeof(cpu::bf16_t)));
  std::vector<float> in_place = x;
  cpu::dropout(in_place.data(), in_place.data(), in_place.size(), 0.0, 42);
  EXPECT_TRUE(same_bits(in_place.data(), x.data(), x.size() * sizeof(float)));
}

TEST(Dropout, TheSameKeyGivesTheSameBitsAnotherKeyAnotherMask) {
  const std::vector<float> x = random_floats(100003, 2);
  const std::vector<float> a = dropped(x, 0.2, 7), again = dropped(x, 0.2, 7), other = dropped(x, 0.2, 8);
  EXPECT_TRUE(same_bits(a.data(), again.data(), a.size() * sizeof(float)));
  const std::vector<bool> ka = kept(a), ko = kept(other);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < x.size(); ++i) differ += ka[i] != ko[i] ? 1 : 0;
  // Independent masks differ where one keeps and the other drops: 2 p (1 - p) = 32% of the elements.
  EXPECT_GT(differ, x.size() / 4) << "keys 7 and 8 draw nearly the same mask";
  // The mask does not depend on the values or the dtype: the bf16 variant drops the same elements.
  const std::vector<cpu::bf16_t> b = dropped(to_bf16(random_floats(x.size(), 3)), 0.2, 7);
  std::size_t mismatched = 0;
  for (std::size_t i = 0; i < x.size(); ++i) mismatched += (cpu::bf16_to_f32(b[i]) != 0.0f) != ka[i] ? 1 : 0;
  EXPECT_EQ(mismatched, 0u);
}

// Over 1M elements the kept count is Binomial(n, 1 - p): within 6 standard deviations of n (1 - p).
TEST(Dropout, TheKeptFractionIsOneMinusPWithinABinomialBound) {
  const std::size_t n = 1 << 20;
  const std::vector<float> x(n, 1.0f);
  for (double p : {0.1, 0.5}) {
    for (std::uint64_t key : {1ull, 0xDEADBEEFull}) {
      const std::vector<float> out = dropped(x, p, key);
      std::size_t k = 0;
      for (float v : out) k += v != 0.0f ? 1 : 0;
      const double mean = double(n) * (1 - p), sd = std::sqrt(double(n) * p * (1 - p));
      EXPECT_LT(std::abs(double(k) - mean), 6 * sd) << "p " << p << " key " << key << ": kept " << k;
    }
  }
}

// Kept: in * fp32(1) / fp32(1 - p), one fp32 product (rounded once to bf16 in the bf16 variant); dropped: in
// * 0.
TEST(Dropout, KeptValuesAreTheInputTimesTheFactorExactly) {
  const std::vector<float> x = random_floats(50001, 4, 3.0f);
  for (double p : {0.1, 0.05, 0.5, 0.9}) {
    const float scale = 1.0f / float(1.0 - p);
    const std::vector<float> out = dropped(x, p, 11);
    const std::vector<cpu::bf16_t> xb = to_bf16(x), ob = dropped(xb, p, 11);
    std::size_t n_kept = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (out[i] == 0.0f) {
        EXPECT_EQ(std::signbit(out[i]), std::signbit(x[i])) << i;  // in * 0: PyTorch's input * mask
        EXPECT_EQ(cpu::bf16_to_f32(ob[i]), 0.0f) << i;
        continue;
      }
      ++n_kept;
      const float want = x[i] * scale;
      ASSERT_TRUE(same_bits(&out[i], &want, sizeof want)) << "p " << p << " element " << i;
      ASSERT_EQ(ob[i], cpu::f32_to_bf16(cpu::bf16_to_f32(xb[i]) * scale)) << "p " << p << " element " << i;
    }
    EXPECT_GT(n_kept, 0u);
  }
}

TEST(Dropout, InPlaceEqualsOutOfPlace) {
  const std::vector<float> x = random_floats(70001, 5);
  std::vector<float> in_place = x;
  cpu::dropout(in_place.data(), in_place.data(), x.size(), 0.3, 99);
  const std::vector<float> out = dropped(x, 0.3, 99);
  EXPECT_TRUE(same_bits(in_place.data(), out.data(), x.size() * sizeof(float)));
}

// A use of one key per (layer, site): derived keys differ from each other and from the key.
TEST(Dropout, DerivedKeysAreDistinct) {
  const std::uint64_t k = 12345;
  EXPECT_NE(cpu::dropout_key(k, 0), cpu::dropout_key(k, 1));
  EXPECT_NE(cpu::dropout_key(k, 0), k);
  EXPECT_NE(cpu::dropout_key(k, 1), cpu::dropout_key(k + 1, 1));
  EXPECT_EQ(cpu::dropout_key(k, 1), cpu::dropout_key(k, 1));
}

}  // namespace
}  // namespace strata::kernels::test
