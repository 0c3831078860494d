// Zero-sized shapes on the CUDA ops give what kernels/cpu gives, with no launch error (a launch with an
// empty grid is one): linear with IC = 0 writes zeros (the empty sum), RMSNorm with C = 0 gives the CPU's NaN
// rstd, and every op with nothing to do leaves the thread's CUDA error state clean. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "tests/kernels/cuda_test_util.h"

namespace strata::kernels::test {
namespace {

namespace cpu = strata::kernels::cpu;
namespace kc = strata::kernels::cuda;
using kc::bf16;

class CudaZeroSizes : public CudaTest {
 protected:
  // No launch error is pending and the stream's work ran.
  void expect_clean() {
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  }
};

TEST_F(CudaZeroSizes, LinearWithNoInputChannelsWritesZeros) {
  const int N = 5, IC = 0, OC = 7;
  const std::vector<float> out(std::size_t(N) * OC, 0.0f);  // an empty sum (BLAS rejects lda = 0 outright)
  kc::Gemm gemm(*device_);
  DeviceBuffer<cpu::bf16_t> d_out(out.size()), d_dx(1);
  DeviceBuffer<float> d_dw(1);
  d_out.poison();
  kc::linear_forward(gemm, d_out.as<bf16>(), d_dx.as<bf16>(), d_dx.as<bf16>(), N, IC, OC, stream_);
  EXPECT_EQ(from_bf16(d_out.download()), out);
  kc::linear_backward(gemm, d_dx.as<bf16>(), d_dw.get(), d_out.as<bf16>(), d_dx.as<bf16>(), d_dx.as<bf16>(),
                      N, IC, OC, stream_);
  expect_clean();
}

TEST_F(CudaZeroSizes, RmsNormWithNoChannelsMatchesTheCpu) {
  const int N = 3, C = 0;
  std::vector<float> rstd(N);
  const float* none = nullptr;  // the fp32 oracle (not its bf16 overload)
  cpu::rmsnorm_forward(nullptr, rstd.data(), none, none, N, C, 1e-5f);
  DeviceBuffer<float> d_rstd(N), d_dw(1);
  DeviceBuffer<cpu::bf16_t> d_any(1);
  kc::rmsnorm_forward(d_any.as<bf16>(), d_rstd.get(), d_any.as<bf16>(), d_any.as<bf16>(), N, C, 1e-5f, 0.0f,
                      stream_);
  const auto got = d_rstd.download();
  for (int i = 0; i < N; ++i) EXPECT_EQ(std::isnan(got[i]), std::isnan(rstd[i])) << i;
  auto s = scratch(kc::rmsnorm_backward_scratch_bytes(N, C));
  kc::rmsnorm_backward(d_any.as<bf16>(), d_dw.get(), d_any.as<bf16>(), d_any.as<bf16>(), d_any.as<bf16>(),
                       d_rstd.get(), N, C, 0.0f, s.data(), s.size(), stream_);
  expect_clean();
}

TEST_F(CudaZeroSizes, EmptyShapesLaunchNothing) {
  DeviceBuffer<float> f(1);
  DeviceBuffer<cpu::bf16_t> h(1);
  DeviceBuffer<std::int32_t> tok(1);
  DeviceBuffer<double> norm(1);
  bf16* b = h.as<bf16>();
  auto s = scratch(16);
  kc::embedding_forward(b, tok.get(), b, 0, 4, 10, stream_);
  kc::embedding_backward(f.get(), b, tok.get(), 0, 4, 10, s.data(), s.size(), stream_);
  kc::embedding_backward(f.get(), b, tok.get(), 1, 4, 0, s.data(), s.size(), stream_);  // V = 0
  kc::swiglu_forward(b, b, b, 0, stream_);
  kc::swiglu_backward(b, b, b, b, b, 0, stream_);
  kc::geglu_forward(b, b, b, 0, stream_);
  kc::geglu_backward(b, b, b, b, b, 0, stream_);
  kc::bias_forward(b, b, 0, 4, stream_);
  kc::bias_forward(b, b, 4, 0, stream_);
  kc::bias_backward(f.get(), b, 0, 4, s.data(), s.size(), stream_);
  kc::bias_backward(f.get(), b, 4, 0, s.data(), s.size(), stream_);
  kc::residual_forward(b, b, b, 0, stream_);
  kc::residual_backward(b, b, b, 0, stream_);
  kc::cast_f32_to_bf16(b, f.get(), 0, stream_);
  kc::cast_bf16_to_f32(f.get(), b, 0, stream_);
  kc::scale(f.get(), 2.0f, 0, stream_);
  kc::scale(b, 2.0f, 0, stream_);
  kc::rope_forward(b, b, f.get(), f.get(), 0, 4, 2, 8, nullptr, stream_);
  kc::attention_forward(b, f.get(), b, b, b, 0, 4, 2, 2, 8, /*window=*/0, nullptr, stream_);
  kc::rmsnorm_forward(b, f.get(), b, b, 0, 8, 1e-5f, 1.0f, stream_);
  kc::squared_norm(norm.get(), f.get(), 0, s.data(), s.size(), stream_);
  EXPECT_EQ(norm.download()[0], 0.0);
  expect_clean();
}

TEST_F(CudaZeroSizes, CrossEntropyWithEveryTargetIgnoredIsZero) {
  const int N = 6, V = 11;
  const std::vector<std::int32_t> targets(N, -1);
  const auto logits = random_bf16_values(std::size_t(N) * V, next_seed());
  std::vector<float> dlogits(logits.size()), losses(N);
  const float loss = cpu::cross_entropy_forward_backward(dlogits.data(), losses.data(), logits.data(),
                                                         targets.data(), N, V, 1.0f);
  DeviceBuffer<std::int32_t> d_targets(targets);
  DeviceBuffer<cpu::bf16_t> d_logits(to_bf16(logits)), d_dlogits(logits.size());
  DeviceBuffer<float> d_losses(N), d_mean(1);
  d_dlogits.poison();
  kc::cross_entropy_forward_backward(d_dlogits.as<bf16>(), d_losses.get(), d_mean.get(), d_logits.as<bf16>(),
                                     d_targets.get(), N, V, 1.0f, stream_);
  EXPECT_EQ(d_mean.download()[0], loss);
  EXPECT_EQ(d_losses.download(), losses);
  EXPECT_EQ(from_bf16(d_dlogits.download()), dlogits);
}

}  // namespace
}  // namespace strata::kernels::test
