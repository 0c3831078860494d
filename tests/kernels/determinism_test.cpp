// Every CPU op gives bit-identical results whatever the oneTBB thread count, on shapes large enough that
// the work is split into many tasks. The ops built on OpenBLAS (linear, attention) are bit-identical at a
// fixed OpenBLAS thread count and agree to fp32 rounding across counts (Note [OpenBLAS determinism]).
#include <gtest/gtest.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cpu/ops.h"
#include "tests/kernels/reference.h"

namespace strata::kernels::test {
namespace {

namespace cpu = strata::kernels::cpu;

using Outputs = std::vector<std::vector<float>>;

struct OpCase {
  const char* name;
  std::function<Outputs()> run;  // fresh outputs from fixed inputs
};

// w_offset 0: Llama's norm; 1: Gemma's.
Outputs run_rmsnorm(float w_offset) {
  const int N = 96, C = 320;
  const auto x = random_floats(std::size_t(N) * C, 1), w = random_floats(C, 2),
             dout = random_floats(x.size(), 3);
  std::vector<float> out(x.size()), rstd(N), dx(x.size(), 0.0f), dw(C, 0.0f);
  cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f, w_offset);
  cpu::rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C, w_offset);
  return {out, rstd, dx, dw};
}

Outputs run_linear() {
  const int N = 128, IC = 256, OC = 192;
  const auto x = random_floats(std::size_t(N) * IC, 4), w = random_floats(std::size_t(OC) * IC, 5);
  const auto dout = random_floats(std::size_t(N) * OC, 6);
  std::vector<float> out(std::size_t(N) * OC), dx(x.size(), 0.0f), dw(w.size(), 0.0f);
  cpu::linear_forward(out.data(), x.data(), w.data(), N, IC, OC);
  cpu::linear_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), N, IC, OC);
  return {out, dx, dw};
}

Outputs run_embedding() {
  const int N = 512, C = 48, V = 37;
  std::vector<std::int32_t> tokens(N);
  for (int i = 0; i < N; ++i) tokens[i] = (i * 7919) % V;
  const auto wte = random_floats(std::size_t(V) * C, 7), dout = random_floats(std::size_t(N) * C, 8);
  std::vector<float> out(std::size_t(N) * C), dwte(wte.size(), 0.0f);
  cpu::embedding_forward(out.data(), tokens.data(), wte.data(), N, C, V);
  cpu::embedding_backward(dwte.data(), dout.data(), tokens.data(), N, C, V);
  return {out, dwte};
}

Outputs run_rope() {
  const int B = 2, T = 64, H = 6, HD = 32;
  const auto x = random_floats(std::size_t(B) * T * H * HD, 9);
  std::vector<float> cos(T * HD / 2), sin(T * HD / 2), out(x.size()), dx(x.size());
  cpu::rope_cache(cos.data(), sin.data(), T, HD, 500000.0f);
  cpu::rope_forward(out.data(), x.data(), cos.data(), sin.data(), B, T, H, HD);
  cpu::rope_backward(dx.data(), out.data(), cos.data(), sin.data(), B, T, H, HD);
  return {cos, sin, out, dx};
}

Outputs run_attention() {
  const int B = 2, T = 64, NH = 4, NKV = 2, HD = 16;
  const auto q = random_floats(std::size_t(B) * T * NH * HD, 10), dout = random_floats(q.size(), 11);
  const auto k = random_floats(std::size_t(B) * T * NKV * HD, 12), v = random_floats(k.size(), 13);
  std::vector<float> out(q.size()), att(std::size_t(B) * NH * T * T), scratch(att.size());
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
  cpu::attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), B, T, NH, NKV, HD);
  cpu::attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), dout.data(), q.data(), k.data(),
                          v.data(), out.data(), att.data(), B, T, NH, NKV, HD);
  return {out, att, dq, dk, dv};
}

Outputs run_elementwise() {
  const std::size_t n = 200003;
  const auto a = random_floats(n, 14), b = random_floats(n, 15), dout = random_floats(n, 16);
  std::vector<float> out(n), dgate(n), dup(n), res(n), da(n, 0.0f), db(n, 1.0f);
  cpu::swiglu_forward(out.data(), a.data(), b.data(), n);
  cpu::swiglu_backward(dgate.data(), dup.data(), dout.data(), a.data(), b.data(), n);
  cpu::residual_forward(res.data(), a.data(), b.data(), n);
  cpu::residual_backward(da.data(), db.data(), dout.data(), n);
  cpu::scale(res.data(), 0.37f, n);
  return {out, dgate, dup, res, da, db};
}

Outputs run_geglu_bias() {
  const std::size_t n = 200003;
  const auto a = random_floats(n, 22, 2.0f), b = random_floats(n, 23), dout = random_floats(n, 24);
  std::vector<float> out(n), dgate(n), dup(n);
  cpu::geglu_forward(out.data(), a.data(), b.data(), n);
  cpu::geglu_backward(dgate.data(), dup.data(), dout.data(), a.data(), b.data(), n);
  const int N = 1031, OC = 700;  // many row and column blocks
  const auto x = random_floats(std::size_t(N) * OC, 25), bias = random_floats(OC, 26);
  std::vector<float> y = x, db(OC, 0.5f);
  cpu::bias_forward(y.data(), bias.data(), N, OC);
  cpu::bias_backward(db.data(), x.data(), N, OC);
  return {out, dgate, dup, y, db};
}

