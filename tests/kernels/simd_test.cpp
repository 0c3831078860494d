// kernels/cpu/simd_impl.h and the row passes built on it (Note [SIMD row passes]): exp_f32 against float64
// e^x in ulps, and the cross-entropy row and SwiGLU passes compiled for each SIMD target this CPU has —
// the same bits on every target, and within their bound of float64.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/ops_impl.h"
#include "kernels/cpu/simd_impl.h"
#include "tests/kernels/reference.h"

namespace strata::kernels::test {
namespace {

using cpu::impl::SimdTarget;

std::vector<SimdTarget> targets_here() {
  std::vector<SimdTarget> t = {SimdTarget::baseline};
  if (cpu::impl::simd_target() >= SimdTarget::avx2) t.push_back(SimdTarget::avx2);
  if (cpu::impl::simd_target() >= SimdTarget::avx512) t.push_back(SimdTarget::avx512);
  return t;
}

// The spacing of floats at |v|: one ulp.
double ulp(double v) {
  const float f = float(std::fabs(v));
  return double(std::nextafter(f, std::numeric_limits<float>::infinity())) - double(f);
}

TEST(SimdExp, IsWithinOneAndAHalfUlpOfExpOverTheNormalRange) {
  double worst = 0;
  for (int i = 0; i <= 200000; ++i) {
    const float x = -87.0f + 175.0f * float(i) / 200000.0f;  // [-87, 88]
    const double want = std::exp(double(x));
    worst = std::max(worst, std::fabs(double(cpu::impl::exp_f32(x)) - want) / ulp(want));
  }
  EXPECT_LE(worst, 1.5);
}

TEST(SimdExp, GivesZeroBelowTheNormalRangeAndKeepsNan) {
  EXPECT_EQ(cpu::impl::exp_f32(-88.0f), 0.0f);
  EXPECT_EQ(cpu::impl::exp_f32(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_TRUE(std::isnan(cpu::impl::exp_f32(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(cpu::impl::exp_f32(0.0f), 1.0f);
}

// One row of V logits (V not a multiple of the lanes) and its softmax gradient, on every target.
TEST(SimdRows, CrossEntropyRowIsTheSameOnEveryTargetAndWithinItsBound) {
  const int V = 1003, target = 17;
  const std::vector<float> logits = random_floats(V, 21, 4.0f);
  std::vector<float> first;
  double first_loss = 0;
  for (SimdTarget t : targets_here()) {
    std::vector<float> d(V);
    const double loss = cpu::impl::cross_entropy_row_on(t, d.data(), logits.data(), target, V, 0.5f);
    if (first.empty()) {
      first = d, first_loss = loss;
      // float64: loss = log sum e^l - l_target; d = 0.5 (softmax - onehot).
      double mx = -1e300, sum = 0;
      for (float l : logits) mx = std::max(mx, double(l));
      for (float l : logits) sum += std::exp(double(l) - mx);
      EXPECT_NEAR(loss, std::log(sum) + mx - logits[target], 1e-5);
      for (int j = 0; j < V; ++j) {
        const double p = std::exp(double(logits[j]) - mx) / sum;
        const double want = 0.5 * (p - (j == target ? 1.0 : 0.0));
        // e^(l - max) carries the rounding of l - max in fp32 (|l - max| <= 8 here: 5e-7 relative) and
        // exp_f32's 1.5 ulp; then the scaling and the subtraction round once each.
        EXPECT_NEAR(d[j], want, 2e-6 * 0.5 * p + 4 * ulp(want) + 1e-30) << j;
      }
      continue;
    }
    EXPECT_EQ(loss, first_loss) << "target " << int(t);
    EXPECT_EQ(0, std::memcmp(d.data(), first.data(), V * sizeof(float))) << "target " << int(t);
  }
}

TEST(SimdRows, SwigluIsTheSameOnEveryTargetAndWithinItsBound) {
  const std::size_t n = 1003;
  const auto g = random_floats(n, 22, 6.0f), u = random_floats(n, 23), dout = random_floats(n, 24);
  std::vector<float> out0, dg0, du0;
  for (SimdTarget t : targets_here()) {
    std::vector<float> out(n), dg(n), du(n);
    cpu::impl::swiglu_forward_on(t, out.data(), g.data(), u.data(), n);
    cpu::impl::swiglu_backward_on(t, dg.data(), du.data(), dout.data(), g.data(), u.data(), n);
    if (out0.empty()) {
      out0 = out, dg0 = dg, du0 = du;
      for (std::size_t i = 0; i < n; ++i) {
        const double z = g[i], s = 1.0 / (1.0 + std::exp(-z));
        EXPECT_NEAR(out[i], z * s * u[i], 8 * ulp(z * s * u[i]) + 1e-30) << i;
        const double dgi = dout[i] * u[i] * s * (1 + z * (1 - s)), dui = dout[i] * z * s;
        EXPECT_NEAR(dg[i], dgi, 1e-5 * (std::fabs(dout[i] * u[i]) + 1)) << i;
        EXPECT_NEAR(du[i], dui, 8 * ulp(dui) + 1e-30) << i;
      }
      continue;
    }
    EXPECT_EQ(0, std::memcmp(out.data(), out0.data(), n * 4)) << "target " << int(t);
    EXPECT_EQ(0, std::memcmp(dg.data(), dg0.data(), n * 4)) << "target " << int(t);
    EXPECT_EQ(0, std::memcmp(du.data(), du0.data(), n * 4)) << "target " << int(t);
  }
}

}  // namespace
}  // namespace strata::kernels::test
