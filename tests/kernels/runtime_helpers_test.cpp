// The runtime helpers: scale, the non-finite check, the squared norm and the AdamW update.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "tests/kernels/reference.h"

namespace strata::kernels::test {
namespace {

namespace cpu = strata::kernels::cpu;

TEST(RuntimeHelpers, ScaleMultipliesEveryElement) {
  const std::size_t n = 100003;
  const auto x0 = random_floats(n, 1);
  auto x = x0;
  cpu::scale(x.data(), 0.125f * 3, n);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(x[i], x0[i] * (0.125f * 3)) << i;
}

TEST(RuntimeHelpers, NonFiniteCheckFindsOneBadValueAnywhere) {
  const std::size_t n = 200001;
  auto x = random_floats(n, 2);
  x[7] = std::numeric_limits<float>::max();
  x[8] = std::numeric_limits<float>::denorm_min();
  x[9] = -0.0f;
  EXPECT_FALSE(cpu::has_nonfinite(x.data(), n));
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity(), std::bit_cast<float>(0xFF800001u)}) {
    for (std::size_t at : {std::size_t{0}, n / 2 + 17, n - 1}) {
      auto y = x;
      y[at] = bad;
      EXPECT_TRUE(cpu::has_nonfinite(y.data(), n)) << bad << " at " << at;
    }
  }
  EXPECT_FALSE(cpu::has_nonfinite(x.data(), 0));
}

TEST(RuntimeHelpers, SquaredNormMatchesFloat64Sum) {
  for (std::size_t n : {std::size_t{1}, std::size_t{4095}, std::size_t{4097}, std::size_t{1000003}}) {
    const auto x = random_floats(n, 3 + n);
    long double want = 0.0L;
    for (float v : x) want += (long double)v * v;
    EXPECT_NEAR(cpu::squared_norm(x.data(), n), double(want), 1e-13 * double(want)) << n;
  }
  EXPECT_EQ(cpu::squared_norm(nullptr, 0), 0.0);
}

// The documented formula, one element at a time, in the documented fp32 order.
void adamw_scalar(float& p, float g, float& m, float& v, const cpu::AdamWParams& hp, std::int64_t step,
                  float grad_scale) {
  const double bc1 = hp.bias_correction ? 1.0 - std::pow(double(hp.beta1), double(step)) : 1.0;
  const double bc2 =
      hp.bias_correction ? 1.0 / std::sqrt(1.0 - std::pow(double(hp.beta2), double(step))) : 1.0;
  g = g * grad_scale;
  if (!hp.adamw_mode && hp.weight_decay != 0) g = p * hp.weight_decay + g;
  m = hp.beta1 * m + (1.0f - hp.beta1) * g;
  v = hp.beta2 * v + (1.0f - hp.beta2) * (g * g);
  const float denom = std::sqrt(v) * float(bc2) + hp.eps;
  if (hp.adamw_mode && hp.weight_decay != 0) p = p + float(-double(hp.lr) * hp.weight_decay) * p;
  p = p + float(-double(hp.lr) / bc1) * (m / denom);
}

struct AdamWCase {
  bool adamw_mode, bias_correction;
  float weight_decay;
};

class AdamW : public ::testing::TestWithParam<AdamWCase> {
 protected:
  cpu::AdamWParams params() const {
    cpu::AdamWParams hp;
    hp.lr = 3e-3f;
    hp.beta1 = 0.9f;
    hp.beta2 = 0.95f;
    hp.eps = 1e-8f;
    hp.weight_decay = GetParam().weight_decay;
    hp.adamw_mode = GetParam().adamw_mode;
    hp.bias_correction = GetParam().bias_correction;
    return hp;
  }
};

