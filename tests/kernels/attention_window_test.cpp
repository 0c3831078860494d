// Sliding-window attention on the CPU (kernels/cpu/ops.h: query t attends to keys t - w < s <= t), the
// fp32 oracle (attention.cpp) and the fused bf16 attention (attention_fused.cpp), against the float64
// reference with the same window (reference.h's ref_attention, transformers' mask):
//   - fp32, forward within 1e-6 and backward within 1e-5 of float64 central differences (gradcheck_test's
//     bounds), for windows inside T, 1, T itself and past it;
//   - bf16 fused, forward within 1e-2 of float64 (its bf16 rounding) where the window skips whole 128-key
//     blocks and cuts others, and backward within 3e-2 of float64 central differences (the fused backward
//     against the fp32 oracle element by element, at every block shape: attention_fused_test.cpp);
//   - a window no shorter than T is causal attention, bit for bit, forward and backward, on both;
//   - window 1: each query sees itself alone, so out = v of its group and dv sums the group's dout, exactly,
//     and dq = dk = 0 (exactly in fp32; in the fused bf16 within the rounding of D = rowsum(dout * out)
//     against the products' dP, which it then cancels).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/attention_fused.h"
#include "kernels/cpu/ops.h"
#include "tests/kernels/reference.h"

namespace strata::kernels::test {
namespace {

namespace kc = kernels::cpu;
using kc::bf16_t;

const float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Shape {
  int B, T, NH, NKV, HD;
  std::size_t nq() const { return std::size_t(B) * T * NH * HD; }
  std::size_t nkv() const { return std::size_t(B) * T * NKV * HD; }
  std::size_t natt() const { return std::size_t(B) * NH * T * T; }
};

// Everything one attention computes, widened to float.
struct Result {
  std::vector<float> out, dq, dk, dv;
};

struct Inputs {
  std::vector<float> q, k, v, dout;  // fp32 values, each exactly a bf16 value (both paths see the same)
  explicit Inputs(const Shape& s)
      : q(from_bf16(to_bf16(random_floats(s.nq(), 61)))),
        k(from_bf16(to_bf16(random_floats(s.nkv(), 62)))),
        v(from_bf16(to_bf16(random_floats(s.nkv(), 63)))),
        dout(from_bf16(to_bf16(random_floats(s.nq(), 64)))) {}
};

Result run_fp32(const Shape& s, const Inputs& in, int window) {
  Result r{std::vector<float>(s.nq(), kNaN), std::vector<float>(s.nq(), kNaN),
           std::vector<float>(s.nkv(), kNaN), std::vector<float>(s.nkv(), kNaN)};
  std::vector<float> att(s.natt(), kNaN), scratch(s.natt(), kNaN);
  kc::attention_forward(r.out.data(), att.data(), in.q.data(), in.k.data(), in.v.data(), s.B, s.T, s.NH,
                        s.NKV, s.HD, window);
  kc::attention_backward(r.dq.data(), r.dk.data(), r.dv.data(), scratch.data(), in.dout.data(), in.q.data(),
                         in.k.data(), in.v.data(), att.data(), s.B, s.T, s.NH, s.NKV, s.HD, window);
  return r;
}

Result run_fused(const Shape& s, const Inputs& in, int window) {
  const std::vector<bf16_t> q = to_bf16(in.q), k = to_bf16(in.k), v = to_bf16(in.v), dout = to_bf16(in.dout);
  std::vector<bf16_t> out(s.nq()), dq(s.nq()), dk(s.nkv()), dv(s.nkv());
  std::vector<float> saved(kc::attention_fused_saved(s.B, s.T, s.NH, s.HD));
  std::vector<float> scratch(kc::attention_fused_scratch(s.B, s.T, s.NKV, s.HD));
  kc::attention_fused_forward(out.data(), saved.data(), q.data(), k.data(), v.data(), s.B, s.T, s.NH, s.NKV,
                              s.HD, window);
  kc::attention_fused_backward(dq.data(), dk.data(), dv.data(), scratch.data(), dout.data(), q.data(),
                               k.data(), v.data(), saved.data(), s.B, s.T, s.NH, s.NKV, s.HD, window);
  return {from_bf16(out), from_bf16(dq), from_bf16(dk), from_bf16(dv)};
}

void expect_same_bits(const Result& a, const Result& b) {
  for (auto [x, y, what] : {std::tuple{&a.out, &b.out, "out"},
                            {&a.dq, &b.dq, "dq"},
                            {&a.dk, &b.dk, "dk"},
                            {&a.dv, &b.dv, "dv"}}) {
    ASSERT_EQ(x->size(), y->size()) << what;
    EXPECT_EQ(std::memcmp(x->data(), y->data(), x->size() * sizeof(float)), 0) << what;
  }
}

// Forward against float64; backward against float64 central differences of it.
void expect_matches_float64(const Shape& s, const Inputs& in, const Result& r, int window, double fwd_tol,
                            double bwd_tol) {
  auto f = [&](const std::vector<Vec>& x) {
    return ref_attention(x[0], x[1], x[2], s.B, s.T, s.NH, s.NKV, s.HD, window);
  };
  const std::vector<Vec> x = {to_double(in.q), to_double(in.k), to_double(in.v)};
  EXPECT_LE(rel_l2(r.out, f(x)), fwd_tol) << "out";
  if (bwd_tol <= 0) return;
  const Vec dout = to_double(in.dout);
  EXPECT_LE(rel_l2(r.dq, fd_grad(f, x, 0, dout)), bwd_tol) << "dq";
  EXPECT_LE(rel_l2(r.dk, fd_grad(f, x, 1, dout)), bwd_tol) << "dk";
  EXPECT_LE(rel_l2(r.dv, fd_grad(f, x, 2, dout)), bwd_tol) << "dv";
}

class Fp32Window : public ::testing::TestWithParam<int> {};

TEST_P(Fp32Window, MatchesFloat64) {
  const Shape s{2, 9, 4, 2, 4};
  const Inputs in(s);
  expect_matches_float64(s, in, run_fp32(s, in, GetParam()), GetParam(), 1e-6, 1e-5);
}

// Inside T (3, 5), each query alone (1), exactly T (9) and past it (20).
INSTANTIATE_TEST_SUITE_P(Windows, Fp32Window, ::testing::Values(1, 3, 5, 9, 20),
                         [](const auto& info) { return "window" + std::to_string(info.param); });

// (Window 1, where dq and dk are zero, is OfOneSeesOnlyItself's: a relative error to zero says nothing.)
TEST(FusedWindow, MatchesFloat64WithinOneBlock) {
  const Shape s{1, 20, 2, 1, 8};
  const Inputs in(s);
  for (int w : {3, 6, 20}) {
    SCOPED_TRACE("window " + std::to_string(w));
    expect_matches_float64(s, in, run_fused(s, in, w), w, 1e-2, 3e-2);
  }
}

// T 300 in 128-key blocks: window 40 skips key block 0 for query blocks 1 and 2 and cuts their first key
// block; window 150 starts query block 2 at block 0 (key 107), half of it masked.
TEST(FusedWindow, ForwardMatchesFloat64AcrossBlocks) {
  const Shape s{1, 300, 2, 1, 16};
  const Inputs in(s);
  for (int w : {40, 150}) {
    SCOPED_TRACE("window " + std::to_string(w));
    expect_matches_float64(s, in, run_fused(s, in, w), w, 1e-2, 0);
  }
}

TEST(Window, NoShorterThanTheSequenceIsCausalBitForBit) {
  for (const Shape& s : {Shape{2, 9, 4, 2, 4}, Shape{1, 130, 4, 2, 16}}) {
    SCOPED_TRACE("T " + std::to_string(s.T));
    const Inputs in(s);
    expect_same_bits(run_fp32(s, in, s.T), run_fp32(s, in, 0));
    expect_same_bits(run_fp32(s, in, s.T + 7), run_fp32(s, in, 0));
    expect_same_bits(run_fused(s, in, s.T), run_fused(s, in, 0));
    expect_same_bits(run_fused(s, in, s.T + 7), run_fused(s, in, 0));
  }
}

TEST(Window, OfOneSeesOnlyItself) {
  const Shape s{2, 130, 4, 2, 16};
  const Inputs in(s);
  const int G = s.NH / s.NKV;
  for (const bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "fused bf16" : "fp32");
    const Result r = fused ? run_fused(s, in, 1) : run_fp32(s, in, 1);
    const float zero = fused ? 1e-5f : 0.0f;  // |dq|, |dk| at most
    for (int b = 0; b < s.B; ++b)
      for (int t = 0; t < s.T; ++t)
        for (int h = 0; h < s.NH; ++h)
          for (int e = 0; e < s.HD; ++e) {
            const std::size_t qi = ((std::size_t(b) * s.T + t) * s.NH + h) * s.HD + e;
            const std::size_t ki = ((std::size_t(b) * s.T + t) * s.NKV + h / G) * s.HD + e;
            ASSERT_EQ(r.out[qi], in.v[ki]) << "out, t " << t;
            ASSERT_LE(std::fabs(r.dq[qi]), zero) << "dq, t " << t;
          }
    for (int b = 0; b < s.B; ++b)
      for (int t = 0; t < s.T; ++t)
        for (int g = 0; g < s.NKV; ++g)
          for (int e = 0; e < s.HD; ++e) {
            const std::size_t ki = ((std::size_t(b) * s.T + t) * s.NKV + g) * s.HD + e;
            float sum = 0.0f;  // the group's heads in order, as both sum them
            for (int h = g * G; h < (g + 1) * G; ++h)
              sum += in.dout[((std::size_t(b) * s.T + t) * s.NH + h) * s.HD + e];
            ASSERT_LE(std::fabs(r.dk[ki]), zero) << "dk, t " << t;
            ASSERT_EQ(r.dv[ki], fused ? kc::bf16_to_f32(kc::f32_to_bf16(sum)) : sum) << "dv, t " << t;
          }
  }
}

}  // namespace
}  // namespace strata::kernels::test
