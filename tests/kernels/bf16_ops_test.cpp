// kernels/cpu's ops on bf16 activations (bf16_ops.cpp): each row and elementwise op is, bit for bit, the
// fp32 op on its inputs widened to fp32 with every bf16 output rounded once, on sizes that cross the ops'
// blocks, and bit-identical across oneTBB thread counts. Attention on bf16 tensors is the fused one
// (attention_fused_test.cpp).
#include <gtest/gtest.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/ops.h"
#include "tests/kernels/reference.h"

namespace strata::kernels::test {
namespace {

namespace cpu = strata::kernels::cpu;
using cpu::bf16_t;
using Bits = std::vector<bf16_t>;
using Floats = std::vector<float>;
using Outputs = std::vector<Floats>;  // every output, bf16 ones widened to fp32 (exact)

Floats widen(const Bits& b) {
  return from_bf16(b);
}
// What a bf16 output holds: each value rounded once.
Floats rounded(const Floats& v) {
  return widen(to_bf16(v));
}
Bits random_bf16(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  return to_bf16(random_floats(n, seed, scale));
}

template <typename Fn>
auto with_threads(int threads, Fn&& fn) {
  tbb::global_control allow(tbb::global_control::max_allowed_parallelism, std::size_t(threads));
  tbb::task_arena arena(threads);
  return arena.execute(fn);
}

// "" when a and b hold the same bits, else which output differs.
std::string first_difference(const Outputs& a, const Outputs& b) {
  if (a.size() != b.size()) return "the output count";
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
      return "output " + std::to_string(i);
  return "";
}

// An op (or a forward and its backward) on bf16 tensors, and the reference: the fp32 op on the widened
// inputs, bf16 outputs rounded.
struct OpCase {
  const char* name;
  std::function<Outputs()> bf16, reference;
};

OpCase embedding_case() {
  const int N = 1000, C = 48, V = 37;
  std::vector<std::int32_t> tok(N);
  for (int i = 0; i < N; ++i) tok[i] = (i * 7919) % V;
  const Bits wte = random_bf16(std::size_t(V) * C, 1), dout = random_bf16(std::size_t(N) * C, 2);
  const Floats dwte0 = random_floats(wte.size(), 3);
  return {"Embedding",
          [=] {
            Bits out(std::size_t(N) * C);
            Floats dwte = dwte0;
            cpu::embedding_forward(out.data(), tok.data(), wte.data(), N, C, V);
            cpu::embedding_backward(dwte.data(), dout.data(), tok.data(), N, C, V);
            return Outputs{widen(out), dwte};
          },
          [=] {
            Floats out(std::size_t(N) * C), dwte = dwte0;
            cpu::embedding_forward(out.data(), tok.data(), widen(wte).data(), N, C, V);
            cpu::embedding_backward(dwte.data(), widen(dout).data(), tok.data(), N, C, V);
            return Outputs{rounded(out), dwte};
          }};
}

// Rows of width C: 51 rows to a block at C = 320, 64 at C = 32 (Qwen3's per-head norm), in pieces of 8.
OpCase rmsnorm_case(const char* name, int N, int C, float w_offset) {
  const std::size_t n = std::size_t(N) * C;
  const Bits x = random_bf16(n, 4), w = random_bf16(std::size_t(C), 5, 0.5f), dout = random_bf16(n, 6),
             dx0 = random_bf16(n, 7);
  const Floats dw0 = random_floats(std::size_t(C), 8);
  return {name,
          [=] {
            Bits out(n), dx = dx0;
            Floats rstd(static_cast<std::size_t>(N)), dw = dw0;
            cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f, w_offset);
            cpu::rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C,
                                  w_offset);
            return Outputs{widen(out), rstd, widen(dx), dw};
          },
          [=] {
            const Floats xf = widen(x), wf = widen(w);
            Floats out(n), rstd(static_cast<std::size_t>(N)), dx = widen(dx0), dw = dw0;
            cpu::rmsnorm_forward(out.data(), rstd.data(), xf.data(), wf.data(), N, C, 1e-5f, w_offset);
            cpu::rmsnorm_backward(dx.data(), dw.data(), widen(dout).data(), xf.data(), wf.data(), rstd.data(),
                                  N, C, w_offset);
            return Outputs{rounded(out), rstd, rounded(dx), dw};
          }};
}

