// kernels/cpu/attention_fused.cpp: the fused bf16 attention against the fp32 oracle (kc::attention_forward
// and attention_backward on the same bf16 inputs, widened), element by element within a bound derived from
// its bf16 rounding points; bit for bit across oneTBB thread counts and across the backward's scratch
// budgets (its waves); exactly the buffers its size functions name. Each behaviour runs with oneDNN's
// products (where native here) and with the loops a build without oneDNN runs, causal and in sliding
// windows (the oracle with the same window; attention_window_test.cpp has the windows against float64).
#include "kernels/cpu/attention_fused.h"

#include <gtest/gtest.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cpu/ops.h"
#include "tests/kernels/reference.h"

namespace strata::kernels::test {
namespace {

namespace kc = kernels::cpu;
using kc::bf16_t;
using kc::FusedPaths;
using kc::FusedProducts;
using kc::FusedRows;

struct Shape {
  int B, T, NH, NKV, HD;
  int window = 0;  // 0: causal
  std::size_t nq() const { return std::size_t(B) * T * NH * HD; }
  std::size_t nkv() const { return std::size_t(B) * T * NKV * HD; }
};
void PrintTo(const Shape& s, std::ostream* os) {
  *os << "B" << s.B << " T" << s.T << " NH" << s.NH << " NKV" << s.NKV << " HD" << s.HD << " window"
      << s.window;
}
// T crosses the 128-row blocks: 1 row, short blocks, exactly one, one and two past it, two and a tail.
// Windows: one inside a block; two crossing the blocks, so that whole key blocks are skipped and the band's
// edge cuts others (150: query block 2 starts in key block 0, whose keys its rows from 21 on see none of);
// window 1; one as long as T.
const Shape kShapes[] = {{2, 1, 4, 2, 16},       {2, 17, 4, 4, 32},      {2, 100, 4, 1, 16},
                         {2, 128, 4, 2, 64},     {1, 129, 4, 4, 32},     {2, 130, 4, 2, 64},
                         {1, 257, 4, 2, 32},     {2, 100, 4, 1, 16, 17}, {1, 300, 2, 1, 32, 150},
                         {1, 300, 2, 1, 16, 40}, {1, 130, 2, 1, 16, 1},  {2, 17, 4, 4, 32, 17}};

std::vector<float> to_f32(const std::vector<bf16_t>& x) {
  std::vector<float> r(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) r[i] = kc::bf16_to_f32(x[i]);
  return r;
}

// The inputs in bf16 (the fused attention's) and widened exactly (the oracle's): the same values.
struct Inputs {
  std::vector<bf16_t> q, k, v, dout;
  std::vector<float> qf, kf, vf, doutf;
  explicit Inputs(const Shape& s)
      : q(to_bf16(random_floats(s.nq(), 1))),
        k(to_bf16(random_floats(s.nkv(), 2))),
        v(to_bf16(random_floats(s.nkv(), 3))),
        dout(to_bf16(random_floats(s.nq(), 4))),
        qf(to_f32(q)),
        kf(to_f32(k)),
        vf(to_f32(v)),
        doutf(to_f32(dout)) {}
};

// Every buffer the fused attention writes, each followed by kGuard elements; all of it starts as a NaN
// pattern that no finite result has, so "written" and "untouched" can both be read off afterwards.
constexpr std::size_t kGuard = 64;
constexpr bf16_t kSentinel16 = 0xffff;
constexpr std::uint32_t kSentinel32 = 0xffffffffu;

struct Fused {
  std::size_t n_saved, n_scratch;
  std::vector<bf16_t> out, dq, dk, dv;
  std::vector<float> saved, scratch;
  std::vector<float> saved_after_forward;
};

std::vector<float> sentinel_floats(std::size_t n) {
  std::vector<float> v(n);
  std::memset(v.data(), 0xff, n * sizeof(float));
  return v;
}

Fused run_fused(const Shape& s, const Inputs& in, const FusedPaths& paths, int threads) {
  Fused f;
  f.n_saved = kc::attention_fused_saved(s.B, s.T, s.NH, s.HD);
  f.n_scratch = kc::attention_fused_scratch(s.B, s.T, s.NKV, s.HD, paths.scratch_elements);
  f.out.assign(s.nq() + kGuard, kSentinel16);
  f.dq.assign(s.nq() + kGuard, kSentinel16);
  f.dk.assign(s.nkv() + kGuard, kSentinel16);
  f.dv.assign(s.nkv() + kGuard, kSentinel16);
  f.saved = sentinel_floats(f.n_saved + kGuard);
  f.scratch = sentinel_floats(f.n_scratch + kGuard);
  tbb::global_control allow(tbb::global_control::max_allowed_parallelism, std::size_t(threads));
  tbb::task_arena arena(threads);
  arena.execute([&] {
    kc::attention_fused_forward(f.out.data(), f.saved.data(), in.q.data(), in.k.data(), in.v.data(), s.B, s.T,
                                s.NH, s.NKV, s.HD, s.window, nullptr, paths);
    f.saved_after_forward = f.saved;
    kc::attention_fused_backward(f.dq.data(), f.dk.data(), f.dv.data(), f.scratch.data(), in.dout.data(),
                                 in.q.data(), in.k.data(), in.v.data(), f.out.data(), f.saved.data(), s.B,
                                 s.T, s.NH, s.NKV, s.HD, s.window, nullptr, paths);
  });
  return f;
}

// The fp32 oracle: its probabilities P (B,NH,T,T) and score gradients dS (its scratch, scaled by
// 1/sqrt(HD)) feed the bounds.
struct Oracle {
  std::vector<float> out, p, dq, dk, dv, ds;
};

Oracle run_oracle(const Shape& s, const Inputs& in) {
  const std::size_t natt = std::size_t(s.B) * s.NH * s.T * s.T;
  Oracle o{std::vector<float>(s.nq()),  std::vector<float>(natt),    std::vector<float>(s.nq()),
           std::vector<float>(s.nkv()), std::vector<float>(s.nkv()), std::vector<float>(natt)};
  kc::attention_forward(o.out.data(), o.p.data(), in.qf.data(), in.kf.data(), in.vf.data(), s.B, s.T, s.NH,
                        s.NKV, s.HD, s.window);
  kc::attention_backward(o.dq.data(), o.dk.data(), o.dv.data(), o.ds.data(), in.doutf.data(), in.qf.data(),
                         in.kf.data(), in.vf.data(), o.out.data(), o.p.data(), s.B, s.T, s.NH, s.NKV, s.HD,
                         s.window);
  return o;
}

// Per-element error bounds from the fused attention's rounding points (Note [Fused attention on the CPU]),
// with u = 2^-8 the unit roundoff of bf16 (8 significant bits, round to nearest): a value rounded to bf16
// moves by at most u times itself. Each output is an fp32 sum of terms whose bf16 operand (P or dS) was
// rounded once, then the sum is rounded once, so
//   |out - out*| <= u (sum_s P_ts |v_s| + |out|)
//   |dv - dv*|   <= u (sum_h sum_t P_ts |dout_t| + |dv|)
//   |dq - dq*|   <= sum_s (u |dS_ts| + P_ts dD_t / sqrt(HD)) |k_s| + u |dq|
//   |dk - dk*|   <= sum_h sum_t (u |dS_ts| + P_ts dD_t / sqrt(HD)) |q_t| + u |dk|
// where dD_t = u sum_e |dout_te| (sum_s P_ts |v_se| + |out_te|) is the error of D = rowsum(dout * out)
// computed from the rounded out (the oracle's D is exact up to fp32). Everything else — fp32 sums in
// another order, fp32 e^x — is ~1e-6 relative, which the factor 1.25 covers with room. Sums over s run
// over every s <= t: the oracle's P and dS are exact zeros outside a sliding window.
constexpr double kU = 1.0 / 256.0;
constexpr double kSlack = 1.25;

struct Bounds {
  std::vector<double> out, dq, dk, dv;
};

Bounds bounds(const Shape& s, const Inputs& in, const Oracle& o) {
  Bounds bd{std::vector<double>(s.nq()), std::vector<double>(s.nq()), std::vector<double>(s.nkv()),
            std::vector<double>(s.nkv())};
  const double scale = 1.0 / std::sqrt(double(s.HD));
  const int G = s.NH / s.NKV;
  const auto qi = [&](int b, int t, int h) { return (std::size_t(b * s.T + t) * s.NH + h) * s.HD; };
  const auto ki = [&](int b, int t, int g) { return (std::size_t(b * s.T + t) * s.NKV + g) * s.HD; };
  const auto ai = [&](int b, int h, int t) { return (std::size_t(b * s.NH + h) * s.T + t) * s.T; };
  std::vector<double> mag_out(s.nq()), dD(std::size_t(s.B) * s.NH * s.T);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < s.T; ++t) {
        const int g = h / G;
        double d = 0.0;
        for (int e = 0; e < s.HD; ++e) {
          double m = 0.0;
          for (int u = 0; u <= t; ++u) m += o.p[ai(b, h, t) + u] * std::fabs(in.vf[ki(b, u, g) + e]);
          const double out = std::fabs(o.out[qi(b, t, h) + e]);
          mag_out[qi(b, t, h) + e] = m;
          bd.out[qi(b, t, h) + e] = kU * (m + out);
          d += std::fabs(in.doutf[qi(b, t, h) + e]) * (m + out);
        }
        dD[std::size_t(b * s.NH + h) * s.T + t] = kU * d;
      }
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < s.T; ++t) {
        const int g = h / G;
        const double dd = dD[std::size_t(b * s.NH + h) * s.T + t];
        for (int u = 0; u <= t; ++u) {
          const double p = o.p[ai(b, h, t) + u];
          const double w = kU * std::fabs(o.ds[ai(b, h, t) + u]) + p * dd * scale;  // dS's error
          for (int e = 0; e < s.HD; ++e) {
            bd.dv[ki(b, u, g) + e] += kU * p * std::fabs(in.doutf[qi(b, t, h) + e]);
            bd.dq[qi(b, t, h) + e] += w * std::fabs(in.kf[ki(b, u, g) + e]);
            bd.dk[ki(b, u, g) + e] += w * std::fabs(in.qf[qi(b, t, h) + e]);
          }
        }
      }
  for (auto [bv, ref] : {std::pair{&bd.out, &o.out}, {&bd.dq, &o.dq}, {&bd.dk, &o.dk}, {&bd.dv, &o.dv}})
    for (std::size_t i = 0; i < bv->size(); ++i) (*bv)[i] = kSlack * ((*bv)[i] + kU * std::fabs((*ref)[i]));
  return bd;
}

