// kernels/cpu/attention_bf16.cpp: attention with bf16 operands, against the fp32 oracle (within bf16
// rounding, grouped-query heads included) and bit for bit across runs and thread counts.
#include <gtest/gtest.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "kernels/cpu/ops.h"
#include "tests/kernels/reference.h"

namespace strata::kernels::test {
namespace {

struct Shape {
  int B, T, NH, NKV, HD;
};
const Shape kShapes[] = {{2, 16, 4, 4, 8}, {1, 33, 4, 2, 16}, {2, 64, 6, 2, 32}};

struct Result {
  std::vector<float> out, att, dq, dk, dv;
};

Result run(const Shape& s, bool bf16, int threads) {
  const std::size_t nq = std::size_t(s.B) * s.T * s.NH * s.HD, nkv = std::size_t(s.B) * s.T * s.NKV * s.HD,
                    natt = std::size_t(s.B) * s.NH * s.T * s.T;
  const auto q = random_floats(nq, 1), k = random_floats(nkv, 2), v = random_floats(nkv, 3),
             dout = random_floats(nq, 4);
  Result r{std::vector<float>(nq), std::vector<float>(natt), std::vector<float>(nq), std::vector<float>(nkv),
           std::vector<float>(nkv)};
  std::vector<float> scratch(natt);
  tbb::global_control allow(tbb::global_control::max_allowed_parallelism, std::size_t(threads));
  tbb::task_arena arena(threads);
  arena.execute([&] {
    using Fwd = void (*)(float*, float*, const float*, const float*, const float*, int, int, int, int, int);
    using Bwd = void (*)(float*, float*, float*, float*, const float*, const float*, const float*,
                         const float*, const float*, int, int, int, int, int);
    const Fwd fwd = bf16 ? Fwd(cpu::attention_forward_bf16) : Fwd(cpu::attention_forward);
    const Bwd bwd = bf16 ? Bwd(cpu::attention_backward_bf16) : Bwd(cpu::attention_backward);
    fwd(r.out.data(), r.att.data(), q.data(), k.data(), v.data(), s.B, s.T, s.NH, s.NKV, s.HD);
    bwd(r.dq.data(), r.dk.data(), r.dv.data(), scratch.data(), dout.data(), q.data(), k.data(), v.data(),
        r.att.data(), s.B, s.T, s.NH, s.NKV, s.HD);
  });
  return r;
}

class AttentionBf16 : public ::testing::TestWithParam<Shape> {};

TEST_P(AttentionBf16, IsWithinBf16RoundingOfTheFp32Oracle) {
  const Shape s = GetParam();
  if (cpu::bf16_matmul_impl().empty()) GTEST_SKIP() << "no native bf16 matmul here: the fp32 attention runs";
  const Result b = run(s, true, 2), f = run(s, false, 2);
  for (auto [got, want, what] : {std::tuple{&b.out, &f.out, "out"},
                                 {&b.att, &f.att, "att"},
                                 {&b.dq, &f.dq, "dq"},
                                 {&b.dk, &f.dk, "dk"},
                                 {&b.dv, &f.dv, "dv"}}) {
    const double err = rel_l2(*got, *want);
    EXPECT_LT(err, 2e-2) << what;
    EXPECT_GT(err, 1e-7) << what << ": the operands were not rounded";
  }
}

TEST_P(AttentionBf16, BitIdenticalAcrossRunsAndThreadCounts) {
  const Shape s = GetParam();
  const Result a = run(s, true, 1), b = run(s, true, 1), c = run(s, true, 3);
  for (const Result* x : {&b, &c})
    for (auto [p, q] : {std::pair{&a.out, &x->out}, {&a.dq, &x->dq}, {&a.dk, &x->dk}, {&a.dv, &x->dv}})
      EXPECT_EQ(std::memcmp(p->data(), q->data(), p->size() * sizeof(float)), 0);
}

TEST_P(AttentionBf16, CausalMaskLeavesExactZeros) {
  const Shape s = GetParam();
  const Result r = run(s, true, 2);
  for (std::size_t blk = 0; blk < std::size_t(s.B) * s.NH; ++blk)
    for (int t = 0; t < s.T; ++t)
      for (int u = t + 1; u < s.T; ++u) ASSERT_EQ(r.att[blk * s.T * s.T + std::size_t(t) * s.T + u], 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionBf16, ::testing::ValuesIn(kShapes), [](const auto& info) {
  const Shape& s = info.param;
  char name[64];
  std::snprintf(name, sizeof name, "B%dT%dH%dKV%dD%d", s.B, s.T, s.NH, s.NKV, s.HD);
  return std::string(name);
});

}  // namespace
}  // namespace strata::kernels::test
