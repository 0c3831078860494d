// Every CUDA op against the CPU reference (kernels/cpu) on fresh random inputs: relative L2 error <= 1e-2
// (bf16 storage rounds each output by up to 2^-9 relative; fp32 accumulation keeps sums near the
// reference). Outputs are poisoned with NaN before each run and a NaN never passes. Accumulated outputs
// start from the same random values on both sides and are compared after the update.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/reference.h"

namespace strata::kernels::test {
namespace {

namespace cpu = strata::kernels::cpu;
namespace kc = strata::kernels::cuda;
using kc::bf16;

constexpr double kTol = 1e-2;

class CudaVsCpu : public CudaTest {
 protected:
  std::vector<float> inputs(std::size_t n, float scale = 1.0f) {
    return random_bf16_values(n, next_seed(), scale);
  }
  // Device bf16 results as fp32.
  static std::vector<float> got(const DeviceBuffer<cpu::bf16_t>& d) { return from_bf16(d.download()); }
};

#define SEED_TRACE() SCOPED_TRACE(::testing::Message() << "seed " << seed_)

TEST_F(CudaVsCpu, Embedding) {
  SEED_TRACE();
  const int N = 300, C = 96, V = 50;
  std::vector<std::int32_t> tokens(N);
  std::mt19937 rng{static_cast<unsigned>(next_seed())};
  for (auto& t : tokens) t = int(rng() % V);
  const auto wte = inputs(std::size_t(V) * C), dout = inputs(std::size_t(N) * C), dwte0 = inputs(wte.size());
  std::vector<float> out(std::size_t(N) * C), dwte = dwte0;
  cpu::embedding_forward(out.data(), tokens.data(), wte.data(), N, C, V);
  cpu::embedding_backward(dwte.data(), dout.data(), tokens.data(), N, C, V);

  DeviceBuffer<std::int32_t> d_tokens(tokens);
  DeviceBuffer<cpu::bf16_t> d_wte(to_bf16(wte)), d_dout(to_bf16(dout)), d_out(out.size());
  DeviceBuffer<float> d_dwte(dwte0);
  d_out.poison();
  kc::embedding_forward(d_out.as<bf16>(), d_tokens.get(), d_wte.as<bf16>(), N, C, V, stream_);
  auto s = scratch(kc::embedding_backward_scratch_bytes(N, V));
  kc::embedding_backward(d_dwte.get(), d_dout.as<bf16>(), d_tokens.get(), N, C, V, s.data(), s.size(),
                         stream_);
  EXPECT_LE(rel_l2(got(d_out), out), kTol);
  EXPECT_LE(rel_l2(d_dwte.download(), dwte), kTol);
}

TEST_F(CudaVsCpu, RmsNorm) {
  SEED_TRACE();
  const int N = 200, C = 384;  // several row blocks of the weight gradient, the last one partial
  const float eps = 1e-5f;
  const auto x = inputs(std::size_t(N) * C), w = inputs(C), dout = inputs(x.size());
  const auto dx0 = inputs(x.size()), dw0 = inputs(C);
  std::vector<float> out(x.size()), rstd(N), dx = dx0, dw = dw0;
  cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  cpu::rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);

