// The calling contracts ops.h states: aliasing that is allowed, optional outputs, rejected inputs, and the
// Hugging Face rotary convention on hand-computed values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "tests/kernels/reference.h"

namespace strata::kernels::test {
namespace {

namespace cpu = strata::kernels::cpu;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Contract, RotaryFollowsHuggingFaceRotateHalf) {
  // HD = 4, theta = 10000: inv_freq = {1, 0.01}; at position 1 the angles are {1, 0.01}. rotate_half
  // pairs element i with element i + HD/2 (not with its neighbour).
  const int T = 2, HD = 4;
  std::vector<float> cos(T * HD / 2), sin(T * HD / 2);
  cpu::rope_cache(cos.data(), sin.data(), T, HD, 10000.0f);
  const std::vector<float> x = {1, 2, 3, 4, 1, 2, 3, 4};  // (B=1, T=2, H=1, HD=4)
  std::vector<float> out(x.size());
  cpu::rope_forward(out.data(), x.data(), cos.data(), sin.data(), 1, T, 1, HD);
  const double c1 = std::cos(1.0), s1 = std::sin(1.0), c2 = std::cos(0.01), s2 = std::sin(0.01);
  const double want[8] = {1, 2, 3, 4, 1 * c1 - 3 * s1, 2 * c2 - 4 * s2, 3 * c1 + 1 * s1, 4 * c2 + 2 * s2};
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(out[i], want[i], 1e-6) << i;
}

TEST(Contract, RotaryInPlaceEqualsOutOfPlace) {
  const int B = 2, T = 9, H = 3, HD = 16;
  std::vector<float> cos(T * HD / 2), sin(T * HD / 2);
  cpu::rope_cache(cos.data(), sin.data(), T, HD, 10000.0f);
  const auto x = random_floats(std::size_t(B) * T * H * HD, 1);
  std::vector<float> out(x.size()), in_place = x, dx(x.size()), dx_in_place = x;
  cpu::rope_forward(out.data(), x.data(), cos.data(), sin.data(), B, T, H, HD);
  cpu::rope_forward(in_place.data(), in_place.data(), cos.data(), sin.data(), B, T, H, HD);
  EXPECT_TRUE(same_bits(out, in_place));
  cpu::rope_backward(dx.data(), x.data(), cos.data(), sin.data(), B, T, H, HD);
  cpu::rope_backward(dx_in_place.data(), dx_in_place.data(), cos.data(), sin.data(), B, T, H, HD);
  EXPECT_TRUE(same_bits(dx, dx_in_place));
}

TEST(Contract, CrossEntropyGradientMayOverwriteLogits) {
  const int N = 12, V = 301;
  std::vector<std::int32_t> targets(N);
  for (int i = 0; i < N; ++i) targets[i] = i == 3 ? -1 : (i * 37) % V;
  const auto logits = random_floats(std::size_t(N) * V, 2, 3.0f);
  std::vector<float> dlogits(logits.size()), aliased = logits;
  const float a = cpu::cross_entropy_forward_backward(dlogits.data(), nullptr, logits.data(), targets.data(),
                                                      N, V, 0.25f);
  const float b = cpu::cross_entropy_forward_backward(aliased.data(), nullptr, aliased.data(), targets.data(),
                                                      N, V, 0.25f);
  EXPECT_EQ(a, b);
  EXPECT_TRUE(same_bits(dlogits, aliased));
  const float forward_only =
      cpu::cross_entropy_forward_backward(nullptr, nullptr, logits.data(), targets.data(), N, V, 0.25f);
  EXPECT_EQ(a, forward_only);
}

TEST(Contract, CrossEntropyWithEveryTargetIgnoredIsZero) {
  const int N = 3, V = 5;
  const std::vector<std::int32_t> targets(N, -1);
  const auto logits = random_floats(std::size_t(N) * V, 3);
  std::vector<float> dlogits(logits.size(), 1.0f);
  EXPECT_EQ(
      cpu::cross_entropy_forward_backward(dlogits.data(), nullptr, logits.data(), targets.data(), N, V, 1.0f),
      0.0f);
  for (float d : dlogits) EXPECT_EQ(d, 0.0f);
}

TEST(Contract, LinearBackwardWithoutInputGradientGivesTheSameWeightGradient) {
  const int N = 6, IC = 5, OC = 4;
  const auto x = random_floats(std::size_t(N) * IC, 4), w = random_floats(std::size_t(OC) * IC, 5);
  const auto dout = random_floats(std::size_t(N) * OC, 6);
  std::vector<float> dx(x.size(), 0.0f), dw_a(w.size(), 0.0f), dw_b(w.size(), 0.0f);
  cpu::linear_backward(dx.data(), dw_a.data(), dout.data(), x.data(), w.data(), N, IC, OC);
  cpu::linear_backward(nullptr, dw_b.data(), dout.data(), x.data(), w.data(), N, IC, OC);
  EXPECT_TRUE(same_bits(dw_a, dw_b));
}

TEST(Contract, ResidualBackwardSkipsANullGradient) {
  const std::size_t n = 10;
  const auto dout = random_floats(n, 7);
  std::vector<float> da(n, 1.0f);
  cpu::residual_backward(da.data(), nullptr, dout.data(), n);
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(da[i], 1.0f + dout[i]);
}

TEST(Contract, GegluBackwardInPlaceEqualsSeparateOutputs) {
  const std::size_t n = 1001;
  const auto gate = random_floats(n, 8, 2.0f), up = random_floats(n, 9), dout = random_floats(n, 10);
  std::vector<float> dgate(n), dup(n), g = gate, u = up;
  cpu::geglu_backward(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), n);
  cpu::geglu_backward(g.data(), u.data(), dout.data(), g.data(), u.data(), n);
  EXPECT_TRUE(same_bits(dgate, g));
  EXPECT_TRUE(same_bits(dup, u));
}

