// cuDNN's fused attention (kernels/cuda/attention_cudnn.h) against the CPU reference (kernels/cpu's
// attention) on fresh random bf16 inputs, for the shapes of tests/kernels/cuda_attention_cudnn_shapes.h:
// grouped-query heads (NKV < NH, down to one key/value head), sequence lengths that are not multiples
// of 64 and sliding windows, each also passed through the frontend's host-side checks in CI
// (cuda_attention_cudnn_host_test.cpp). Bounds, as relative L2 error:
//   out <= 1e-2 (bf16 storage rounds each output by up to 2^-9; flash attention also rounds the
//     probabilities to bf16 before multiplying by V);
//   dq, dk, dv <= 3e-2 (the probabilities and their gradients are rounded to bf16 before each of the
//     backward's matrix products: two roundings more than kernels/cuda's fp32 score buffer sees);
//   the saved softmax statistics (max + ln sum exp of the scaled scores, fp32 (B,NH,T)) <= 1e-3.
// Outputs are poisoned with NaN first, so an element cuDNN does not write fails. Skips, with the reason:
// no GPU visible, this binary built without the cuDNN frontend, a GPU older than compute capability 8.0.
// On a GPU of 8.0 or newer with cuDNN built in, a shape cuDNN refuses FAILS with cuDNN's reason: these
// shapes are within its documented support (head dim a multiple of 8, <= 128; the backward refuses a
// one-token sequence, which the compute interface runs on kernels/cuda's own kernel, tested last).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/ops.h"
#include "tests/kernels/cuda_attention_cudnn_shapes.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/reference.h"

namespace strata::kernels::test {
namespace {

namespace cpu = strata::kernels::cpu;

// Why cuDNN's attention cannot be tested on this machine, or "" when it can.
std::string cudnn_skip_reason(int ordinal) {
  if (!CudnnAttention::compiled_in())
    return "this binary was built without the cuDNN frontend (cmake/StrataCudnn.cmake)";
  cudaDeviceProp p{};
  STRATA_CUDA_CHECK(cudaGetDeviceProperties(&p, ordinal));
  if (p.major < 8)
    return std::string("cuDNN's fused attention needs compute capability 8.0 or newer; ") + p.name + " is " +
           std::to_string(p.major) + "." + std::to_string(p.minor);
  return "";
}

// ln sum_s exp(scale q_t . k_s) over the keys query t sees (s <= t, and t - s < window with one) per
// (b, h, t), in double: what cuDNN saves as its statistics.
std::vector<float> ref_logsumexp(const std::vector<float>& q, const std::vector<float>& k, int B, int T,
                                 int NH, int NKV, int HD, int window) {
  std::vector<float> out(std::size_t(B) * NH * T);
  const double scale = 1.0 / std::sqrt(double(HD));
  std::vector<double> s(static_cast<std::size_t>(T));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const float* qt = &q[((std::size_t(b) * T + t) * NH + h) * HD];
        const int lo = window > 0 ? std::max(0, t - window + 1) : 0;
        double mx = -INFINITY;
        for (int j = lo; j <= t; ++j) {
          const float* kj = &k[((std::size_t(b) * T + j) * NKV + h / (NH / NKV)) * HD];
          double d = 0;
          for (int e = 0; e < HD; ++e) d += double(qt[e]) * double(kj[e]);
          s[std::size_t(j)] = d * scale;
          mx = std::max(mx, s[std::size_t(j)]);
        }
        double sum = 0;
        for (int j = lo; j <= t; ++j) sum += std::exp(s[std::size_t(j)] - mx);
        out[(std::size_t(b) * NH + h) * T + t] = float(mx + std::log(sum));
      }
  return out;
}

class CudaCudnnAttention : public CudaTest, public ::testing::WithParamInterface<AttentionShape> {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    const std::string why = cudnn_skip_reason(device_->caps().ordinal);
    if (!why.empty()) GTEST_SKIP() << why;
  }
  static std::vector<float> got(const DeviceBuffer<cpu::bf16_t>& d) { return from_bf16(d.download()); }
  static Tensor bf16_tensor(const DeviceBuffer<cpu::bf16_t>& d, std::size_t n) {
    return {d.get(), DType::bf16, n};
  }
};