  DeviceBuffer<cpu::bf16_t> d_x(to_bf16(x)), d_w(to_bf16(w)), d_dout(to_bf16(dout)), d_out(x.size()),
      d_dx(to_bf16(dx0));
  DeviceBuffer<float> d_rstd(N), d_dw(dw0);
  d_out.poison();
  d_rstd.poison();
  kc::rmsnorm_forward(d_out.as<bf16>(), d_rstd.get(), d_x.as<bf16>(), d_w.as<bf16>(), N, C, eps, 0.0f,
                      stream_);
  auto s = scratch(kc::rmsnorm_backward_scratch_bytes(N, C));
  kc::rmsnorm_backward(d_dx.as<bf16>(), d_dw.get(), d_dout.as<bf16>(), d_x.as<bf16>(), d_w.as<bf16>(),
                       d_rstd.get(), N, C, 0.0f, s.data(), s.size(), stream_);
  EXPECT_LE(rel_l2(got(d_out), out), kTol);
  EXPECT_LE(rel_l2(d_rstd.download(), rstd), kTol);
  EXPECT_LE(rel_l2(got(d_dx), dx), kTol);
  EXPECT_LE(rel_l2(d_dw.download(), dw), kTol);
}

// RMSNorm of (rows, width) with a weight offset, against the CPU: Gemma's norm (offset 1, over the model
// width) and Qwen3's per-head q/k norm (offset 0, over N * NH rows of HD).
struct NormCase {
  const char* name;
  int rows, width;
  float w_offset, w_scale;
};

void PrintTo(const NormCase& c, std::ostream* os) {
  *os << c.name << " (" << c.rows << " rows of " << c.width << ", w_offset " << c.w_offset << ")";
}

class CudaRmsNormShapes : public CudaVsCpu, public ::testing::WithParamInterface<NormCase> {};

TEST_P(CudaRmsNormShapes, MatchesCpu) {
  SEED_TRACE();
  const int N = GetParam().rows, C = GetParam().width;
  const float eps = 1e-6f, w_offset = GetParam().w_offset;
  const auto x = inputs(std::size_t(N) * C), w = inputs(C, GetParam().w_scale), dout = inputs(x.size());
  const auto dx0 = inputs(x.size()), dw0 = inputs(C);
  std::vector<float> out(x.size()), rstd(N), dx = dx0, dw = dw0;
  cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps, w_offset);
  cpu::rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C, w_offset);

  DeviceBuffer<cpu::bf16_t> d_x(to_bf16(x)), d_w(to_bf16(w)), d_dout(to_bf16(dout)), d_out(x.size()),
      d_dx(to_bf16(dx0));
  DeviceBuffer<float> d_rstd(N), d_dw(dw0);
  d_out.poison();
  d_rstd.poison();
  kc::rmsnorm_forward(d_out.as<bf16>(), d_rstd.get(), d_x.as<bf16>(), d_w.as<bf16>(), N, C, eps, w_offset,
                      stream_);
  auto s = scratch(kc::rmsnorm_backward_scratch_bytes(N, C));
  kc::rmsnorm_backward(d_dx.as<bf16>(), d_dw.get(), d_dout.as<bf16>(), d_x.as<bf16>(), d_w.as<bf16>(),
                       d_rstd.get(), N, C, w_offset, s.data(), s.size(), stream_);
  EXPECT_LE(rel_l2(got(d_out), out), kTol);
  EXPECT_LE(rel_l2(d_rstd.download(), rstd), kTol);
  EXPECT_LE(rel_l2(got(d_dx), dx), kTol);
  EXPECT_LE(rel_l2(d_dw.download(), dw), kTol);
}

INSTANTIATE_TEST_SUITE_P(Norms, CudaRmsNormShapes,
                         ::testing::Values(NormCase{"gemma_offset", 200, 384, 1.0f, 0.1f},
                                           NormCase{"per_head_q", 100 * 8, 128, 0.0f, 1.0f},
                                           NormCase{"per_head_k_offset", 100 * 2, 64, 1.0f, 0.1f}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST_F(CudaVsCpu, Linear) {
  SEED_TRACE();
  const int N = 96, IC = 256, OC = 160;
  kc::Gemm gemm(*device_);
  const auto x = inputs(std::size_t(N) * IC), w = inputs(std::size_t(OC) * IC, 0.05f);
  const auto dout = inputs(std::size_t(N) * OC), dx0 = inputs(x.size()), dw0 = inputs(w.size());
  std::vector<float> out(std::size_t(N) * OC), dx = dx0, dw = dw0;
  cpu::linear_forward(out.data(), x.data(), w.data(), N, IC, OC);
  cpu::linear_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), N, IC, OC);

  DeviceBuffer<cpu::bf16_t> d_x(to_bf16(x)), d_w(to_bf16(w)), d_dout(to_bf16(dout)), d_out(out.size()),
      d_dx(to_bf16(dx0));
  DeviceBuffer<float> d_dw(dw0);
  d_out.poison();
  kc::linear_forward(gemm, d_out.as<bf16>(), d_x.as<bf16>(), d_w.as<bf16>(), N, IC, OC, stream_);
  kc::linear_backward(gemm, d_dx.as<bf16>(), d_dw.get(), d_dout.as<bf16>(), d_x.as<bf16>(), d_w.as<bf16>(), N,
                      IC, OC, stream_);
  EXPECT_LE(rel_l2(got(d_out), out), kTol);
  EXPECT_LE(rel_l2(got(d_dx), dx), kTol);
  EXPECT_LE(rel_l2(d_dw.download(), dw), kTol);
}

