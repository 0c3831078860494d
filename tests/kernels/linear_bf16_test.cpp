// kernels/cpu/linear_bf16.cpp: the linear ops with bf16 operands and fp32 accumulation, against a float64
// reference over the same bf16-rounded operands (the arithmetic they promise), against the fp32 oracle
// (the difference bf16 makes), bit for bit run to run and across thread counts, and through the compute
// interface (make_ops with OpsOptions.matmul = bf16).
#include <gtest/gtest.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <cstring>

#include "core/device.h"
#include "core/dtype.h"
#include "kernels/cpu/ops.h"
#include "kernels/ops.h"
#include "tests/kernels/reference.h"

namespace strata::kernels::test {
namespace {

std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

// out (N, OC) = x (N, IC) w^T in float64.
Vec matmul_nt(const std::vector<float>& x, const std::vector<float>& w, int N, int IC, int OC) {
  Vec out(std::size_t(N) * OC, 0.0);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = 0;
      for (int i = 0; i < IC; ++i)
        s += double(x[std::size_t(n) * IC + i]) * double(w[std::size_t(o) * IC + i]);
      out[std::size_t(n) * OC + o] = s;
    }
  return out;
}

struct Shape {
  int N, IC, OC;
};
// Row counts below, at and above the 64-row blocks, and a tail.
const Shape kShapes[] = {{7, 33, 5}, {64, 128, 96}, {200, 96, 130}, {256, 64, 192}};

class LinearBf16 : public ::testing::TestWithParam<Shape> {};

TEST_P(LinearBf16, ForwardIsTheExactProductOfTheRoundedOperands) {
  const auto [N, IC, OC] = GetParam();
  const auto x = random_floats(std::size_t(N) * IC, 1), w = random_floats(std::size_t(OC) * IC, 2, 0.1f);
  std::vector<float> out(std::size_t(N) * OC);
  cpu::linear_forward_bf16(out.data(), x.data(), w.data(), N, IC, OC);
  // The products of two bf16 values are exact in fp32; only the fp32 sums round.
  EXPECT_LT(rel_l2(out, matmul_nt(rounded(x), rounded(w), N, IC, OC)), 1e-6);
}

TEST_P(LinearBf16, ForwardIsWithinBf16RoundingOfTheFp32Oracle) {
  const auto [N, IC, OC] = GetParam();
  const auto x = random_floats(std::size_t(N) * IC, 3), w = random_floats(std::size_t(OC) * IC, 4, 0.1f);
  std::vector<float> out(std::size_t(N) * OC), ref(out.size());
  cpu::linear_forward_bf16(out.data(), x.data(), w.data(), N, IC, OC);
  cpu::linear_forward(ref.data(), x.data(), w.data(), N, IC, OC);
  const double err = rel_l2(out, ref);
  EXPECT_LT(err, 1e-2);  // two roundings of 2^-9 relative each, averaged over the sums
  EXPECT_GT(err, 1e-6);  // and the operands really were rounded
}

TEST_P(LinearBf16, BackwardAccumulatesTheExactProductsOfTheRoundedOperands) {
  const auto [N, IC, OC] = GetParam();
  const auto x = random_floats(std::size_t(N) * IC, 5), w = random_floats(std::size_t(OC) * IC, 6, 0.1f),
             dout = random_floats(std::size_t(N) * OC, 7);
  const auto dx0 = random_floats(x.size(), 8), dw0 = random_floats(w.size(), 9);
  std::vector<float> dx = dx0, dw = dw0;
  cpu::linear_backward_bf16(dx.data(), dw.data(), dout.data(), x.data(), w.data(), N, IC, OC);
  const auto rx = rounded(x), rw = rounded(w), rd = rounded(dout);
  Vec ref_dx(dx.size()), ref_dw(dw.size());
  for (int n = 0; n < N; ++n)
    for (int i = 0; i < IC; ++i) {
      double s = dx0[std::size_t(n) * IC + i];
      for (int o = 0; o < OC; ++o) s += double(rd[std::size_t(n) * OC + o]) * rw[std::size_t(o) * IC + i];
      ref_dx[std::size_t(n) * IC + i] = s;
    }
  for (int o = 0; o < OC; ++o)
    for (int i = 0; i < IC; ++i) {
      double s = dw0[std::size_t(o) * IC + i];
      for (int n = 0; n < N; ++n) s += double(rd[std::size_t(n) * OC + o]) * rx[std::size_t(n) * IC + i];
      ref_dw[std::size_t(o) * IC + i] = s;
    }
  EXPECT_LT(rel_l2(dx, ref_dx), 1e-6);
  EXPECT_LT(rel_l2(dw, ref_dw), 1e-6);
  // Without dx, dw alone.
  std::vector<float> dw_only = dw0;
  cpu::linear_backward_bf16(nullptr, dw_only.data(), dout.data(), x.data(), w.data(), N, IC, OC);
  EXPECT_EQ(std::memcmp(dw_only.data(), dw.data(), dw.size() * sizeof(float)), 0);
}

TEST_P(LinearBf16, BitIdenticalAcrossRunsAndThreadCounts) {
  const auto [N, IC, OC] = GetParam();
  const auto x = random_floats(std::size_t(N) * IC, 10), w = random_floats(std::size_t(OC) * IC, 11),
             dout = random_floats(std::size_t(N) * OC, 12);
  auto run = [&](int threads) {
    tbb::global_control allow(tbb::global_control::max_allowed_parallelism, std::size_t(threads));
    tbb::task_arena arena(threads);
    std::vector<float> out(std::size_t(N) * OC), dx(x.size()), dw(w.size());
    arena.execute([&] {
      cpu::linear_forward_bf16(out.data(), x.data(), w.data(), N, IC, OC);
      cpu::linear_backward_bf16(dx.data(), dw.data(), dout.data(), x.data(), w.data(), N, IC, OC);
    });
    out.insert(out.end(), dx.begin(), dx.end());
    out.insert(out.end(), dw.begin(), dw.end());
    return out;
  };
  const std::vector<float> a = run(1), b = run(1);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "run to run";
  if (cpu::bf16_matmul_impl().empty())
    GTEST_SKIP() << "the OpenBLAS fallback is bit-identical at one thread count only";
  const std::vector<float> c = run(3);
  EXPECT_EQ(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)), 0) << "1 against 3 threads";
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearBf16, ::testing::ValuesIn(kShapes), [](const auto& info) {
  return std::to_string(info.param.N) + "x" + std::to_string(info.param.IC) + "x" +
         std::to_string(info.param.OC);
});