TEST_P(CudaCudnnAttention, ForwardAndBackwardMatchTheCpuReference) {
  const AttentionShape sh = GetParam();
  const int B = sh.B, T = sh.T, NH = sh.NH, NKV = sh.NKV, HD = sh.HD, W = sh.window;
  SCOPED_TRACE(::testing::Message() << "seed " << seed_ << ", B=" << B << " T=" << T << " NH=" << NH
                                    << " NKV=" << NKV << " HD=" << HD << " window=" << W);
  CudnnAttention att(stream_);
  const CudnnAttention::Plan& plan = att.plan(sh);
  ASSERT_TRUE(plan.supported) << "cuDNN refused the shape: " << plan.why_not;

  const std::size_t nq = std::size_t(B) * T * NH * HD, nkv = std::size_t(B) * T * NKV * HD;
  const auto q = random_bf16_values(nq, next_seed()), k = random_bf16_values(nkv, next_seed());
  const auto v = random_bf16_values(nkv, next_seed()), dout = random_bf16_values(nq, next_seed());
  const std::size_t att_n = std::size_t(B) * NH * T * T;
  std::vector<float> out(nq), probs(att_n), score_grads(att_n), dq(nq), dk(nkv), dv(nkv);
  cpu::attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), B, T, NH, NKV, HD, W);
  cpu::attention_backward(dq.data(), dk.data(), dv.data(), score_grads.data(), dout.data(), q.data(),
                          k.data(), v.data(), out.data(), probs.data(), B, T, NH, NKV, HD, W);
  const std::vector<float> lse = ref_logsumexp(q, k, B, T, NH, NKV, HD, W);

  DeviceBuffer<cpu::bf16_t> d_q(to_bf16(q)), d_k(to_bf16(k)), d_v(to_bf16(v)), d_dout(to_bf16(dout));
  DeviceBuffer<cpu::bf16_t> d_out(nq), d_dq(nq), d_dk(nkv), d_dv(nkv);
  DeviceBuffer<float> d_saved(std::max<std::size_t>(1, plan.sizes.saved));
  DeviceBuffer<float> d_scratch(std::max<std::size_t>(1, plan.sizes.scratch));
  for (auto* b : {&d_out, &d_dq, &d_dk, &d_dv}) b->poison();
  d_saved.poison();
  strata::DeviceBuffer fwd_ws = scratch(std::max<std::size_t>(1, plan.forward_workspace_bytes));

  const Tensor saved{d_saved.get(), DType::fp32, plan.sizes.saved};
  att.forward(sh, bf16_tensor(d_out, nq), saved, bf16_tensor(d_q, nq), bf16_tensor(d_k, nkv),
              bf16_tensor(d_v, nkv), fwd_ws.data());
  att.backward(sh, bf16_tensor(d_dq, nq), bf16_tensor(d_dk, nkv), bf16_tensor(d_dv, nkv),
               Tensor{d_scratch.get(), DType::fp32, plan.sizes.scratch}, bf16_tensor(d_dout, nq),
               bf16_tensor(d_q, nq), bf16_tensor(d_k, nkv), bf16_tensor(d_v, nkv), bf16_tensor(d_out, nq),
               saved);

  std::vector<float> stats = d_saved.download();
  stats.resize(lse.size());  // the statistics are the saved state, (B, NH, T)
  EXPECT_LE(rel_l2(got(d_out), out), 1e-2) << "out";
  EXPECT_LE(rel_l2(stats, lse), 1e-3) << "softmax statistics";
  EXPECT_LE(rel_l2(got(d_dq), dq), 3e-2) << "dq";
  EXPECT_LE(rel_l2(got(d_dk), dk), 3e-2) << "dk";
  EXPECT_LE(rel_l2(got(d_dv), dv), 3e-2) << "dv";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaCudnnAttention, ::testing::ValuesIn(cudnn_test_shapes()), [](const auto& info) {
      const AttentionShape& s = info.param;
      std::ostringstream name;  // (operator+ chains trip GCC 12's -Wrestrict false positive at -O3)
      name << "b" << s.B << "_t" << s.T << "_nh" << s.NH << "_nkv" << s.NKV << "_hd" << s.HD;
      if (s.window > 0) name << "_window" << s.window;
      return name.str();
    });

// The CUDA compute interface picks the cuDNN path where it runs: attention_sizes().saved is the statistics
// alone (the backward reads the forward's output from its caller), not the unfused kernel's (B, NH, T, T)
// probabilities.
TEST_F(CudaTest, CudaOpsAttendWithoutTheTxTMatrixWhereCudnnRuns) {
  const std::string why = cudnn_skip_reason(device_->caps().ordinal);
  if (!why.empty()) GTEST_SKIP() << why;
  std::unique_ptr<Stream> s = device_->create_stream("cudnn-attention-test");
  std::unique_ptr<Ops> ops = make_ops(*device_, *s);
  EXPECT_TRUE(ops->caps().fused_attention) << ops->caps().name;
  const int B = kCudaOpsShape.B, T = kCudaOpsShape.T, NH = kCudaOpsShape.NH, NKV = kCudaOpsShape.NKV,
            HD = kCudaOpsShape.HD;
  const AttentionSizes as = ops->attention_sizes(B, T, NH, NKV, HD);
  EXPECT_EQ(as.saved, std::size_t(B) * NH * T);
}