Outputs run_cross_entropy() {
  const int N = 64, V = 1000;
  std::vector<std::int32_t> targets(N);
  for (int i = 0; i < N; ++i) targets[i] = i % 5 == 0 ? -1 : (i * 131) % V;
  const auto logits = random_floats(std::size_t(N) * V, 17, 4.0f);
  std::vector<float> dlogits(logits.size()), losses(N);
  const float loss = cpu::cross_entropy_forward_backward(dlogits.data(), losses.data(), logits.data(),
                                                         targets.data(), N, V, 1.0f);
  return {dlogits, losses, {loss}};
}

Outputs run_norm_and_adamw() {
  const std::size_t n = 300007;
  auto p = random_floats(n, 18), m = random_floats(n, 19, 0.1f), v = random_floats(n, 20, 0.1f);
  for (auto& x : v) x = x * x;
  const auto g = random_floats(n, 21);
  std::vector<cpu::bf16_t> pb(n);
  cpu::AdamWParams hp;
  hp.weight_decay = 0.1f;
  cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), pb.data(), n, hp, 7);
  std::vector<float> pbf(n);
  cpu::cast_bf16_to_f32(pbf.data(), pb.data(), n);
  const double norm = cpu::squared_norm(g.data(), n);
  float norm_bits[2];
  std::memcpy(norm_bits, &norm, sizeof(norm));
  return {p, m, v, pbf, {norm_bits[0], norm_bits[1]}};
}

// The mask is a function of (key, element index): any split of the elements gives the same bits.
Outputs run_dropout() {
  const std::size_t n = 200003;
  const auto x = random_floats(n, 27);
  std::vector<float> out(n);
  cpu::dropout(out.data(), x.data(), n, 0.3, 0x5eed);
  std::vector<cpu::bf16_t> xb(n), ob(n);
  cpu::cast_f32_to_bf16(xb.data(), x.data(), n);
  cpu::dropout(ob.data(), xb.data(), n, 0.3, 0x5eed);
  std::vector<float> outb(n);
  cpu::cast_bf16_to_f32(outb.data(), ob.data(), n);
  return {out, outb};
}

const std::vector<OpCase>& cases() {
  static const std::vector<OpCase> c = {
      {"rmsnorm", [] { return run_rmsnorm(0.0f); }},
      {"rmsnorm_weight_offset", [] { return run_rmsnorm(1.0f); }},
      {"linear", run_linear},
      {"embedding", run_embedding},
      {"rope", run_rope},
      {"attention", run_attention},
      {"swiglu_residual_scale", run_elementwise},
      {"geglu_bias", run_geglu_bias},
      {"cross_entropy", run_cross_entropy},
      {"squared_norm_adamw", run_norm_and_adamw},
      {"dropout", run_dropout},
  };
  return c;
}

// Runs op with `threads` oneTBB threads (more than the machine's cores is allowed: a 2-core machine
// still exercises 3- and 4-way splits) and, when blas is true, as many OpenBLAS threads.
Outputs run_with_threads(const std::function<Outputs()>& op, int threads, bool blas) {
  const int saved = cpu::blas_threads();
  if (blas) cpu::set_blas_threads(threads);
  tbb::global_control allow(tbb::global_control::max_allowed_parallelism, std::size_t(threads));
  tbb::task_arena arena(threads);
  Outputs out;
  arena.execute([&] { out = op(); });
  cpu::set_blas_threads(saved);
  return out;
}

bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class Determinism : public ::testing::TestWithParam<std::size_t> {};

TEST_P(Determinism, BitIdenticalAcrossThreadCounts) {
  const OpCase& op = cases()[GetParam()];
  const Outputs one = run_with_threads(op.run, 1, false);
  for (int threads : {2, 3, 4}) {
    const Outputs many = run_with_threads(op.run, threads, false);
    ASSERT_EQ(many.size(), one.size());
    for (std::size_t i = 0; i < one.size(); ++i)
      EXPECT_TRUE(bit_identical(one[i], many[i]))
          << op.name << " output " << i << " differs with " << threads << " threads";
  }
}

INSTANTIATE_TEST_SUITE_P(CpuOps, Determinism, ::testing::Range(std::size_t{0}, cases().size()),
                         [](const auto& info) { return std::string(cases()[info.param].name); });

class BlasDeterminism : public ::testing::TestWithParam<const char*> {
 protected:
  static std::function<Outputs()> op(const std::string& name) {
    return name == "linear" ? run_linear : run_attention;
  }
};

TEST_P(BlasDeterminism, BitIdenticalAtAFixedBlasThreadCount) {
  for (int threads : {1, 2}) {
    const Outputs first = run_with_threads(op(GetParam()), threads, true);
    const Outputs again = run_with_threads(op(GetParam()), threads, true);
    for (std::size_t i = 0; i < first.size(); ++i)
      EXPECT_TRUE(bit_identical(first[i], again[i])) << "output " << i << " with " << threads << " threads";
  }
}

TEST_P(BlasDeterminism, CloseAcrossBlasThreadCounts) {
  const Outputs one = run_with_threads(op(GetParam()), 1, true);
  const Outputs two = run_with_threads(op(GetParam()), 2, true);
  for (std::size_t i = 0; i < one.size(); ++i) EXPECT_LE(rel_l2(two[i], one[i]), 1e-6) << "output " << i;
}

INSTANTIATE_TEST_SUITE_P(CpuOps, BlasDeterminism, ::testing::Values("linear", "attention"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace strata::kernels::test
