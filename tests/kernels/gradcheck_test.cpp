// Each CPU op: forward against a float64 re-implementation, backward against float64 central differences
// of that re-implementation.
//
// Tolerances. The ops compute in fp32, so their outputs carry relative round-off of about 1e-7..1e-6 on
// these small shapes (measured: 3e-8..1.5e-7). The central difference in float64 with h = 1e-6 has
// truncation error ~h^2 = 1e-12 and cancellation error ~1e-16 / h = 1e-10, far below that. Hence: forward
// relative L2 error <= 1e-6, backward <= 1e-5 (~10-100x above fp32 noise; a missing or wrong term gives
// errors of 1e-2 or more).
// Accumulating gradients are checked on buffers prefilled with random values; written ones on buffers
// prefilled with NaN, so a skipped element fails the bound.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernels/cpu/ops.h"
#include "tests/kernels/reference.h"

namespace strata::kernels::test {
namespace {

namespace cpu = strata::kernels::cpu;

constexpr double kForwardTol = 1e-6;
constexpr double kBackwardTol = 1e-5;
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// What an accumulating backward added to a buffer that held `before`.
Vec added(const std::vector<float>& after, const std::vector<float>& before) {
  Vec d(after.size());
  for (std::size_t i = 0; i < d.size(); ++i) d[i] = double(after[i]) - double(before[i]);
  return d;
}

TEST(GradCheck, Embedding) {
  const int N = 7, C = 5, V = 4;
  const std::vector<std::int32_t> tokens = {3, 0, 3, 1, 3, 0, 2};
  const auto wte = random_floats(std::size_t(V) * C, 1);
  std::vector<float> out(std::size_t(N) * C, kNaN);
  cpu::embedding_forward(out.data(), tokens.data(), wte.data(), N, C, V);
  auto f = [&](const std::vector<Vec>& in) {
    Vec o(std::size_t(N) * C);
    for (int i = 0; i < N; ++i)
      for (int c = 0; c < C; ++c) o[i * C + c] = in[0][tokens[i] * C + c];
    return o;
  };
  EXPECT_LE(rel_l2(out, f({to_double(wte)})), 0.0);  // a copy: exact

  const auto dout = random_floats(out.size(), 2);
  const auto base = random_floats(wte.size(), 3);
  auto dwte = base;
  cpu::embedding_backward(dwte.data(), dout.data(), tokens.data(), N, C, V);
  EXPECT_LE(rel_l2(added(dwte, base), fd_grad(f, {to_double(wte)}, 0, to_double(dout))), kBackwardTol);
}

TEST(GradCheck, RmsNorm) {
  const int N = 4, C = 16;
  const float eps = 1e-5f;
  const auto x = random_floats(std::size_t(N) * C, 10), w = random_floats(C, 11);
  std::vector<float> out(x.size(), kNaN), rstd(N, kNaN);
  cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  auto f = [&](const std::vector<Vec>& in) { return ref_rmsnorm(in[0], in[1], N, C, eps); };
  const std::vector<Vec> in = {to_double(x), to_double(w)};
  EXPECT_LE(rel_l2(out, f(in)), kForwardTol);

  const auto dout = random_floats(x.size(), 12);
  const auto dx0 = random_floats(x.size(), 13), dw0 = random_floats(w.size(), 14);
  auto dx = dx0, dw = dw0;
  cpu::rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
  EXPECT_LE(rel_l2(added(dx, dx0), fd_grad(f, in, 0, to_double(dout))), kBackwardTol);
  EXPECT_LE(rel_l2(added(dw, dw0), fd_grad(f, in, 1, to_double(dout))), kBackwardTol);
}

// Gemma's norm: out = x * rstd * (w + 1); dw is the gradient of the stored w.
TEST(GradCheck, RmsNormWithWeightOffset) {
  const int N = 4, C = 16;
  const float eps = 1e-6f, w_offset = 1.0f;
  const auto x = random_floats(std::size_t(N) * C, 15), w = random_floats(C, 16, 0.1f);
  std::vector<float> out(x.size(), kNaN), rstd(N, kNaN);
  cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps, w_offset);
  auto f = [&](const std::vector<Vec>& in) { return ref_rmsnorm(in[0], in[1], N, C, eps, w_offset); };
  const std::vector<Vec> in = {to_double(x), to_double(w)};
  EXPECT_LE(rel_l2(out, f(in)), kForwardTol);

  const auto dout = random_floats(x.size(), 17);
  const auto dx0 = random_floats(x.size(), 18), dw0 = random_floats(w.size(), 19);
  auto dx = dx0, dw = dw0;
  cpu::rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C, w_offset);
  EXPECT_LE(rel_l2(added(dx, dx0), fd_grad(f, in, 0, to_double(dout))), kBackwardTol);
  EXPECT_LE(rel_l2(added(dw, dw0), fd_grad(f, in, 1, to_double(dout))), kBackwardTol);
}