TEST_F(CudaVsCpu, RotaryEmbedding) {
  SEED_TRACE();
  const int B = 2, T = 33, H = 4, HD = 64;
  const float theta = 500000.0f;
  std::vector<float> cos(T * HD / 2), sin(T * HD / 2);
  cpu::rope_cache(cos.data(), sin.data(), T, HD, theta);
  const auto x = inputs(std::size_t(B) * T * H * HD), dout = inputs(x.size());
  std::vector<float> out(x.size()), dx(x.size());
  cpu::rope_forward(out.data(), x.data(), cos.data(), sin.data(), B, T, H, HD);
  cpu::rope_backward(dx.data(), dout.data(), cos.data(), sin.data(), B, T, H, HD);

  DeviceBuffer<float> d_cos(cos.size()), d_sin(sin.size());
  d_cos.poison();
  d_sin.poison();
  std::vector<float> inv_freq(std::size_t(HD / 2));
  cpu::rope_inv_freq(inv_freq.data(), HD, theta);
  kc::rope_cache(d_cos.get(), d_sin.get(), T, HD, inv_freq.data(), stream_);
  EXPECT_EQ(d_cos.download(), cos);
  EXPECT_EQ(d_sin.download(), sin);
  DeviceBuffer<cpu::bf16_t> d_x(to_bf16(x)), d_dout(to_bf16(dout)), d_out(x.size()), d_dx(x.size());
  d_out.poison();
  d_dx.poison();
  kc::rope_forward(d_out.as<bf16>(), d_x.as<bf16>(), d_cos.get(), d_sin.get(), B, T, H, HD, nullptr, stream_);
  kc::rope_backward(d_dx.as<bf16>(), d_dout.as<bf16>(), d_cos.get(), d_sin.get(), B, T, H, HD, nullptr,
                    stream_);
  EXPECT_LE(rel_l2(got(d_out), out), kTol);
  EXPECT_LE(rel_l2(got(d_dx), dx), kTol);
}

// Query and key/value heads, and the sliding window (0: causal; 1: each query sees itself; 64 > T: causal).
struct AttentionCase {
  int nh, nkv, window;
};
class CudaAttention : public CudaVsCpu, public ::testing::WithParamInterface<AttentionCase> {};

TEST_P(CudaAttention, MatchesCpu) {
  SEED_TRACE();
  const int B = 2, T = 40, HD = 32, NH = GetParam().nh, NKV = GetParam().nkv, W = GetParam().window;
  const auto q = inputs(std::size_t(B) * T * NH * HD), k = inputs(std::size_t(B) * T * NKV * HD);
  const auto v = inputs(k.size()), dout = inputs(q.size());
  const std::size_t att_n = std::size_t(B) * NH * T * T;
  std::vector<float> out(q.size()), att(att_n), scratch(att_n), dq(q.size()), dk(k.size()), dv(v.size());
  cpu::attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), B, T, NH, NKV, HD, W);
  cpu::attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), dout.data(), q.data(), k.data(),
                          v.data(), out.data(), att.data(), B, T, NH, NKV, HD, W);

  DeviceBuffer<cpu::bf16_t> d_q(to_bf16(q)), d_k(to_bf16(k)), d_v(to_bf16(v)), d_dout(to_bf16(dout));
  DeviceBuffer<cpu::bf16_t> d_out(q.size()), d_dq(q.size()), d_dk(k.size()), d_dv(v.size());
  DeviceBuffer<float> d_att(att_n), d_scratch(att_n);
  for (auto* b : {&d_out, &d_dq, &d_dk, &d_dv}) b->poison();
  d_att.poison();
  d_scratch.poison();
  kc::attention_forward(d_out.as<bf16>(), d_att.get(), d_q.as<bf16>(), d_k.as<bf16>(), d_v.as<bf16>(), B, T,
                        NH, NKV, HD, W, nullptr, stream_);
  kc::attention_backward(d_dq.as<bf16>(), d_dk.as<bf16>(), d_dv.as<bf16>(), d_scratch.get(),
                         d_dout.as<bf16>(), d_q.as<bf16>(), d_k.as<bf16>(), d_v.as<bf16>(), d_out.as<bf16>(),
                         d_att.get(), B, T, NH, NKV, HD, W, nullptr, stream_);
  EXPECT_LE(rel_l2(got(d_out), out), kTol);
  EXPECT_LE(rel_l2(d_att.download(), att), kTol);
  EXPECT_LE(rel_l2(got(d_dq), dq), kTol);
  EXPECT_LE(rel_l2(got(d_dk), dk), kTol);
  EXPECT_LE(rel_l2(got(d_dv), dv), kTol);
}