OpCase bias_case() {
  const int N = 300, OC = 200;  // 81 rows to a block; columns in blocks of 64 and a tail
  const Bits x = random_bf16(std::size_t(N) * OC, 9), b = random_bf16(std::size_t(OC), 10),
             dout = random_bf16(x.size(), 11);
  const Floats db0 = random_floats(std::size_t(OC), 12);
  return {"Bias",
          [=] {
            Bits out = x;
            Floats db = db0;
            cpu::bias_forward(out.data(), b.data(), N, OC);
            cpu::bias_backward(db.data(), dout.data(), N, OC);
            return Outputs{widen(out), db};
          },
          [=] {
            Floats out = widen(x), db = db0;
            cpu::bias_forward(out.data(), widen(b).data(), N, OC);
            cpu::bias_backward(db.data(), widen(dout).data(), N, OC);
            return Outputs{rounded(out), db};
          }};
}

// 64 positions to a block (H * HD = 64) and sequences of 100: blocks end inside and at a sequence's end.
// The backward runs in place (dx = dout), as the model runs it.
OpCase rope_case() {
  const int B = 2, T = 100, H = 4, HD = 16;
  const std::size_t n = std::size_t(B) * T * H * HD;
  Floats cos(std::size_t(T) * HD / 2), sin(cos.size());
  cpu::rope_cache(cos.data(), sin.data(), T, HD, 10000.0f);
  const Bits x = random_bf16(n, 13), dout = random_bf16(n, 14);
  return {"Rope",
          [=] {
            Bits out(n), d = dout;
            cpu::rope_forward(out.data(), x.data(), cos.data(), sin.data(), B, T, H, HD);
            cpu::rope_backward(d.data(), d.data(), cos.data(), sin.data(), B, T, H, HD);
            return Outputs{widen(out), widen(d)};
          },
          [=] {
            Floats out(n), dx(n);
            cpu::rope_forward(out.data(), widen(x).data(), cos.data(), sin.data(), B, T, H, HD);
            cpu::rope_backward(dx.data(), widen(dout).data(), cos.data(), sin.data(), B, T, H, HD);
            return Outputs{rounded(out), rounded(dx)};
          }};
}

using GluFwd = void (*)(float*, const float*, const float*, std::size_t);
using GluBwd = void (*)(float*, float*, const float*, const float*, const float*, std::size_t);
using GluFwd16 = void (*)(bf16_t*, const bf16_t*, const bf16_t*, std::size_t);
using GluBwd16 = void (*)(bf16_t*, bf16_t*, const bf16_t*, const bf16_t*, const bf16_t*, std::size_t);

// 10 blocks of 4096 and a tail. The backward runs in place over gate and up, as the model runs it.
OpCase glu_case(const char* name, GluFwd16 fwd16, GluBwd16 bwd16, GluFwd fwd, GluBwd bwd) {
  const std::size_t n = 40037;
  const Bits g = random_bf16(n, 15, 2.0f), u = random_bf16(n, 16), d = random_bf16(n, 17);
  return {name,
          [=] {
            Bits out(n), dg = g, du = u;
            fwd16(out.data(), g.data(), u.data(), n);
            bwd16(dg.data(), du.data(), d.data(), dg.data(), du.data(), n);
            return Outputs{widen(out), widen(dg), widen(du)};
          },
          [=] {
            const Floats gf = widen(g), uf = widen(u);
            Floats out(n), dg(n), du(n);
            fwd(out.data(), gf.data(), uf.data(), n);
            bwd(dg.data(), du.data(), widen(d).data(), gf.data(), uf.data(), n);
            return Outputs{rounded(out), rounded(dg), rounded(du)};
          }};
}