TEST(GradCheck, Linear) {
  const int N = 5, IC = 6, OC = 7;
  const auto x = random_floats(std::size_t(N) * IC, 20), w = random_floats(std::size_t(OC) * IC, 21);
  std::vector<float> out(std::size_t(N) * OC, kNaN);
  cpu::linear_forward(out.data(), x.data(), w.data(), N, IC, OC);
  auto f = [&](const std::vector<Vec>& in) { return ref_linear(in[0], in[1], N, IC, OC); };
  const std::vector<Vec> in = {to_double(x), to_double(w)};
  EXPECT_LE(rel_l2(out, f(in)), kForwardTol);

  const auto dout = random_floats(out.size(), 22);
  const auto dx0 = random_floats(x.size(), 23), dw0 = random_floats(w.size(), 24);
  auto dx = dx0, dw = dw0;
  cpu::linear_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), N, IC, OC);
  EXPECT_LE(rel_l2(added(dx, dx0), fd_grad(f, in, 0, to_double(dout))), kBackwardTol);
  EXPECT_LE(rel_l2(added(dw, dw0), fd_grad(f, in, 1, to_double(dout))), kBackwardTol);
}

TEST(GradCheck, RotaryEmbedding) {
  const int B = 2, T = 6, H = 3, HD = 8;
  const float theta = 10000.0f;
  const auto x = random_floats(std::size_t(B) * T * H * HD, 30);
  std::vector<float> cos(T * HD / 2), sin(T * HD / 2), out(x.size(), kNaN);
  cpu::rope_cache(cos.data(), sin.data(), T, HD, theta);
  cpu::rope_forward(out.data(), x.data(), cos.data(), sin.data(), B, T, H, HD);
  auto f = [&](const std::vector<Vec>& in) { return ref_rope(in[0], B, T, H, HD, theta); };
  EXPECT_LE(rel_l2(out, f({to_double(x)})), kForwardTol);

  const auto dout = random_floats(x.size(), 31);
  std::vector<float> dx(x.size(), kNaN);
  cpu::rope_backward(dx.data(), dout.data(), cos.data(), sin.data(), B, T, H, HD);
  EXPECT_LE(rel_l2(dx, fd_grad(f, {to_double(x)}, 0, to_double(dout))), kBackwardTol);
}

struct Heads {
  int nh, nkv;
};

class AttentionGradCheck : public ::testing::TestWithParam<Heads> {};

TEST_P(AttentionGradCheck, MatchesFloat64Reference) {
  const int B = 2, T = 5, HD = 4, NH = GetParam().nh, NKV = GetParam().nkv;
  const auto q = random_floats(std::size_t(B) * T * NH * HD, 40);
  const auto k = random_floats(std::size_t(B) * T * NKV * HD, 41);
  const auto v = random_floats(std::size_t(B) * T * NKV * HD, 42);
  std::vector<float> out(q.size(), kNaN), att(std::size_t(B) * NH * T * T, kNaN);
  cpu::attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), B, T, NH, NKV, HD);
  auto f = [&](const std::vector<Vec>& in) { return ref_attention(in[0], in[1], in[2], B, T, NH, NKV, HD); };
  const std::vector<Vec> in = {to_double(q), to_double(k), to_double(v)};
  EXPECT_LE(rel_l2(out, f(in)), kForwardTol);

  const auto dout = random_floats(q.size(), 43);
  std::vector<float> dq(q.size(), kNaN), dk(k.size(), kNaN), dv(v.size(), kNaN), scratch(att.size(), kNaN);
  cpu::attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), dout.data(), q.data(), k.data(),
                          v.data(), out.data(), att.data(), B, T, NH, NKV, HD);
  EXPECT_LE(rel_l2(dq, fd_grad(f, in, 0, to_double(dout))), kBackwardTol);
  EXPECT_LE(rel_l2(dk, fd_grad(f, in, 1, to_double(dout))), kBackwardTol);
  EXPECT_LE(rel_l2(dv, fd_grad(f, in, 2, to_double(dout))), kBackwardTol);
}

INSTANTIATE_TEST_SUITE_P(Heads, AttentionGradCheck, ::testing::Values(Heads{4, 4}, Heads{4, 2}, Heads{4, 1}),
                         [](const auto& info) {
                           return "nh" + std::to_string(info.param.nh) + "_nkv" +
                                  std::to_string(info.param.nkv);
                         });

TEST(GradCheck, SwiGlu) {
  const std::size_t n = 37;
  const auto gate = random_floats(n, 50, 2.0f), up = random_floats(n, 51);
  std::vector<float> out(n, kNaN);
  cpu::swiglu_forward(out.data(), gate.data(), up.data(), n);
  auto f = [&](const std::vector<Vec>& in) { return ref_swiglu(in[0], in[1]); };
  const std::vector<Vec> in = {to_double(gate), to_double(up)};
  EXPECT_LE(rel_l2(out, f(in)), kForwardTol);

  const auto dout = random_floats(n, 52);
  std::vector<float> dgate(n, kNaN), dup(n, kNaN);
  cpu::swiglu_backward(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), n);
  EXPECT_LE(rel_l2(dgate, fd_grad(f, in, 0, to_double(dout))), kBackwardTol);
  EXPECT_LE(rel_l2(dup, fd_grad(f, in, 1, to_double(dout))), kBackwardTol);
}