// Packed documents (kernels/cpu's Note [Document masks]): the own kernel's mask and rope with positions
// against the CPU, with and without a window. Row 0 holds documents of 13, 1 and 26 tokens, row 1 of 40.
TEST_F(CudaVsCpu, AttentionAndRopeWithDocuments) {
  SEED_TRACE();
  const int B = 2, T = 40, HD = 32, NH = 8, NKV = 2;
  std::vector<std::int32_t> pos;
  for (int n : {13, 1, 26, 40})
    for (int p = 0; p < n; ++p) pos.push_back(p);
  DeviceBuffer<std::int32_t> d_pos(pos);
  const auto q = inputs(std::size_t(B) * T * NH * HD), k = inputs(std::size_t(B) * T * NKV * HD);
  const auto v = inputs(k.size()), dout = inputs(q.size());
  for (const int W : {0, 7}) {
    SCOPED_TRACE("window " + std::to_string(W));
    const std::size_t att_n = std::size_t(B) * NH * T * T;
    std::vector<float> out(q.size()), att(att_n), scratch(att_n), dq(q.size()), dk(k.size()), dv(v.size());
    cpu::attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), B, T, NH, NKV, HD, W,
                           pos.data());
    cpu::attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), dout.data(), q.data(), k.data(),
                            v.data(), out.data(), att.data(), B, T, NH, NKV, HD, W, pos.data());
    DeviceBuffer<cpu::bf16_t> d_q(to_bf16(q)), d_k(to_bf16(k)), d_v(to_bf16(v)), d_dout(to_bf16(dout));
    DeviceBuffer<cpu::bf16_t> d_out(q.size()), d_dq(q.size()), d_dk(k.size()), d_dv(v.size());
    DeviceBuffer<float> d_att(att_n), d_scratch(att_n);
    for (auto* b : {&d_out, &d_dq, &d_dk, &d_dv}) b->poison();
    d_att.poison();
    d_scratch.poison();
    kc::attention_forward(d_out.as<bf16>(), d_att.get(), d_q.as<bf16>(), d_k.as<bf16>(), d_v.as<bf16>(), B, T,
                          NH, NKV, HD, W, d_pos.get(), stream_);
    kc::attention_backward(d_dq.as<bf16>(), d_dk.as<bf16>(), d_dv.as<bf16>(), d_scratch.get(),
                           d_dout.as<bf16>(), d_q.as<bf16>(), d_k.as<bf16>(), d_v.as<bf16>(),
                           d_out.as<bf16>(), d_att.get(), B, T, NH, NKV, HD, W, d_pos.get(), stream_);
    EXPECT_LE(rel_l2(got(d_out), out), kTol);
    EXPECT_LE(rel_l2(d_att.download(), att), kTol);
    EXPECT_LE(rel_l2(got(d_dq), dq), kTol);
    EXPECT_LE(rel_l2(got(d_dk), dk), kTol);
    EXPECT_LE(rel_l2(got(d_dv), dv), kTol);
  }
  const int H = NH;
  std::vector<float> cos(std::size_t(T) * HD / 2), sin(cos.size()), rout(q.size()), rdx(q.size());
  cpu::rope_cache(cos.data(), sin.data(), T, HD, 10000.0f);
  cpu::rope_forward(rout.data(), q.data(), cos.data(), sin.data(), B, T, H, HD, pos.data());
  cpu::rope_backward(rdx.data(), dout.data(), cos.data(), sin.data(), B, T, H, HD, pos.data());
  DeviceBuffer<float> d_cos(cos), d_sin(sin);
  DeviceBuffer<cpu::bf16_t> d_x(to_bf16(q)), d_g(to_bf16(dout)), d_rout(q.size()), d_rdx(q.size());
  d_rout.poison();
  d_rdx.poison();
  kc::rope_forward(d_rout.as<bf16>(), d_x.as<bf16>(), d_cos.get(), d_sin.get(), B, T, H, HD, d_pos.get(),
                   stream_);
  kc::rope_backward(d_rdx.as<bf16>(), d_g.as<bf16>(), d_cos.get(), d_sin.get(), B, T, H, HD, d_pos.get(),
                    stream_);
  EXPECT_LE(rel_l2(got(d_rout), rout), kTol);
  EXPECT_LE(rel_l2(got(d_rdx), rdx), kTol);
}