void expect_within(const char* what, const std::vector<bf16_t>& got, const std::vector<float>& want,
                   const std::vector<double>& bound) {
  int bad = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(double(kc::bf16_to_f32(got[i])) - double(want[i]));
    if (!(err <= bound[i]) && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: " << kc::bf16_to_f32(got[i]) << " vs the oracle's " << want[i]
                    << ", bound " << bound[i];
    if (bound[i] > 0.0) worst = std::max(worst, err / bound[i]);
  }
  EXPECT_EQ(bad, 0) << what << ": elements outside the bound";
  ::testing::Test::RecordProperty(std::string(what) + "_worst_err_over_bound", std::to_string(worst));
}

using Param = std::tuple<Shape, FusedProducts>;
class AttentionFused : public ::testing::TestWithParam<Param> {};

TEST_P(AttentionFused, IsWithinBf16RoundingOfTheFp32Oracle) {
  const auto [s, products] = GetParam();
  const Inputs in(s);
  const Fused f = run_fused(s, in, {products}, 2);
  const Oracle o = run_oracle(s, in);
  const Bounds bd = bounds(s, in, o);
  expect_within("out", f.out, o.out, bd.out);
  expect_within("dq", f.dq, o.dq, bd.dq);
  expect_within("dk", f.dk, o.dk, bd.dk);
  expect_within("dv", f.dv, o.dv, bd.dv);
}

