// kernels/cpu/linear_bf16.cpp against the fp32 oracle (the difference bf16 makes), and through the compute
// interface (make_ops with OpsOptions.matmul = bf16: bf16 activations). The products' arithmetic on bf16
// operands, both tilings and thread counts are linear_tiles_test.cpp's.
#include <gtest/gtest.h>

#include <cstring>

#include "core/device.h"
#include "core/dtype.h"
#include "kernels/cpu/ops.h"
#include "kernels/ops.h"
#include "tests/kernels/reference.h"

namespace strata::kernels::test {
namespace {

struct Shape {
  int N, IC, OC;
};
// Short products (column tiles) and a tall one (row tiles).
const Shape kShapes[] = {{7, 33, 5}, {64, 128, 96}, {600, 96, 130}};

class LinearBf16 : public ::testing::TestWithParam<Shape> {};

TEST_P(LinearBf16, ForwardIsWithinBf16RoundingOfTheFp32Oracle) {
  const auto [N, IC, OC] = GetParam();
  const auto x = random_floats(std::size_t(N) * IC, 3), w = random_floats(std::size_t(OC) * IC, 4, 0.1f);
  std::vector<cpu::bf16_t> out(std::size_t(N) * OC);
  std::vector<float> ref(out.size());
  cpu::linear_forward(out.data(), to_bf16(x).data(), to_bf16(w).data(), N, IC, OC);
  cpu::linear_forward(ref.data(), x.data(), w.data(), N, IC, OC);
  const double err = rel_l2(from_bf16(out), ref);
  EXPECT_LT(err, 1e-2);  // three roundings of 2^-9 relative each (x, w, out), averaged over the sums
  EXPECT_GT(err, 1e-6);  // and the operands really were rounded
}

TEST_P(LinearBf16, BackwardIsWithinBf16RoundingOfTheFp32Oracle) {
  const auto [N, IC, OC] = GetParam();
  const auto x = random_floats(std::size_t(N) * IC, 5), w = random_floats(std::size_t(OC) * IC, 6, 0.1f),
             dout = random_floats(std::size_t(N) * OC, 7);
  std::vector<cpu::bf16_t> dx(x.size(), 0);
  std::vector<float> dw(w.size(), 0.0f), ref_dx(x.size(), 0.0f), ref_dw(w.size(), 0.0f);
  cpu::linear_backward(dx.data(), dw.data(), to_bf16(dout).data(), to_bf16(x).data(), to_bf16(w).data(), N,
                       IC, OC);
  cpu::linear_backward(ref_dx.data(), ref_dw.data(), dout.data(), x.data(), w.data(), N, IC, OC);
  EXPECT_LT(rel_l2(from_bf16(dx), ref_dx), 1e-2);
  EXPECT_LT(rel_l2(dw, ref_dw), 1e-2);
  // Without dx, dw alone: the same bits.
  std::vector<float> dw_only(w.size(), 0.0f);
  cpu::linear_backward(nullptr, dw_only.data(), to_bf16(dout).data(), to_bf16(x).data(), to_bf16(w).data(), N,
                       IC, OC);
  EXPECT_EQ(std::memcmp(dw_only.data(), dw.data(), dw.size() * sizeof(float)), 0);
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
  const std::vector<cpu::bf16_t> x = to_bf16(random_floats(std::size_t(N) * IC, 13)),
                                 w = to_bf16(random_floats(std::size_t(OC) * IC, 14));
  DeviceBuffer xb(*dev, x.size() * 2), wb(*dev, w.size() * 2), ob(*dev, std::size_t(N) * OC * 2);
  std::memcpy(xb.data(), x.data(), x.size() * 2);
  std::memcpy(wb.data(), w.data(), w.size() * 2);
  ops->linear_forward({ob.data(), DType::bf16, std::size_t(N) * OC}, {xb.data(), DType::bf16, x.size()},
                      {wb.data(), DType::bf16, w.size()}, N, IC, OC);
  stream->synchronize();
  std::vector<cpu::bf16_t> direct(std::size_t(N) * OC);
  cpu::linear_forward(direct.data(), x.data(), w.data(), N, IC, OC);
  EXPECT_EQ(std::memcmp(ob.data(), direct.data(), direct.size() * 2), 0);
}

}  // namespace
}  // namespace strata::kernels::test