INSTANTIATE_TEST_SUITE_P(Heads, CudaAttention,
                         ::testing::Values(AttentionCase{4, 4, 0}, AttentionCase{8, 2, 0},
                                           AttentionCase{6, 1, 0}, AttentionCase{8, 2, 7},
                                           AttentionCase{6, 1, 1}, AttentionCase{4, 4, 64}),
                         [](const auto& info) {
                           return "nh" + std::to_string(info.param.nh) + "_nkv" +
                                  std::to_string(info.param.nkv) +
                                  (info.param.window ? "_window" + std::to_string(info.param.window) : "");
                         });

TEST_F(CudaVsCpu, SwiGlu) {
  SEED_TRACE();
  const std::size_t n = 100003;
  const auto gate = inputs(n, 2.0f), up = inputs(n), dout = inputs(n);
  std::vector<float> out(n), dgate(n), dup(n);
  cpu::swiglu_forward(out.data(), gate.data(), up.data(), n);
  cpu::swiglu_backward(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), n);

  DeviceBuffer<cpu::bf16_t> d_gate(to_bf16(gate)), d_up(to_bf16(up)), d_dout(to_bf16(dout)), d_out(n),
      d_dgate(n), d_dup(n);
  for (auto* b : {&d_out, &d_dgate, &d_dup}) b->poison();
  kc::swiglu_forward(d_out.as<bf16>(), d_gate.as<bf16>(), d_up.as<bf16>(), n, stream_);
  kc::swiglu_backward(d_dgate.as<bf16>(), d_dup.as<bf16>(), d_dout.as<bf16>(), d_gate.as<bf16>(),
                      d_up.as<bf16>(), n, stream_);
  EXPECT_LE(rel_l2(got(d_out), out), kTol);
  EXPECT_LE(rel_l2(got(d_dgate), dgate), kTol);
  EXPECT_LE(rel_l2(got(d_dup), dup), kTol);
}

TEST_F(CudaVsCpu, Residual) {
  SEED_TRACE();
  const std::size_t n = 70001;
  const auto a = inputs(n), b = inputs(n), dout = inputs(n), da0 = inputs(n), db0 = inputs(n);
  std::vector<float> out(n), da = da0, db = db0;
  cpu::residual_forward(out.data(), a.data(), b.data(), n);
  cpu::residual_backward(da.data(), db.data(), dout.data(), n);

  DeviceBuffer<cpu::bf16_t> d_a(to_bf16(a)), d_b(to_bf16(b)), d_dout(to_bf16(dout)), d_out(n),
      d_da(to_bf16(da0)), d_db(to_bf16(db0));
  d_out.poison();
  kc::residual_forward(d_out.as<bf16>(), d_a.as<bf16>(), d_b.as<bf16>(), n, stream_);
  kc::residual_backward(d_da.as<bf16>(), d_db.as<bf16>(), d_dout.as<bf16>(), n, stream_);
  EXPECT_LE(rel_l2(got(d_out), out), kTol);
  EXPECT_LE(rel_l2(got(d_da), da), kTol);
  EXPECT_LE(rel_l2(got(d_db), db), kTol);
}

// Dropout: the CPU's bf16 dropout bit for bit (same mask, factor and rounding), over many blocks and a
// partial last group, out of place and in place.
TEST_F(CudaVsCpu, DropoutIsTheCpusBitForBit) {
  SEED_TRACE();
  const std::size_t n = 100003;
  const std::vector<cpu::bf16_t> x = to_bf16(inputs(n));
  for (double p : {0.0, 0.1, 0.5}) {
    const std::uint64_t key = next_seed();
    std::vector<cpu::bf16_t> want(n);
    cpu::dropout(want.data(), x.data(), n, p, key);
    DeviceBuffer<cpu::bf16_t> d_x(x), d_out(n), d_in_place(x);
    d_out.poison();
    kc::dropout(d_out.as<bf16>(), d_x.as<bf16>(), n, p, key, stream_);
    kc::dropout(d_in_place.as<bf16>(), d_in_place.as<bf16>(), n, p, key, stream_);
    EXPECT_EQ(d_out.download(), want) << "p " << p;
    EXPECT_EQ(d_in_place.download(), want) << "p " << p << " in place";
  }
}

