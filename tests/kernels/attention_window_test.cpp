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

#include "tests/kernels/attention_band.h"

namespace strata::kernels::test {
namespace {

using namespace band;
constexpr unsigned kSeed = 61;

class Fp32Window : public ::testing::TestWithParam<int> {};

TEST_P(Fp32Window, MatchesFloat64) {
  const Shape s{2, 9, 4, 2, 4};
  const Inputs in(s, kSeed);
  expect_matches_float64(s, in, run_fp32(s, in, GetParam()), GetParam(), nullptr, 1e-6, 1e-5);
}

// Inside T (3, 5), each query alone (1), exactly T (9) and past it (20).
INSTANTIATE_TEST_SUITE_P(Windows, Fp32Window, ::testing::Values(1, 3, 5, 9, 20),
                         [](const auto& info) { return "window" + std::to_string(info.param); });

// (Window 1, where dq and dk are zero, is OfOneSeesOnlyItself's: a relative error to zero says nothing.)
TEST(FusedWindow, MatchesFloat64WithinOneBlock) {
  const Shape s{1, 20, 2, 1, 8};
  const Inputs in(s, kSeed);
  for (int w : {3, 6, 20}) {
    SCOPED_TRACE("window " + std::to_string(w));
    expect_matches_float64(s, in, run_fused(s, in, w), w, nullptr, 1e-2, 3e-2);
  }
}

// T 300 in 128-key blocks: window 40 skips key block 0 for query blocks 1 and 2 and cuts their first key
// block; window 150 starts query block 2 at block 0 (key 107), half of it masked.
TEST(FusedWindow, ForwardMatchesFloat64AcrossBlocks) {
  const Shape s{1, 300, 2, 1, 16};
  const Inputs in(s, kSeed);
  for (int w : {40, 150}) {
    SCOPED_TRACE("window " + std::to_string(w));
    expect_matches_float64(s, in, run_fused(s, in, w), w, nullptr, 1e-2, 0);
  }
}

TEST(Window, NoShorterThanTheSequenceIsCausalBitForBit) {
  for (const Shape& s : {Shape{2, 9, 4, 2, 4}, Shape{1, 130, 4, 2, 16}}) {
    SCOPED_TRACE("T " + std::to_string(s.T));
    const Inputs in(s, kSeed);
    expect_same_bits(run_fp32(s, in, s.T), run_fp32(s, in, 0));
    expect_same_bits(run_fp32(s, in, s.T + 7), run_fp32(s, in, 0));
    expect_same_bits(run_fused(s, in, s.T), run_fused(s, in, 0));
    expect_same_bits(run_fused(s, in, s.T + 7), run_fused(s, in, 0));
  }
}

TEST(Window, OfOneSeesOnlyItself) {
  const Shape s{2, 130, 4, 2, 16};
  const Inputs in(s, kSeed);
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