// One token: the frontend's backward graph refuses s_q = s_kv = 1, so the plan is not supported and says
// that the backward refused it (Note [cuDNN attention graph checks]).
TEST_F(CudaTest, CudnnRefusesAOneTokenSequenceSayingWhy) {
  const std::string why = cudnn_skip_reason(device_->caps().ordinal);
  if (!why.empty()) GTEST_SKIP() << why;
  CudnnAttention att(stream_);
  const CudnnAttention::Plan& p = att.plan(kOneTokenShape);
  EXPECT_FALSE(p.supported);
  EXPECT_EQ(p.why_not.rfind("backward: ", 0), 0u) << p.why_not;
}

// The compute interface runs a one-token sequence on kernels/cuda's own kernel, whatever cuDNN's state:
// out is v of the head's group (softmax over one key is 1), dv the sum of dout over the group's heads, and
// dq, dk are zero (the scores' gradient vanishes where the softmax is constant).
TEST_F(CudaTest, CudaOpsRunAOneTokenSequenceOnTheirOwnKernel) {
  std::unique_ptr<Stream> s = device_->create_stream("one-token-attention-test");
  std::unique_ptr<Ops> ops = make_ops(*device_, *s);
  const AttentionShape sh = kOneTokenShape;
  const int B = sh.B, T = sh.T, NH = sh.NH, NKV = sh.NKV, HD = sh.HD;
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  const std::string path = ops->attention_path(B, T, NH, NKV, HD);
  EXPECT_NE(path.find("own unfused attention"), std::string::npos) << path;

  const std::size_t nq = std::size_t(B) * T * NH * HD, nkv = std::size_t(B) * T * NKV * HD;
  const auto q = random_bf16_values(nq, next_seed()), k = random_bf16_values(nkv, next_seed());
  const auto v = random_bf16_values(nkv, next_seed()), dout = random_bf16_values(nq, next_seed());
  const std::size_t att_n = std::size_t(B) * NH * T * T;
  std::vector<float> out(nq), probs(att_n), score_grads(att_n), dq(nq), dk(nkv), dv(nkv);
  cpu::attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), B, T, NH, NKV, HD);
  cpu::attention_backward(dq.data(), dk.data(), dv.data(), score_grads.data(), dout.data(), q.data(),
                          k.data(), v.data(), out.data(), probs.data(), B, T, NH, NKV, HD);

  const AttentionSizes as = ops->attention_sizes(B, T, NH, NKV, HD);
  DeviceBuffer<cpu::bf16_t> d_q(to_bf16(q)), d_k(to_bf16(k)), d_v(to_bf16(v)), d_dout(to_bf16(dout));
  DeviceBuffer<cpu::bf16_t> d_out(nq), d_dq(nq), d_dk(nkv), d_dv(nkv);
  DeviceBuffer<float> d_saved(std::max<std::size_t>(1, as.saved)),
      d_scratch(std::max<std::size_t>(1, as.scratch));
  for (auto* b : {&d_out, &d_dq, &d_dk, &d_dv}) b->poison();
  const auto bf16 = [](const DeviceBuffer<cpu::bf16_t>& d, std::size_t n) {
    return Tensor{d.get(), DType::bf16, n};
  };
  const Tensor saved{d_saved.get(), DType::fp32, as.saved}, scr{d_scratch.get(), DType::fp32, as.scratch};
  ops->attention_forward(bf16(d_out, nq), saved, bf16(d_q, nq), bf16(d_k, nkv), bf16(d_v, nkv), B, T, NH, NKV,
                         HD);
  ops->attention_backward(bf16(d_dq, nq), bf16(d_dk, nkv), bf16(d_dv, nkv), scr, bf16(d_dout, nq),
                          bf16(d_q, nq), bf16(d_k, nkv), bf16(d_v, nkv), bf16(d_out, nq), saved, B, T, NH,
                          NKV, HD);
  s->synchronize();

  const auto max_abs = [](const std::vector<float>& x) {
    float m = 0.0f;
    for (float e : x) m = std::isnan(e) ? INFINITY : std::max(m, std::fabs(e));
    return m;
  };
  EXPECT_LE(rel_l2(from_bf16(d_out.download()), out), 1e-2) << "out";
  EXPECT_LE(rel_l2(from_bf16(d_dv.download()), dv), 1e-2) << "dv";
  EXPECT_LE(max_abs(from_bf16(d_dq.download())), 1e-4f) << "dq";
  EXPECT_LE(max_abs(from_bf16(d_dk.download())), 1e-4f) << "dk";
}