TEST_F(CudaVsCpu, GeGlu) {
  SEED_TRACE();
  const std::size_t n = 100003;
  const auto gate = inputs(n, 2.0f), up = inputs(n), dout = inputs(n);
  std::vector<float> out(n), dgate(n), dup(n);
  cpu::geglu_forward(out.data(), gate.data(), up.data(), n);
  cpu::geglu_backward(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), n);

  DeviceBuffer<cpu::bf16_t> d_gate(to_bf16(gate)), d_up(to_bf16(up)), d_dout(to_bf16(dout)), d_out(n),
      d_dgate(n), d_dup(n);
  for (auto* b : {&d_out, &d_dgate, &d_dup}) b->poison();
  kc::geglu_forward(d_out.as<bf16>(), d_gate.as<bf16>(), d_up.as<bf16>(), n, stream_);
  kc::geglu_backward(d_dgate.as<bf16>(), d_dup.as<bf16>(), d_dout.as<bf16>(), d_gate.as<bf16>(),
                     d_up.as<bf16>(), n, stream_);
  EXPECT_LE(rel_l2(got(d_out), out), kTol);
  EXPECT_LE(rel_l2(got(d_dgate), dgate), kTol);
  EXPECT_LE(rel_l2(got(d_dup), dup), kTol);
}

// In place (dgate == gate, dup == up), as the model's backward runs it: the bits of separate outputs.
TEST_F(CudaVsCpu, GeGluBackwardInPlaceEqualsSeparateOutputs) {
  SEED_TRACE();
  const std::size_t n = 10001;
  const auto gate = inputs(n, 2.0f), up = inputs(n), dout = inputs(n);
  DeviceBuffer<cpu::bf16_t> d_gate(to_bf16(gate)), d_up(to_bf16(up)), d_dout(to_bf16(dout)), d_dgate(n),
      d_dup(n);
  kc::geglu_backward(d_dgate.as<bf16>(), d_dup.as<bf16>(), d_dout.as<bf16>(), d_gate.as<bf16>(),
                     d_up.as<bf16>(), n, stream_);
  kc::geglu_backward(d_gate.as<bf16>(), d_up.as<bf16>(), d_dout.as<bf16>(), d_gate.as<bf16>(),
                     d_up.as<bf16>(), n, stream_);
  EXPECT_EQ(d_gate.download(), d_dgate.download());
  EXPECT_EQ(d_up.download(), d_dup.download());
}

// N and OC not multiples of the vector width or the row block, so rows wrap inside a thread's group and
// the last row block is partial.
TEST_F(CudaVsCpu, Bias) {
  SEED_TRACE();
  const int N = 301, OC = 203;
  const auto x = inputs(std::size_t(N) * OC), b = inputs(OC), dout = inputs(x.size()), db0 = inputs(OC);
  std::vector<float> out = x, db = db0;
  cpu::bias_forward(out.data(), b.data(), N, OC);
  cpu::bias_backward(db.data(), dout.data(), N, OC);

  DeviceBuffer<cpu::bf16_t> d_out(to_bf16(x)), d_b(to_bf16(b)), d_dout(to_bf16(dout));
  DeviceBuffer<float> d_db(db0);
  kc::bias_forward(d_out.as<bf16>(), d_b.as<bf16>(), N, OC, stream_);
  auto s = scratch(kc::bias_backward_scratch_bytes(N, OC));
  kc::bias_backward(d_db.get(), d_dout.as<bf16>(), N, OC, s.data(), s.size(), stream_);
  EXPECT_LE(rel_l2(got(d_out), out), kTol);
  EXPECT_LE(rel_l2(d_db.download(), db), kTol);
}

// A bias gradient on a training shape: the same bits on every run (no atomics; a fixed summation order).
TEST_F(CudaVsCpu, BiasBackwardIsBitIdenticalRunToRun) {
  SEED_TRACE();
  const int N = 4096, OC = 896;
  const auto dout = inputs(std::size_t(N) * OC), db0 = inputs(OC);
  DeviceBuffer<cpu::bf16_t> d_dout(to_bf16(dout));
  auto s = scratch(kc::bias_backward_scratch_bytes(N, OC));
  std::vector<float> first;
  for (int run = 0; run < 3; ++run) {
    DeviceBuffer<float> d_db(db0);
    kc::bias_backward(d_db.get(), d_dout.as<bf16>(), N, OC, s.data(), s.size(), stream_);
    const auto db = d_db.download();
    if (run == 0)
      first = db;
    else
      EXPECT_EQ(0, std::memcmp(db.data(), first.data(), db.size() * sizeof(float))) << "run " << run;
  }
}