void expect_same_bits(const Fused& a, const Fused& b) {
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.dq, b.dq);
  EXPECT_EQ(a.dk, b.dk);
  EXPECT_EQ(a.dv, b.dv);
  EXPECT_EQ(std::memcmp(a.saved.data(), b.saved.data(), a.saved.size() * sizeof(float)), 0);
}

TEST_P(AttentionFused, BitIdenticalAcrossThreadCounts) {
  const auto [s, products] = GetParam();
  const Inputs in(s);
  expect_same_bits(run_fused(s, in, {products}, 1), run_fused(s, in, {products}, 2));
}

// Each row-pass target this CPU runs gives the baseline's bits, so a run does not depend on the machine.
TEST_P(AttentionFused, BitIdenticalAcrossRowTargets) {
  const auto [s, products] = GetParam();
  const Inputs in(s);
  const Fused base = run_fused(s, in, {products, FusedRows::baseline}, 2);
  std::string ran;
  for (FusedRows rows : {FusedRows::avx2, FusedRows::avx512}) {
    if (kc::attention_fused_rows(rows) != rows) continue;  // this CPU lacks it
    SCOPED_TRACE(rows == FusedRows::avx2 ? "avx2" : "avx512");
    expect_same_bits(run_fused(s, in, {products, rows}, 2), base);
    ran += rows == FusedRows::avx2 ? " avx2" : " avx512";
  }
  if (ran.empty()) GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512: only the baseline row passes run";
  ::testing::Test::RecordProperty("row_targets", ran);
}