// A sliding window through the compute interface: the path it names (cuDNN's windowed graphs, or the own
// kernel with cuDNN's reason) computes what the CPU does with the same window, and a window no shorter
// than T is causal attention (the same path and buffers).
TEST_F(CudaTest, CudaOpsAttendInASlidingWindowAsTheCpuDoes) {
  std::unique_ptr<Stream> s = device_->create_stream("window-attention-test");
  std::unique_ptr<Ops> ops = make_ops(*device_, *s);
  const int B = 2, T = 100, NH = 8, NKV = 2, HD = 64, W = 16;
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  const std::string path = ops->attention_path(B, T, NH, NKV, HD, W);
  RecordProperty("attention_path", path);
  EXPECT_NE(path.find("sliding window 16"), std::string::npos) << path;
  EXPECT_EQ(ops->attention_path(B, T, NH, NKV, HD, T), ops->attention_path(B, T, NH, NKV, HD));

  const std::size_t nq = std::size_t(B) * T * NH * HD, nkv = std::size_t(B) * T * NKV * HD;
  const auto q = random_bf16_values(nq, next_seed()), k = random_bf16_values(nkv, next_seed());
  const auto v = random_bf16_values(nkv, next_seed()), dout = random_bf16_values(nq, next_seed());
  const std::size_t att_n = std::size_t(B) * NH * T * T;
  std::vector<float> out(nq), probs(att_n), score_grads(att_n), dq(nq), dk(nkv), dv(nkv);
  cpu::attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), B, T, NH, NKV, HD, W);
  cpu::attention_backward(dq.data(), dk.data(), dv.data(), score_grads.data(), dout.data(), q.data(),
                          k.data(), v.data(), out.data(), probs.data(), B, T, NH, NKV, HD, W);

  const AttentionSizes as = ops->attention_sizes(B, T, NH, NKV, HD, W);
  ops->reserve_scratch(ops->scratch_bytes({.B = B, .T = T, .NH = NH, .NKV = NKV, .HD = HD, .window = W}));
  DeviceBuffer<cpu::bf16_t> d_q(to_bf16(q)), d_k(to_bf16(k)), d_v(to_bf16(v)), d_dout(to_bf16(dout));
  DeviceBuffer<cpu::bf16_t> d_out(nq), d_dq(nq), d_dk(nkv), d_dv(nkv);
  DeviceBuffer<float> d_saved(std::max<std::size_t>(1, as.saved)),
      d_scratch(std::max<std::size_t>(1, as.scratch));
  for (auto* b : {&d_out, &d_dq, &d_dk, &d_dv}) b->poison();
  const auto bf16 = [](const DeviceBuffer<cpu::bf16_t>& d, std::size_t n) {
    return Tensor{d.get(), DType::bf16, n};
  };
  const Tensor saved{d_saved.get(), DType::fp32, as.saved}, scr{d_scratch.get(), DType::fp32, as.scratch};
  ops->attention_forward(bf16(d_out, nq), saved, bf16(d_q, nq), bf16(d_k, nkv), bf16(d_v, nkv), B, T, NH, NKV,
                         HD, W);
  ops->attention_backward(bf16(d_dq, nq), bf16(d_dk, nkv), bf16(d_dv, nkv), scr, bf16(d_dout, nq),
                          bf16(d_q, nq), bf16(d_k, nkv), bf16(d_v, nkv), bf16(d_out, nq), saved, B, T, NH,
                          NKV, HD, W);
  s->synchronize();
  EXPECT_LE(rel_l2(from_bf16(d_out.download()), out), 1e-2) << "out, " << path;
  EXPECT_LE(rel_l2(from_bf16(d_dq.download()), dq), 3e-2) << "dq, " << path;
  EXPECT_LE(rel_l2(from_bf16(d_dk.download()), dk), 3e-2) << "dk, " << path;
  EXPECT_LE(rel_l2(from_bf16(d_dv.download()), dv), 3e-2) << "dv, " << path;
}

}  // namespace
}  // namespace strata::kernels::test