class CudaCrossEntropy : public CudaVsCpu, public ::testing::WithParamInterface<bool> {};

TEST_P(CudaCrossEntropy, MatchesCpu) {
  SEED_TRACE();
  const bool in_place = GetParam();
  const int N = 48, V = 3001;
  const float grad_scale = 0.5f;
  std::vector<std::int32_t> targets(N);
  std::mt19937 rng{static_cast<unsigned>(next_seed())};
  for (int i = 0; i < N; ++i) targets[i] = i % 7 == 3 ? -1 : int(rng() % V);
  const auto logits = inputs(std::size_t(N) * V, 3.0f);
  std::vector<float> dlogits(logits.size()), losses(N);
  const float loss = cpu::cross_entropy_forward_backward(dlogits.data(), losses.data(), logits.data(),
                                                         targets.data(), N, V, grad_scale);

  DeviceBuffer<std::int32_t> d_targets(targets);
  DeviceBuffer<cpu::bf16_t> d_logits(to_bf16(logits)), d_dlogits(logits.size());
  DeviceBuffer<float> d_losses(N), d_mean(1);
  d_dlogits.poison();
  d_losses.poison();
  d_mean.poison();
  bf16* dl = in_place ? d_logits.as<bf16>() : d_dlogits.as<bf16>();
  kc::cross_entropy_forward_backward(dl, d_losses.get(), d_mean.get(), d_logits.as<bf16>(), d_targets.get(),
                                     N, V, grad_scale, stream_);
  EXPECT_LE(rel_l2(d_losses.download(), losses), kTol);
  EXPECT_LE(rel_l2(d_mean.download(), std::vector<float>{loss}), kTol);
  EXPECT_LE(rel_l2(got(in_place ? d_logits : d_dlogits), dlogits), kTol);
}

INSTANTIATE_TEST_SUITE_P(Gradient, CudaCrossEntropy, ::testing::Values(false, true),
                         [](const auto& info) { return std::string(info.param ? "in_place" : "separate"); });

// The loss in row chunks (Note [The loss in row chunks] in model/llama.cpp): a chunk of a longer batch,
// divided by the whole batch's count of targets (n_valid), gives each row's loss and gradient as the CPU's
// does, and its share of the mean.
TEST_F(CudaVsCpu, CrossEntropyOfAChunkDividesByTheBatchsCount) {
  SEED_TRACE();
  const int N = 40, V = 2053, n_valid = 97;  // this chunk's rows of a batch counting 97 targets
  const float grad_scale = 0.25f;
  std::vector<std::int32_t> targets(N);
  std::mt19937 rng{static_cast<unsigned>(next_seed())};
  for (int i = 0; i < N; ++i) targets[i] = i % 5 == 2 ? -100 : int(rng() % V);
  const auto logits = inputs(std::size_t(N) * V, 3.0f);
  std::vector<float> dlogits(logits.size()), losses(N);
  const float share = cpu::cross_entropy_forward_backward(dlogits.data(), losses.data(), logits.data(),
                                                          targets.data(), N, V, grad_scale, n_valid);
  DeviceBuffer<std::int32_t> d_targets(targets);
  DeviceBuffer<cpu::bf16_t> d_logits(to_bf16(logits));
  DeviceBuffer<float> d_losses(N), d_mean(1);
  d_losses.poison();
  d_mean.poison();
  kc::cross_entropy_forward_backward(d_logits.as<bf16>(), d_losses.get(), d_mean.get(), d_logits.as<bf16>(),
                                     d_targets.get(), N, V, grad_scale, stream_, n_valid);
  EXPECT_LE(rel_l2(d_losses.download(), losses), kTol);
  EXPECT_LE(rel_l2(d_mean.download(), std::vector<float>{share}), kTol);
  EXPECT_LE(rel_l2(got(d_logits), dlogits), kTol);
}

}  // namespace
}  // namespace strata::kernels::test