// The size functions name what the functions touch: every element written (no NaN pattern left), nothing
// past the end, and the backward leaves saved as the forward left it.
TEST_P(AttentionFused, TouchesExactlyTheBuffersItsSizesName) {
  const auto [s, products] = GetParam();
  const Inputs in(s);
  const Fused f = run_fused(s, in, {products}, 2);
  const auto sentinel = [](float x) {
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    return u == kSentinel32;
  };
  for (std::size_t i = 0; i < f.n_saved; ++i)
    ASSERT_FALSE(sentinel(f.saved[i])) << "saved[" << i << "] unwritten";
  for (std::size_t i = 0; i < f.n_scratch; ++i)
    ASSERT_FALSE(sentinel(f.scratch[i])) << "scratch[" << i << "] unwritten";
  for (std::size_t i = 0; i < kGuard; ++i) {
    EXPECT_TRUE(sentinel(f.saved[f.n_saved + i])) << "written past saved";
    EXPECT_TRUE(sentinel(f.scratch[f.n_scratch + i])) << "written past scratch";
    EXPECT_EQ(f.out[s.nq() + i], kSentinel16) << "written past out";
    EXPECT_EQ(f.dq[s.nq() + i], kSentinel16) << "written past dq";
    EXPECT_EQ(f.dk[s.nkv() + i], kSentinel16) << "written past dk";
    EXPECT_EQ(f.dv[s.nkv() + i], kSentinel16) << "written past dv";
  }
  for (const auto* x : {&f.out, &f.dq})
    EXPECT_EQ(std::count(x->begin(), x->begin() + s.nq(), kSentinel16), 0);
  for (const auto* x : {&f.dk, &f.dv})
    EXPECT_EQ(std::count(x->begin(), x->begin() + s.nkv(), kSentinel16), 0);
  EXPECT_EQ(std::memcmp(f.saved.data(), f.saved_after_forward.data(), f.saved.size() * sizeof(float)), 0)
      << "the backward wrote to saved";
}

std::string name(const ::testing::TestParamInfo<Param>& info) {
  const auto& [s, products] = info.param;
  char buf[96];
  const std::string window = s.window > 0 ? "W" + std::to_string(s.window) : "";
  std::snprintf(buf, sizeof buf, "B%dT%dH%dKV%dD%d%s_%s", s.B, s.T, s.NH, s.NKV, s.HD, window.c_str(),
                products == FusedProducts::best ? "best" : "loops");
  return buf;
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionFused,
                         ::testing::Combine(::testing::ValuesIn(kShapes),
                                            ::testing::Values(FusedProducts::best, FusedProducts::loops)),
                         name);

// One position: each query sees only key 0 with probability exactly 1, so out is v itself and dv the fp32
// sum of the group's dout rows in head order, rounded once — bit for bit, whichever products run.
TEST(AttentionFusedOneRow, OutIsVAndDvSumsTheGroup) {
  const Shape s{2, 1, 4, 2, 16};
  const Inputs in(s);
  for (FusedProducts products : {FusedProducts::best, FusedProducts::loops}) {
    const Fused f = run_fused(s, in, {products}, 2);
    const int G = s.NH / s.NKV;
    for (int b = 0; b < s.B; ++b)
      for (int h = 0; h < s.NH; ++h)
        for (int e = 0; e < s.HD; ++e)
          ASSERT_EQ(f.out[(b * s.NH + h) * s.HD + e], in.v[(b * s.NKV + h / G) * s.HD + e]);
    for (int b = 0; b < s.B; ++b)
      for (int g = 0; g < s.NKV; ++g)
        for (int e = 0; e < s.HD; ++e) {
          float sum = 0.0f;
          for (int h = g * G; h < (g + 1) * G; ++h) sum += in.doutf[(b * s.NH + h) * s.HD + e];
          ASSERT_EQ(f.dv[(b * s.NKV + g) * s.HD + e], kc::f32_to_bf16(sum));
        }
  }
}

// ---- the backward's waves (Note [Fused attention on the CPU]) -------------------------------------------

// The backward's dq, dk, dv from the forward's out and saved, with the scratch budget `budget` (0: the
// default) and exactly the scratch attention_fused_scratch names for it.
struct Grads {
  std::size_t n_scratch;
  std::vector<bf16_t> dq, dk, dv;
};