// The host backend with bf16 activations runs the bf16-tensor products: bit for bit the direct call.
TEST(LinearBf16Ops, TheComputeInterfaceRunsTheBf16Functions) {
  auto dev = open_device({.backend = "host"});
  auto stream = dev->create_stream("linear-bf16");
  const std::unique_ptr<Ops> ops = make_ops(*dev, *stream, {.matmul = DType::bf16});
  EXPECT_NE(ops->caps().name.find("bf16 matrix products"), std::string::npos) << ops->caps().name;
  EXPECT_EQ(ops->caps().activation, DType::bf16);
  const int N = 70, IC = 48, OC = 40;
  std::vector<cpu::bf16_t> x(std::size_t(N) * IC), w(std::size_t(OC) * IC);
  const auto xf = random_floats(x.size(), 13), wf = random_floats(w.size(), 14);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = f32_to_bf16(xf[i]);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(wf[i]);
  DeviceBuffer xb(*dev, x.size() * 2), wb(*dev, w.size() * 2), ob(*dev, std::size_t(N) * OC * 2);
  std::memcpy(xb.data(), x.data(), x.size() * 2);
  std::memcpy(wb.data(), w.data(), w.size() * 2);
  ops->linear_forward({ob.data(), DType::bf16, std::size_t(N) * OC}, {xb.data(), DType::bf16, x.size()},
                      {wb.data(), DType::bf16, w.size()}, N, IC, OC);
  stream->synchronize();
  std::vector<cpu::bf16_t> direct(std::size_t(N) * OC);
  cpu::linear_forward_bf16(direct.data(), x.data(), w.data(), N, IC, OC);
  EXPECT_EQ(std::memcmp(ob.data(), direct.data(), direct.size() * 2), 0);
}

}  // namespace
}  // namespace strata::kernels::test