TEST(GradCheck, GeGlu) {
  const std::size_t n = 37;
  const auto gate = random_floats(n, 53, 2.0f), up = random_floats(n, 54);
  std::vector<float> out(n, kNaN);
  cpu::geglu_forward(out.data(), gate.data(), up.data(), n);
  auto f = [&](const std::vector<Vec>& in) { return ref_geglu(in[0], in[1]); };
  const std::vector<Vec> in = {to_double(gate), to_double(up)};
  EXPECT_LE(rel_l2(out, f(in)), kForwardTol);

  const auto dout = random_floats(n, 55);
  std::vector<float> dgate(n, kNaN), dup(n, kNaN);
  cpu::geglu_backward(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), n);
  EXPECT_LE(rel_l2(dgate, fd_grad(f, in, 0, to_double(dout))), kBackwardTol);
  EXPECT_LE(rel_l2(dup, fd_grad(f, in, 1, to_double(dout))), kBackwardTol);
}

// More columns than one of the CPU's 64-column tasks, the last one partial.
TEST(GradCheck, Bias) {
  const int N = 9, OC = 150;
  const auto x = random_floats(std::size_t(N) * OC, 56), b = random_floats(OC, 57);
  std::vector<float> out = x;
  cpu::bias_forward(out.data(), b.data(), N, OC);
  auto f = [&](const std::vector<Vec>& in) { return ref_bias(in[0], in[1], N, OC); };
  const std::vector<Vec> in = {to_double(x), to_double(b)};
  EXPECT_LE(rel_l2(out, f(in)), kForwardTol);

  const auto dout = random_floats(x.size(), 58), db0 = random_floats(OC, 59);
  auto db = db0;
  cpu::bias_backward(db.data(), dout.data(), N, OC);
  EXPECT_LE(rel_l2(added(db, db0), fd_grad(f, in, 1, to_double(dout))), kBackwardTol);
}

TEST(GradCheck, Residual) {
  const std::size_t n = 29;
  const auto a = random_floats(n, 60), b = random_floats(n, 61);
  std::vector<float> out(n, kNaN);
  cpu::residual_forward(out.data(), a.data(), b.data(), n);
  auto f = [&](const std::vector<Vec>& in) {
    Vec o(n);
    for (std::size_t i = 0; i < n; ++i) o[i] = in[0][i] + in[1][i];
    return o;
  };
  const std::vector<Vec> in = {to_double(a), to_double(b)};
  EXPECT_LE(rel_l2(out, f(in)), kForwardTol);

  const auto dout = random_floats(n, 62), da0 = random_floats(n, 63), db0 = random_floats(n, 64);
  auto da = da0, db = db0;
  cpu::residual_backward(da.data(), db.data(), dout.data(), n);
  EXPECT_LE(rel_l2(added(da, da0), fd_grad(f, in, 0, to_double(dout))), kBackwardTol);
  EXPECT_LE(rel_l2(added(db, db0), fd_grad(f, in, 1, to_double(dout))), kBackwardTol);
}

TEST(GradCheck, CrossEntropyWithIgnoredTargets) {
  const int N = 6, V = 7;
  const float grad_scale = 0.5f;
  const std::vector<std::int32_t> targets = {2, -1, 6, 0, -1, 2};
  const auto logits = random_floats(std::size_t(N) * V, 70, 3.0f);
  std::vector<float> dlogits(logits.size(), kNaN), losses(N, kNaN);
  const float loss = cpu::cross_entropy_forward_backward(dlogits.data(), losses.data(), logits.data(),
                                                         targets.data(), N, V, grad_scale);
  const double want = ref_cross_entropy(to_double(logits), targets, N, V);
  EXPECT_NEAR(loss, want, 1e-6 * std::abs(want));
  double mean = 0.0;
  for (int i = 0; i < N; ++i) mean += losses[i];
  EXPECT_NEAR(mean / 4, want, 1e-6 * std::abs(want));  // 4 targets are not ignored
  EXPECT_EQ(losses[1], 0.0f);

  auto f = [&](const std::vector<Vec>& in) {
    return Vec{grad_scale * ref_cross_entropy(in[0], targets, N, V)};
  };
  EXPECT_LE(rel_l2(dlogits, fd_grad(f, {to_double(logits)}, 0, Vec{1.0})), kBackwardTol);
  for (int j = 0; j < V; ++j) EXPECT_EQ(dlogits[1 * V + j], 0.0f) << "ignored row, column " << j;
}

}  // namespace
}  // namespace strata::kernels::test