Grads run_backward(const Shape& s, const Inputs& in, const std::vector<bf16_t>& out,
                   const std::vector<float>& saved, const std::int32_t* pos, std::size_t budget) {
  FusedPaths paths;
  paths.scratch_elements = budget;
  Grads g{kc::attention_fused_scratch(s.B, s.T, s.NKV, s.HD, budget), std::vector<bf16_t>(s.nq()),
          std::vector<bf16_t>(s.nkv()), std::vector<bf16_t>(s.nkv())};
  std::vector<float> scratch = sentinel_floats(g.n_scratch);
  tbb::task_arena arena(2);
  arena.execute([&] {
    kc::attention_fused_backward(g.dq.data(), g.dk.data(), g.dv.data(), scratch.data(), in.dout.data(),
                                 in.q.data(), in.k.data(), in.v.data(), out.data(), saved.data(), s.B, s.T,
                                 s.NH, s.NKV, s.HD, s.window, pos, paths);
  });
  return g;
}

// A budget of one task's sums runs the nine (batch, key/value head) tasks one at a time; one of two tasks'
// sums, in waves of two with a short last wave; the default, all nine at once. A task's arithmetic does
// not depend on its slot or wave, so dq, dk and dv are the same bits — causal, and in a sliding window
// over packed documents (Note [Document masks] in ops.h).
TEST(AttentionFusedWaves, BitIdenticalWhateverTheScratchBudget) {
  Shape s{3, 200, 6, 3, 32};
  const std::size_t tasks = std::size_t(s.B) * s.NKV, per_task = 2 * std::size_t(s.T) * s.HD;
  ASSERT_EQ(tasks % 2, 1u);
  // Row b's documents start at 0, 70 + 20 b and 150: query blocks that see several of them.
  std::vector<std::int32_t> documents(std::size_t(s.B) * s.T);
  for (int b = 0; b < s.B; ++b)
    for (int t = 0, start = 0; t < s.T; ++t) {
      if (t == 70 + 20 * b || t == 150) start = t;
      documents[std::size_t(b) * s.T + t] = t - start;
    }
  const Inputs in(s);
  for (const auto& [window, pos] :
       {std::pair<int, const std::int32_t*>{0, nullptr}, {40, documents.data()}}) {
    SCOPED_TRACE(pos ? "window 40, documents" : "causal");
    s.window = window;
    std::vector<bf16_t> out(s.nq());
    std::vector<float> saved(kc::attention_fused_saved(s.B, s.T, s.NH, s.HD));
    kc::attention_fused_forward(out.data(), saved.data(), in.q.data(), in.k.data(), in.v.data(), s.B, s.T,
                                s.NH, s.NKV, s.HD, s.window, pos);
    const Grads all = run_backward(s, in, out, saved, pos, 0);
    EXPECT_EQ(all.n_scratch, tasks * per_task) << "the default budget holds every task here";
    for (std::size_t slots : {1, 2}) {
      SCOPED_TRACE(std::to_string(slots) + " slots");
      const Grads g = run_backward(s, in, out, saved, pos, slots * per_task);
      EXPECT_EQ(g.n_scratch, slots * per_task);
      EXPECT_EQ(g.dq, all.dq);
      EXPECT_EQ(g.dk, all.dk);
      EXPECT_EQ(g.dv, all.dv);
    }
  }
}

// The scratch a budget gives: whole tasks' sums, at least one task's, at most every task's; the default
// budget holds 4 tasks of T 32768 at HD 64, whatever B*NKV beyond that.
TEST(AttentionFusedWaves, ScratchHoldsTheTasksItsBudgetAllows) {
  const std::size_t per_task = 2 * std::size_t(32768) * 64;
  EXPECT_EQ(kc::attention_fused_scratch(1, 32768, 12, 64), 4 * per_task);
  EXPECT_EQ(kc::attention_fused_scratch(4, 32768, 12, 64), kc::kFusedScratchElements);
  EXPECT_EQ(kc::attention_fused_scratch(1, 32768, 12, 64, 1), per_task) << "below one task: one slot";
  EXPECT_EQ(kc::attention_fused_scratch(1, 32768, 12, 64, 3 * per_task - 1), 2 * per_task);
  EXPECT_EQ(kc::attention_fused_scratch(2, 1024, 4, 64), 8 * 2 * std::size_t(1024) * 64) << "all 8 tasks";
  EXPECT_EQ(kc::attention_fused_scratch(0, 1024, 4, 64), 0u);
  EXPECT_EQ(kc::attention_fused_saved(2, 1024, 8, 64), std::size_t(2) * 8 * 1024) << "the lse alone";
}

}  // namespace
}  // namespace strata::kernels::test
