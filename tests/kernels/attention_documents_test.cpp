// Packed documents on the CPU (kernels/cpu/ops.h, Note [Document masks]): per-token positions cut each
// query's keys at its document's start and restart the rotary positions. Against the float64 references
// with transformers' definitions (reference.h: ref_packed_sequences is find_packed_sequence_indices, the
// mask its packed_sequence_mask_function, ref_rope with position_ids):
//   - fp32 attention, forward within 1e-6 and backward within 1e-5 of float64 central differences, with
//     documents alone and with a sliding window as well;
//   - bf16 fused attention, forward within 1e-2 of float64 and backward within 3e-2 of its central
//     differences inside one 128-key block; forward across blocks where documents skip and cut them;
//   - one document per row (positions 0..T-1) is attention without positions, bit for bit, on both;
//   - rope with positions, fp32 and bf16, against float64 with position_ids; positions t are rope without
//     positions, bit for bit.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "tests/kernels/attention_band.h"

namespace strata::kernels::test {
namespace {

using namespace band;
constexpr unsigned kSeed = 71;

// Positions of rows made of documents of the given lengths, one list per row (each summing to T).
Positions packed(const std::vector<std::vector<int>>& rows) {
  Positions pos;
  for (const auto& docs : rows)
    for (int n : docs)
      for (int p = 0; p < n; ++p) pos.push_back(p);
  return pos;
}

Positions one_document(const Shape& s) {
  Positions pos;
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < s.T; ++t) pos.push_back(t);
  return pos;
}

// Two rows of 9: three documents (one of a single token), and two.
const Shape kSmall{2, 9, 4, 2, 4};
const Positions kSmallDocs = packed({{4, 1, 4}, {6, 3}});

TEST(DocumentsFp32, MatchFloat64) {
  const Inputs in(kSmall, kSeed);
  expect_matches_float64(kSmall, in, run_fp32(kSmall, in, 0, &kSmallDocs), 0, &kSmallDocs, 1e-6, 1e-5);
}

TEST(DocumentsFp32, WithASlidingWindowMatchFloat64) {
  const Inputs in(kSmall, kSeed);
  for (int w : {2, 3}) {
    SCOPED_TRACE("window " + std::to_string(w));
    expect_matches_float64(kSmall, in, run_fp32(kSmall, in, w, &kSmallDocs), w, &kSmallDocs, 1e-6, 1e-5);
  }
}

TEST(DocumentsFused, MatchFloat64WithinOneBlock) {
  const Shape s{1, 20, 2, 1, 8};
  const Positions pos = packed({{7, 1, 12}});
  const Inputs in(s, kSeed);
  for (int w : {0, 5}) {
    SCOPED_TRACE("window " + std::to_string(w));
    expect_matches_float64(s, in, run_fused(s, in, w, &pos), w, &pos, 1e-2, 3e-2);
  }
}

// T 300 in 128-key blocks: row 0's documents start at 0, 100, 129 and 260, so query block 2 (keys from
// 256) skips key block 0 outright and its rows start in block 1 or 2; row 1 is one document then many
// short ones.
TEST(DocumentsFused, ForwardMatchesFloat64AcrossBlocks) {
  const Shape s{2, 300, 2, 1, 16};
  const Positions pos = packed({{100, 29, 131, 40}, {200, 3, 3, 3, 1, 90}});
  const Inputs in(s, kSeed);
  for (int w : {0, 150}) {
    SCOPED_TRACE("window " + std::to_string(w));
    expect_matches_float64(s, in, run_fused(s, in, w, &pos), w, &pos, 1e-2, 0);
  }
}

// The fused backward against the fp32 oracle across blocks (the float64 differences would take long at
// T 300): the same documents, within the fused path's bf16 rounding.
TEST(DocumentsFused, BackwardMatchesTheFp32OracleAcrossBlocks) {
  const Shape s{1, 300, 2, 1, 16};
  const Positions pos = packed({{100, 29, 131, 40}});
  const Inputs in(s, kSeed);
  const Result fused = run_fused(s, in, 0, &pos), oracle = run_fp32(s, in, 0, &pos);
  EXPECT_LE(rel_l2(fused.dq, oracle.dq), 3e-2);
  EXPECT_LE(rel_l2(fused.dk, oracle.dk), 3e-2);
  EXPECT_LE(rel_l2(fused.dv, oracle.dv), 3e-2);
  // Without the mask the oracle's gradients are not those: the test can tell.
  EXPECT_GT(rel_l2(run_fp32(s, in, 0, nullptr).dq, oracle.dq), 0.1);
}

TEST(Documents, OnePerRowIsAttentionWithoutPositionsBitForBit) {
  for (const Shape& s : {kSmall, Shape{1, 130, 4, 2, 16}}) {
    SCOPED_TRACE("T " + std::to_string(s.T));
    const Inputs in(s, kSeed);
    const Positions pos = one_document(s);
    expect_same_bits(run_fp32(s, in, 0, &pos), run_fp32(s, in, 0, nullptr));
    expect_same_bits(run_fused(s, in, 0, &pos), run_fused(s, in, 0, nullptr));
    expect_same_bits(run_fused(s, in, 7, &pos), run_fused(s, in, 7, nullptr));
  }
}

// A document of one token sees only itself: its out is its value head's row, exactly.
TEST(Documents, OfOneTokenSeesOnlyItself) {
  const Inputs in(kSmall, kSeed);
  const Result r = run_fp32(kSmall, in, 0, &kSmallDocs);
  const int t = 4, G = kSmall.NH / kSmall.NKV;  // row 0's second document
  for (int h = 0; h < kSmall.NH; ++h)
    for (int e = 0; e < kSmall.HD; ++e)
      EXPECT_EQ(r.out[(std::size_t(t) * kSmall.NH + h) * kSmall.HD + e],
                in.v[(std::size_t(t) * kSmall.NKV + h / G) * kSmall.HD + e]);
}

TEST(DocumentsRope, MatchesFloat64WithPositionIds) {
  const int B = 2, T = 9, H = 3, HD = 8;
  const float theta = 10000.0f;
  const auto x = random_floats(std::size_t(B) * T * H * HD, 75);
  std::vector<float> cos(T * HD / 2), sin(T * HD / 2), out(x.size(), kNaN), dx(x.size(), kNaN);
  kc::rope_cache(cos.data(), sin.data(), T, HD, theta);
  kc::rope_forward(out.data(), x.data(), cos.data(), sin.data(), B, T, H, HD, kSmallDocs.data());
  auto f = [&](const std::vector<Vec>& in) { return ref_rope(in[0], B, T, H, HD, theta, &kSmallDocs); };
  EXPECT_LE(rel_l2(out, f({to_double(x)})), 1e-6);
  const auto dout = random_floats(x.size(), 76);
  kc::rope_backward(dx.data(), dout.data(), cos.data(), sin.data(), B, T, H, HD, kSmallDocs.data());
  EXPECT_LE(rel_l2(dx, fd_grad(f, {to_double(x)}, 0, to_double(dout))), 1e-5);

  // bf16: the fp32 rotation of the widened values, rounded once.
  const std::vector<bf16_t> xb = to_bf16(x);
  std::vector<bf16_t> ob(x.size());
  kc::rope_forward(ob.data(), xb.data(), cos.data(), sin.data(), B, T, H, HD, kSmallDocs.data());
  std::vector<float> of(x.size());
  kc::rope_forward(of.data(), from_bf16(xb).data(), cos.data(), sin.data(), B, T, H, HD, kSmallDocs.data());
  EXPECT_EQ(from_bf16(ob), from_bf16(to_bf16(of)));
}

TEST(DocumentsRope, PositionsTAreRopeWithoutPositionsBitForBit) {
  const int B = 2, T = 140, H = 2, HD = 16;  // past the bf16 path's blocks of positions
  const Shape s{B, T, H, H, HD};
  const Positions pos = one_document(s);
  const auto x = random_floats(std::size_t(B) * T * H * HD, 77);
  std::vector<float> cos(T * HD / 2), sin(T * HD / 2), a(x.size()), b(x.size());
  kc::rope_cache(cos.data(), sin.data(), T, HD, 10000.0f);
  kc::rope_forward(a.data(), x.data(), cos.data(), sin.data(), B, T, H, HD, pos.data());
  kc::rope_forward(b.data(), x.data(), cos.data(), sin.data(), B, T, H, HD);
  EXPECT_EQ(a, b);
  const std::vector<bf16_t> xb = to_bf16(x);
  std::vector<bf16_t> ab(x.size()), bb(x.size());
  kc::rope_backward(ab.data(), xb.data(), cos.data(), sin.data(), B, T, H, HD, pos.data());
  kc::rope_backward(bb.data(), xb.data(), cos.data(), sin.data(), B, T, H, HD);
  EXPECT_EQ(from_bf16(ab), from_bf16(bb));
}

}  // namespace
}  // namespace strata::kernels::test