OpCase residual_case() {
  const std::size_t n = 40037;
  const Bits a = random_bf16(n, 18), b = random_bf16(n, 19), d = random_bf16(n, 20), da0 = random_bf16(n, 21),
             db0 = random_bf16(n, 22);
  return {"Residual",
          [=] {
            Bits out(n), da = da0, db = db0, da_only = da0;
            cpu::residual_forward(out.data(), a.data(), b.data(), n);
            cpu::residual_backward(da.data(), db.data(), d.data(), n);
            cpu::residual_backward(da_only.data(), nullptr, d.data(), n);
            return Outputs{widen(out), widen(da), widen(db), widen(da_only)};
          },
          [=] {
            const Floats df = widen(d);
            Floats out(n), da = widen(da0), db = widen(db0);
            cpu::residual_forward(out.data(), widen(a).data(), widen(b).data(), n);
            cpu::residual_backward(da.data(), db.data(), df.data(), n);
            return Outputs{rounded(out), rounded(da), rounded(db), rounded(da)};
          }};
}

OpCase scale_case() {
  const std::size_t n = 40037;
  const Bits x = random_bf16(n, 23, 3.0f);
  const float s = std::sqrt(2048.0f);
  return {"Scale",
          [=] {
            Bits y = x;
            cpu::scale(y.data(), s, n);
            return Outputs{widen(y)};
          },
          [=] {
            Floats y = widen(x);
            cpu::scale(y.data(), s, n);
            return Outputs{rounded(y)};
          }};
}

// Ignored targets among the rows; the gradient written over the logits (the alias the model uses), and
// the loss alone (no gradient).
OpCase cross_entropy_case() {
  const int N = 40, V = 1500;
  const Bits logits = random_bf16(std::size_t(N) * V, 24, 2.0f);
  std::vector<std::int32_t> tgt(N);
  for (int i = 0; i < N; ++i) tgt[i] = i % 7 == 3 ? -1 : (i * 131) % V;
  return {"CrossEntropy",
          [=] {
            Bits l = logits;
            Floats losses(N), losses_only(N);
            const float mean_only = cpu::cross_entropy_forward_backward(nullptr, losses_only.data(), l.data(),
                                                                        tgt.data(), N, V, 0.5f);
            const float mean = cpu::cross_entropy_forward_backward(l.data(), losses.data(), l.data(),
                                                                   tgt.data(), N, V, 0.5f);
            return Outputs{widen(l), losses, {mean}, losses_only, {mean_only}};
          },
          [=] {
            const Floats lf = widen(logits);
            Floats dl(lf.size()), losses(N);
            const float mean = cpu::cross_entropy_forward_backward(dl.data(), losses.data(), lf.data(),
                                                                   tgt.data(), N, V, 0.5f);
            return Outputs{rounded(dl), losses, {mean}, losses, {mean}};
          }};
}

std::vector<OpCase> cases() {
  return {embedding_case(),
          rmsnorm_case("Rmsnorm", 130, 320, 0.0f),
          rmsnorm_case("RmsnormWithOffset", 130, 320, 1.0f),
          rmsnorm_case("PerHeadRmsnorm", 300, 32, 0.0f),
          bias_case(),
          rope_case(),
          glu_case("Swiglu", cpu::swiglu_forward, cpu::swiglu_backward, cpu::swiglu_forward,
                   cpu::swiglu_backward),
          glu_case("Geglu", cpu::geglu_forward, cpu::geglu_backward, cpu::geglu_forward, cpu::geglu_backward),
          residual_case(),
          scale_case(),
          cross_entropy_case()};
}

class Bf16Ops : public ::testing::TestWithParam<OpCase> {};

TEST_P(Bf16Ops, IsTheFp32OpOnWidenedInputsRoundedOnce) {
  EXPECT_EQ(first_difference(GetParam().bf16(), GetParam().reference()), "")
      << "differs from the fp32 op's result, rounded";
}

TEST_P(Bf16Ops, BitIdenticalAcrossThreadCounts) {
  const Outputs one = with_threads(1, GetParam().bf16);
  for (int threads : {2, 3})
    EXPECT_EQ(first_difference(with_threads(threads, GetParam().bf16), one), "")
        << "at " << threads << " threads, against 1";
}

INSTANTIATE_TEST_SUITE_P(Ops, Bf16Ops, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<OpCase>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace strata::kernels::test