// PyTorch's F.gelu(z, approximate="tanh") at a few points (values from its definition in float64).
TEST(Contract, GegluIsGeluWithTheTanhApproximation) {
  const std::vector<float> gate = {-3.0f, -1.0f, 0.0f, 0.5f, 1.0f, 2.0f}, up(gate.size(), 1.0f);
  const double want[] = {-0.0036373920817729943, -0.15880800939172324, 0.0,
                         0.34571400982514394,    0.8411919906082768,   1.954597694087775};
  std::vector<float> out(gate.size());
  cpu::geglu_forward(out.data(), gate.data(), up.data(), gate.size());
  for (std::size_t i = 0; i < gate.size(); ++i)
    EXPECT_NEAR(out[i], want[i], 1e-6) << "gelu(" << gate[i] << ")";
}

// Gemma's offset is a shift of the stored weight: w_offset 1 on w gives the bits of w_offset 0 on
// fp32(w + 1), forward and backward (dw, the gradient of the stored w, is the same either way).
TEST(Contract, RmsnormWeightOffsetEqualsTheShiftedWeight) {
  const int N = 7, C = 96;
  const auto x = random_floats(std::size_t(N) * C, 11), w = random_floats(C, 12, 0.1f),
             dout = random_floats(x.size(), 13);
  std::vector<float> w1(C);
  for (int c = 0; c < C; ++c) w1[c] = w[c] + 1.0f;
  std::vector<float> out_a(x.size()), out_b(x.size()), rstd_a(N), rstd_b(N);
  cpu::rmsnorm_forward(out_a.data(), rstd_a.data(), x.data(), w.data(), N, C, 1e-6f, 1.0f);
  cpu::rmsnorm_forward(out_b.data(), rstd_b.data(), x.data(), w1.data(), N, C, 1e-6f, 0.0f);
  EXPECT_TRUE(same_bits(out_a, out_b));
  EXPECT_TRUE(same_bits(rstd_a, rstd_b));
  std::vector<float> dx_a(x.size(), 0.0f), dx_b(x.size(), 0.0f), dw_a(C, 0.0f), dw_b(C, 0.0f);
  cpu::rmsnorm_backward(dx_a.data(), dw_a.data(), dout.data(), x.data(), w.data(), rstd_a.data(), N, C, 1.0f);
  cpu::rmsnorm_backward(dx_b.data(), dw_b.data(), dout.data(), x.data(), w1.data(), rstd_b.data(), N, C,
                        0.0f);
  EXPECT_TRUE(same_bits(dx_a, dx_b));
  EXPECT_TRUE(same_bits(dw_a, dw_b));
}

TEST(Contract, OutOfRangeTokensAndTargetsAreRejected) {
  const int N = 2, C = 3, V = 4;
  const std::vector<std::int32_t> bad = {1, 4};
  std::vector<float> wte(V * C, 0.0f), out(N * C), logits(N * V, 0.0f);
  EXPECT_THROW(cpu::embedding_forward(out.data(), bad.data(), wte.data(), N, C, V), strata::Error);
  EXPECT_THROW(cpu::embedding_backward(wte.data(), out.data(), bad.data(), N, C, V), strata::Error);
  const std::vector<std::int32_t> negative = {-1, 0};
  EXPECT_THROW(cpu::embedding_forward(out.data(), negative.data(), wte.data(), N, C, V), strata::Error);
  EXPECT_THROW(cpu::cross_entropy_forward_backward(nullptr, nullptr, logits.data(), bad.data(), N, V, 1.0f),
               strata::Error);
}

TEST(Contract, AttentionRejectsHeadsNotAMultipleOfKvHeads) {
  std::vector<float> buf(1024, 0.0f);
  EXPECT_THROW(
      cpu::attention_forward(buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), 1, 2, 3, 2, 4),
      strata::Error);
}

TEST(Contract, BlasThreadsCanBeSetAndRead) {
  const int saved = cpu::blas_threads();
  cpu::set_blas_threads(1);
  EXPECT_EQ(cpu::blas_threads(), 1);
  cpu::set_blas_threads(saved);
  EXPECT_EQ(cpu::blas_threads(), saved);
  EXPECT_THROW(cpu::set_blas_threads(0), strata::Error);
}

}  // namespace
}  // namespace strata::kernels::test
