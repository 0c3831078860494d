// kernels/cpu/linear_bf16.cpp on bf16 operands (the host backend's bf16 activations): each element within
// its rounding bound of the float64 product of the same bf16 values, through both tilings of Note
// [Product tiles] — row tiles over a packed B (tall products, with a last short tile, and a B whose
// packed layout is padded: N and K not multiples of its blocks) and column tiles (short products, with a
// last narrow tile) — and bit-identical across thread counts.
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "kernels/cpu/ops.h"
#include "tests/kernels/reference.h"

namespace strata::kernels::test {
namespace {

// |got - want| <= the rounding of the fp32 sum of `terms` products (K * 2^-24 of their absolute sum) plus,
// for a bf16 result, its own rounding (2^-8 of its magnitude: a half ulp is 2^-9 relative).
void expect_within(double got, double want, double abs_terms, int K, bool bf16_result, const char* what,
                   std::size_t i) {
  const double bound =
      K * std::ldexp(abs_terms, -24) + (bf16_result ? std::ldexp(std::fabs(want), -8) : 0) + 1e-30;
  ASSERT_LE(std::fabs(got - want), bound) << what << " element " << i;
}

struct Shape {
  int N, IC, OC;
  const char* tiling;
};
// N >= 512 rows: row tiles (N = 552: 32-row tiles and a last one of 8; IC 67 and OC 100 leave the packed
// B padded). N < 512: column tiles (OC 1000: 64-column tiles and a last one of 40). The backward's dw has
// OC rows: tall for OC 600, short otherwise.
const Shape kShapes[] = {{552, 67, 100, "rows, padded packing"},
                         {20, 48, 1000, "columns, narrow last tile"},
                         {96, 600, 33, "dw by rows"},
                         {1, 16, 70, "one row"}};

class LinearTiles : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    const auto [N, IC, OC, tiling] = GetParam();
    (void)tiling;
    x = to_bf16(random_floats(std::size_t(N) * IC, 11));
    w = to_bf16(random_floats(std::size_t(OC) * IC, 12, 0.1f));
    dout = to_bf16(random_floats(std::size_t(N) * OC, 13));
    dx0 = to_bf16(random_floats(std::size_t(N) * IC, 14));
    dw0 = random_floats(std::size_t(OC) * IC, 15);
  }
  double X(int n, int i) const { return bf16_to_f32(x[std::size_t(n) * GetParam().IC + i]); }
  double W(int o, int i) const { return bf16_to_f32(w[std::size_t(o) * GetParam().IC + i]); }
  double D(int n, int o) const { return bf16_to_f32(dout[std::size_t(n) * GetParam().OC + o]); }
  std::vector<cpu::bf16_t> x, w, dout, dx0;
  std::vector<float> dw0;
};

TEST_P(LinearTiles, ForwardIsTheRoundedProductOfTheBf16Operands) {
  const auto [N, IC, OC, tiling] = GetParam();
  std::vector<cpu::bf16_t> out(std::size_t(N) * OC);
  cpu::linear_forward(out.data(), x.data(), w.data(), N, IC, OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = 0, a = 0;
      for (int i = 0; i < IC; ++i) s += X(n, i) * W(o, i), a += std::fabs(X(n, i) * W(o, i));
      const std::size_t at = std::size_t(n) * OC + o;
      expect_within(bf16_to_f32(out[at]), s, a, IC, true, tiling, at);
    }
}

TEST_P(LinearTiles, BackwardAddsToDxInBf16AndToDwInFp32) {
  const auto [N, IC, OC, tiling] = GetParam();
  std::vector<cpu::bf16_t> dx = dx0;
  std::vector<float> dw = dw0;
  cpu::linear_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), N, IC, OC);
  for (int n = 0; n < N; ++n)
    for (int i = 0; i < IC; ++i) {
      const std::size_t at = std::size_t(n) * IC + i;
      double s = bf16_to_f32(dx0[at]), a = std::fabs(s);
      for (int o = 0; o < OC; ++o) s += D(n, o) * W(o, i), a += std::fabs(D(n, o) * W(o, i));
      expect_within(bf16_to_f32(dx[at]), s, a, OC + 1, true, tiling, at);
    }
  for (int o = 0; o < OC; ++o)
    for (int i = 0; i < IC; ++i) {
      const std::size_t at = std::size_t(o) * IC + i;
      double s = dw0[at], a = std::fabs(s);
      for (int n = 0; n < N; ++n) s += D(n, o) * X(n, i), a += std::fabs(D(n, o) * X(n, i));
      expect_within(dw[at], s, a, N + 1, false, tiling, at);
    }
}

TEST_P(LinearTiles, ResultsAreBitIdenticalAcrossThreadCounts) {
  const auto [N, IC, OC, tiling] = GetParam();
  auto run = [&](int threads) {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism, std::size_t(threads));
    std::vector<cpu::bf16_t> out(std::size_t(N) * OC), dx = dx0;
    std::vector<float> dw = dw0;
    cpu::linear_forward(out.data(), x.data(), w.data(), N, IC, OC);
    cpu::linear_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), N, IC, OC);
    return std::make_tuple(out, dx, dw);
  };
  const auto one = run(1), two = run(2);
  EXPECT_TRUE(std::get<0>(one) == std::get<0>(two)) << tiling << ": out";
  EXPECT_TRUE(std::get<1>(one) == std::get<1>(two)) << tiling << ": dx";
  EXPECT_EQ(0, std::memcmp(std::get<2>(one).data(), std::get<2>(two).data(), std::get<2>(one).size() * 4))
      << tiling << ": dw";
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearTiles, ::testing::ValuesIn(kShapes),
                         [](const ::testing::TestParamInfo<Shape>& p) {
                           return "N" + std::to_string(p.param.N) + "_IC" + std::to_string(p.param.IC) +
                                  "_OC" + std::to_string(p.param.OC);
                         });

}  // namespace
}  // namespace strata::kernels::test