TEST_P(AdamW, BitIdenticalToTheDocumentedFp32Formula) {
  const std::size_t n = 50001;
  auto p = random_floats(n, 10), m = random_floats(n, 11, 0.01f), v = random_floats(n, 12, 0.01f);
  for (auto& x : v) x = x * x;
  auto p_ref = p, m_ref = m, v_ref = v;
  std::vector<cpu::bf16_t> p_bf16(n);
  for (std::int64_t step = 1; step <= 3; ++step) {
    const auto g = random_floats(n, 20 + step);
    const float grad_scale = step == 2 ? 0.5f : 1.0f;
    cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), p_bf16.data(), n, params(), step, grad_scale);
    for (std::size_t i = 0; i < n; ++i)
      adamw_scalar(p_ref[i], g[i], m_ref[i], v_ref[i], params(), step, grad_scale);
  }
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(p[i]), std::bit_cast<std::uint32_t>(p_ref[i])) << i;
    ASSERT_EQ(std::bit_cast<std::uint32_t>(m[i]), std::bit_cast<std::uint32_t>(m_ref[i])) << i;
    ASSERT_EQ(std::bit_cast<std::uint32_t>(v[i]), std::bit_cast<std::uint32_t>(v_ref[i])) << i;
    ASSERT_EQ(p_bf16[i], cpu::f32_to_bf16(p[i])) << i;
  }
}

TEST_P(AdamW, UpdateMatchesFloat64Adam) {
  // p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p) (AdamW), or Adam with g += wd * p, in float64. The
  // fp32 update differs from it by a few fp32 ulps of the update.
  const std::size_t n = 20000;
  const cpu::AdamWParams hp = params();
  auto p = random_floats(n, 30), m = random_floats(n, 31, 0.01f), v = random_floats(n, 32, 0.01f);
  for (auto& x : v) x = x * x;
  const auto g = random_floats(n, 33);
  const std::int64_t step = 5;
  Vec want(n);
  for (std::size_t i = 0; i < n; ++i) {
    double gi = g[i];
    if (!hp.adamw_mode) gi += double(hp.weight_decay) * p[i];
    const double mi = hp.beta1 * double(m[i]) + (1.0 - hp.beta1) * gi;
    const double vi = hp.beta2 * double(v[i]) + (1.0 - hp.beta2) * gi * gi;
    const double bc1 = hp.bias_correction ? 1.0 - std::pow(double(hp.beta1), step) : 1.0;
    const double bc2 = hp.bias_correction ? 1.0 - std::pow(double(hp.beta2), step) : 1.0;
    double upd = (mi / bc1) / (std::sqrt(vi / bc2) + hp.eps);
    if (hp.adamw_mode) upd += double(hp.weight_decay) * p[i];
    want[i] = -double(hp.lr) * upd;  // the change of p
  }
  const auto p0 = p;
  cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), nullptr, n, hp, step);
  Vec got(n);
  for (std::size_t i = 0; i < n; ++i) got[i] = double(p[i]) - double(p0[i]);
  // The change is ~lr = 3e-3 on |p| ~ 1, so the fp32 rounding of p itself (6e-8) is ~2e-5 of it.
  EXPECT_LE(rel_l2(got, want), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Modes, AdamW,
                         ::testing::Values(AdamWCase{true, true, 0.1f}, AdamWCase{true, true, 0.0f},
                                           AdamWCase{false, true, 0.1f}, AdamWCase{true, false, 0.01f}),
                         [](const auto& info) {
                           const AdamWCase& c = info.param;
                           return std::string(c.adamw_mode ? "adamw" : "adam_l2") +
                                  (c.bias_correction ? "_bc" : "_nobc") +
                                  (c.weight_decay > 0 ? "_wd" : "_nowd");
                         });

TEST(RuntimeHelpers, AdamWRejectsStepZero) {
  float p = 1, g = 1, m = 0, v = 0;
  EXPECT_THROW(cpu::adamw_update(&p, &g, &m, &v, nullptr, 1, cpu::AdamWParams{}, 0), strata::Error);
}

}  // namespace
}  // namespace strata::kernels::test
