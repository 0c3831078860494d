// The compute interface (kernels/ops.h) on every backend against kernels/cpu called directly: on the host
// backend bit for bit (it is those functions); with bf16 activations — cuda (skipped without a GPU), and
// the host backend with OpsOptions.matmul = bf16 ("host_bf16") — within the same bf16 bound per op.
// Also: make_ops picks the backend's implementation, ops run in stream order, misuse is refused by name.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/attention_fused.h"
#include "kernels/cpu/ops.h"
#include "kernels/ops.h"
#include "tests/common/stream_gate.h"
#include "tests/core/device_fixture.h"
#include "tests/kernels/reference.h"

namespace strata::kernels {
namespace {

namespace kc = kernels::cpu;
using test::random_floats;
using test::rel_l2;

class Compute : public strata::testing::DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped()) return;
    dev = host_bf16() ? open_device({.backend = "host", .ordinal = 0, .memory_cap = 0}) : open();
    stream = dev->create_stream("compute-test");
    ops = make_ops(*dev, *stream, {.matmul = host_bf16() ? DType::bf16 : DType::fp32});
    A = ops->caps().activation;
  }
  // Work still queued (a memset of a buffer never read) must end before the buffers go.
  void TearDown() override {
    if (stream) stream->synchronize();
  }

  // The host backend with bf16 activations (OpsOptions.matmul = bf16).
  bool host_bf16() const { return GetParam() == "host_bf16"; }
  // Values as the activation dtype holds them (so the reference sees the device's inputs).
  std::vector<float> act(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
    std::vector<float> v = random_floats(n, seed, scale);
    if (A == DType::bf16)
      for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
    return v;
  }
  Tensor put(const std::vector<float>& v, DType t) {
    Tensor x = alloc(v.size(), t);
    std::vector<std::uint16_t> h;
    const void* src = v.data();
    if (t == DType::bf16 || t == DType::fp16) {
      h.resize(v.size());
      for (std::size_t i = 0; i < v.size(); ++i)
        h[i] = t == DType::bf16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
      src = h.data();
    }
    copy_in(x, src);
    return x;
  }
  Tensor put_i32(const std::vector<std::int32_t>& v) {
    Tensor x = alloc(v.size(), DType::i32);
    copy_in(x, v.data());
    return x;
  }
  Tensor alloc(std::size_t n, DType t) {
    bufs.emplace_back(*dev, std::max<std::size_t>(1, n * dtype_bytes(t)), "compute test");
    Tensor x{bufs.back().data(), t, n};
    stream->memset_async(x.data, 0, std::max<std::size_t>(1, x.bytes()));
    return x;
  }
  std::vector<float> get(Tensor x) {
    std::vector<char> raw(x.bytes());
    stream->copy_async(raw.data(), x.data, raw.size(), CopyKind::device_to_host);
    stream->synchronize();
    if (x.dtype != DType::fp32 && x.dtype != DType::bf16 && x.dtype != DType::fp16)
      ADD_FAILURE() << "get() of " << dtype_name(x.dtype);
    return test::widen(raw.data(), x.dtype, x.numel);
  }
  // Host: the same bits as kernels/cpu. cuda and host_bf16: relative L2 error under `bound`.
  void expect_matches(const std::vector<float>& got, const std::vector<float>& want, const char* what,
                      double bound = 2e-2) {
    ASSERT_EQ(got.size(), want.size()) << what;
    if (GetParam() == "host") {
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << what << " differs";
    } else {
      EXPECT_LT(rel_l2(got, want), bound) << what;
    }
  }

  std::unique_ptr<Device> dev;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<Ops> ops;
  DType A = DType::fp32;
  std::vector<DeviceBuffer> bufs;

 private:
  void copy_in(Tensor x, const void* src) {
    stream->copy_async(x.data, src, x.bytes(), CopyKind::host_to_device);
    stream->synchronize();
  }
};

TEST_P(Compute, MakeOpsPicksTheBackendsImplementation) {
  EXPECT_EQ(ops->caps().backend, dev->caps().backend);
  EXPECT_FALSE(ops->caps().name.empty());
  EXPECT_EQ(ops->caps().activation, GetParam() == "host" ? DType::fp32 : DType::bf16);
  EXPECT_EQ(&ops->stream(), stream.get());
}

TEST_P(Compute, LinearForwardAndBackwardMatchTheCpuOps) {
  const int N = 6, IC = 40, OC = 24;
  auto x = act(N * IC, 1), w = act(OC * IC, 2, 0.2f), dout = act(N * OC, 3);
  std::vector<float> out(N * OC), dx(N * IC, 0.0f), dw(OC * IC, 0.0f);
  kc::linear_forward(out.data(), x.data(), w.data(), N, IC, OC);
  kc::linear_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), N, IC, OC);
  Tensor to = alloc(out.size(), A), tdx = alloc(dx.size(), A), tdw = alloc(dw.size(), DType::fp32);
  Tensor tx = put(x, A), tw = put(w, A), tdout = put(dout, A);
  ops->linear_forward(to, tx, tw, N, IC, OC);
  ops->linear_backward(tdx, tdw, tdout, tx, tw, N, IC, OC);
  expect_matches(get(to), out, "linear out");
  expect_matches(get(tdx), dx, "linear dx");
  expect_matches(get(tdw), dw, "linear dw");
}

TEST_P(Compute, RmsnormForwardAndBackwardMatchTheCpuOps) {
  const int N = 5, C = 48;
  auto x = act(N * C, 4), w = act(C, 5), dout = act(N * C, 6);
  std::vector<float> out(N * C), rstd(N), dx(N * C, 0.0f), dw(C, 0.0f);
  kc::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
  kc::rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
  Tensor to = alloc(out.size(), A), tr = alloc(N, DType::fp32), tdx = alloc(dx.size(), A),
         tdw = alloc(C, DType::fp32), tx = put(x, A), tw = put(w, A), td = put(dout, A);
  ops->rmsnorm_forward(to, tr, tx, tw, N, C, 1e-5f);
  ops->rmsnorm_backward(tdx, tdw, td, tx, tw, tr, N, C);
  expect_matches(get(to), out, "rmsnorm out");
  expect_matches(get(tr), rstd, "rstd", 1e-3);
  expect_matches(get(tdx), dx, "rmsnorm dx");
  expect_matches(get(tdw), dw, "rmsnorm dw");
}

TEST_P(Compute, EmbeddingForwardAndBackwardMatchTheCpuOps) {
  const int N = 7, C = 16, V = 11;
  auto wte = act(V * C, 7), dout = act(N * C, 8);
  const std::vector<std::int32_t> tok = {3, 0, 10, 3, 5, 3, 9};
  std::vector<float> out(N * C), dwte(V * C, 0.0f);
  kc::embedding_forward(out.data(), tok.data(), wte.data(), N, C, V);
  kc::embedding_backward(dwte.data(), dout.data(), tok.data(), N, C, V);
  Tensor to = alloc(out.size(), A), tdw = alloc(dwte.size(), DType::fp32), tt = put_i32(tok),
         tw = put(wte, A), td = put(dout, A);
  ops->embedding_forward(to, tt, tw, N, C, V);
  ops->embedding_backward(tdw, td, tt, N, C, V);
  expect_matches(get(to), out, "embedding out");
  expect_matches(get(tdw), dwte, "embedding dwte");
}

TEST_P(Compute, RopeAndAttentionMatchTheCpuOps) {
  const int B = 2, T = 5, NH = 4, NKV = 2, HD = 8;
  const std::size_t nq = std::size_t(B) * T * NH * HD, nkv = std::size_t(B) * T * NKV * HD;
  auto q = act(nq, 9), k = act(nkv, 10), v = act(nkv, 11), dout = act(nq, 12);
  std::vector<float> cos(T * HD / 2), sin(T * HD / 2), qr(nq), out(nq), att(std::size_t(B) * NH * T * T),
      scratch(att.size()), dq(nq), dk(nkv), dv(nkv);
  kc::rope_cache(cos.data(), sin.data(), T, HD, 10000.0f);
  kc::rope_forward(qr.data(), q.data(), cos.data(), sin.data(), B, T, NH, HD);
  kc::attention_forward(out.data(), att.data(), qr.data(), k.data(), v.data(), B, T, NH, NKV, HD);
  kc::attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), dout.data(), qr.data(), k.data(),
                         v.data(), out.data(), att.data(), B, T, NH, NKV, HD);

  const AttentionSizes as = ops->attention_sizes(B, T, NH, NKV, HD);
  Tensor tc = alloc(cos.size(), DType::fp32), ts = alloc(sin.size(), DType::fp32), tq = put(q, A),
         tqr = alloc(nq, A), tk = put(k, A), tv = put(v, A), to = alloc(nq, A),
         tsaved = alloc(as.saved, DType::fp32), tscr = alloc(as.scratch, DType::fp32), tdo = put(dout, A),
         tdq = alloc(nq, A), tdk = alloc(nkv, A), tdv = alloc(nkv, A);
  ops->rope_cache(tc, ts, T, HD, 10000.0f);
  ops->rope_forward(tqr, tq, tc, ts, B, T, NH, HD);
  ops->attention_forward(to, tsaved, tqr, tk, tv, B, T, NH, NKV, HD);
  // The backward from the CPU's rotated q (as the device rounded it), so each op is compared alone.
  ops->attention_backward(tdq, tdk, tdv, tscr, tdo, tqr, tk, tv, to, tsaved, B, T, NH, NKV, HD);
  expect_matches(get(tc), cos, "rope cos", 1e-6);
  expect_matches(get(tqr), qr, "rope q");
  expect_matches(get(to), out, "attention out");
  expect_matches(get(tdq), dq, "attention dq", 3e-2);
  expect_matches(get(tdk), dk, "attention dk", 3e-2);
  expect_matches(get(tdv), dv, "attention dv", 3e-2);
}

// A sliding window (kernels/ops.h's `window`) reaches the implementation: the same window on kernels/cpu.
TEST_P(Compute, AttentionInASlidingWindowMatchesTheCpuOps) {
  const int B = 2, T = 12, NH = 4, NKV = 2, HD = 8, W = 5;
  const std::size_t nq = std::size_t(B) * T * NH * HD, nkv = std::size_t(B) * T * NKV * HD;
  auto q = act(nq, 16), k = act(nkv, 17), v = act(nkv, 18), dout = act(nq, 19);
  std::vector<float> out(nq), att(std::size_t(B) * NH * T * T), scratch(att.size()), dq(nq), dk(nkv), dv(nkv);
  kc::attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), B, T, NH, NKV, HD, W);
  kc::attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), dout.data(), q.data(), k.data(),
                         v.data(), out.data(), att.data(), B, T, NH, NKV, HD, W);
  const AttentionSizes as = ops->attention_sizes(B, T, NH, NKV, HD, W);
  Tensor tq = put(q, A), tk = put(k, A), tv = put(v, A), to = alloc(nq, A),
         tsaved = alloc(as.saved, DType::fp32), tscr = alloc(as.scratch, DType::fp32), tdo = put(dout, A),
         tdq = alloc(nq, A), tdk = alloc(nkv, A), tdv = alloc(nkv, A);
  ops->attention_forward(to, tsaved, tq, tk, tv, B, T, NH, NKV, HD, W);
  ops->attention_backward(tdq, tdk, tdv, tscr, tdo, tq, tk, tv, to, tsaved, B, T, NH, NKV, HD, W);
  EXPECT_NE(ops->attention_path(B, T, NH, NKV, HD, W).find("sliding window 5"), std::string::npos)
      << ops->attention_path(B, T, NH, NKV, HD, W);
  expect_matches(get(to), out, "attention out");
  expect_matches(get(tdq), dq, "attention dq", 3e-2);
  expect_matches(get(tdk), dk, "attention dk", 3e-2);
  expect_matches(get(tdv), dv, "attention dv", 3e-2);
}

// With bf16 activations on the host backend the backward reads the forward's output from its caller:
// saved is the row statistics alone (B*NH*T), the gradients are kernels/cpu's fused attention given that
// output, bit for bit, and another out changes dq and dk (through D = rowsum(dout * out)) but not dv.
TEST_P(Compute, Bf16AttentionBackwardReadsTheForwardsOutputFromTheCaller) {
  if (!host_bf16()) GTEST_SKIP() << "the fused CPU attention runs on the host backend with bf16 activations";
  const int B = 2, T = 150, NH = 4, NKV = 2, HD = 16;
  const std::size_t nq = std::size_t(B) * T * NH * HD, nkv = std::size_t(B) * T * NKV * HD;
  const AttentionSizes as = ops->attention_sizes(B, T, NH, NKV, HD);
  EXPECT_EQ(as.saved, std::size_t(B) * NH * T) << "saved holds more than the row statistics";
  EXPECT_EQ(as.scratch, kc::attention_fused_scratch(B, T, NKV, HD));
  const auto q = act(nq, 30), k = act(nkv, 31), v = act(nkv, 32), dout = act(nq, 33);
  Tensor tq = put(q, A), tk = put(k, A), tv = put(v, A), tdo = put(dout, A), to = alloc(nq, A),
         tsaved = alloc(as.saved, DType::fp32), tscr = alloc(as.scratch, DType::fp32), tdq = alloc(nq, A),
         tdk = alloc(nkv, A), tdv = alloc(nkv, A);
  ops->attention_forward(to, tsaved, tq, tk, tv, B, T, NH, NKV, HD);
  ops->attention_backward(tdq, tdk, tdv, tscr, tdo, tq, tk, tv, to, tsaved, B, T, NH, NKV, HD);

  const auto bits = [](const std::vector<float>& x) {
    std::vector<kc::bf16_t> r(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) r[i] = f32_to_bf16(x[i]);
    return r;
  };
  const auto widen = [](const std::vector<kc::bf16_t>& x) {
    std::vector<float> r(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) r[i] = bf16_to_f32(x[i]);
    return r;
  };
  const std::vector<kc::bf16_t> bq = bits(q), bk = bits(k), bv = bits(v), bdo = bits(dout);
  std::vector<kc::bf16_t> out(nq), dq(nq), dk(nkv), dv(nkv);
  std::vector<float> saved(kc::attention_fused_saved(B, T, NH, HD)),
      scratch(kc::attention_fused_scratch(B, T, NKV, HD));
  kc::attention_fused_forward(out.data(), saved.data(), bq.data(), bk.data(), bv.data(), B, T, NH, NKV, HD);
  kc::attention_fused_backward(dq.data(), dk.data(), dv.data(), scratch.data(), bdo.data(), bq.data(),
                               bk.data(), bv.data(), out.data(), saved.data(), B, T, NH, NKV, HD);
  const std::vector<float> got_dq = get(tdq), got_dk = get(tdk), got_dv = get(tdv);
  EXPECT_EQ(get(to), widen(out));
  EXPECT_EQ(got_dq, widen(dq));
  EXPECT_EQ(got_dk, widen(dk));
  EXPECT_EQ(got_dv, widen(dv));

  // out = 0 (alloc zeroes it): D = 0.
  Tensor zero = alloc(nq, A), tdq2 = alloc(nq, A), tdk2 = alloc(nkv, A), tdv2 = alloc(nkv, A);
  ops->attention_backward(tdq2, tdk2, tdv2, tscr, tdo, tq, tk, tv, zero, tsaved, B, T, NH, NKV, HD);
  EXPECT_NE(get(tdq2), got_dq) << "dq does not depend on the out it was given";
  EXPECT_NE(get(tdk2), got_dk) << "dk does not depend on the out it was given";
  EXPECT_EQ(get(tdv2), got_dv);
}

TEST_P(Compute, SwigluAndResidualMatchTheCpuOps) {
  const std::size_t n = 300;
  auto g = act(n, 13), u = act(n, 14), d = act(n, 15);
  std::vector<float> out(n), dg(n), du(n), r(n), da(n, 0.0f);
  kc::swiglu_forward(out.data(), g.data(), u.data(), n);
  kc::swiglu_backward(dg.data(), du.data(), d.data(), g.data(), u.data(), n);
  kc::residual_forward(r.data(), g.data(), u.data(), n);
  kc::residual_backward(da.data(), nullptr, d.data(), n);
  Tensor tg = put(g, A), tu = put(u, A), td = put(d, A), to = alloc(n, A), tdg = alloc(n, A),
         tdu = alloc(n, A), tr = alloc(n, A), tda = alloc(n, A);
  ops->swiglu_forward(to, tg, tu);
  ops->swiglu_backward(tdg, tdu, td, tg, tu);
  ops->residual_forward(tr, tg, tu);
  ops->residual_backward(tda, Tensor{}, td);
  expect_matches(get(to), out, "swiglu out");
  expect_matches(get(tdg), dg, "swiglu dgate");
  expect_matches(get(tdu), du, "swiglu dup");
  expect_matches(get(tr), r, "residual out");
  expect_matches(get(tda), da, "residual da");
}

TEST_P(Compute, SwigluBackwardInPlaceOverGateAndUpEqualsTheSeparateOutputs) {
  const std::size_t n = 1000;  // not a multiple of any vector width
  auto g = act(n, 16), u = act(n, 17), d = act(n, 18);
  Tensor tg = put(g, A), tu = put(u, A), td = put(d, A), tdg = alloc(n, A), tdu = alloc(n, A);
  ops->swiglu_backward(tdg, tdu, td, tg, tu);
  ops->swiglu_backward(tg, tu, td, tg, tu);  // what LlamaModel's backward does
  const auto want_dg = get(tdg), want_du = get(tdu), got_dg = get(tg), got_du = get(tu);
  EXPECT_EQ(0, std::memcmp(got_dg.data(), want_dg.data(), n * sizeof(float))) << "dgate in place";
  EXPECT_EQ(0, std::memcmp(got_du.data(), want_du.data(), n * sizeof(float))) << "dup in place";
}

// Gemma's norm (w_offset 1).
TEST_P(Compute, RmsnormWithAWeightOffsetMatchesTheCpuOps) {
  const int N = 5, C = 48;
  auto x = act(N * C, 30), w = act(C, 31, 0.1f), dout = act(N * C, 32);
  std::vector<float> out(N * C), rstd(N), dx(N * C, 0.0f), dw(C, 0.0f);
  kc::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f, 1.0f);
  kc::rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C, 1.0f);
  Tensor to = alloc(out.size(), A), tr = alloc(N, DType::fp32), tdx = alloc(dx.size(), A),
         tdw = alloc(C, DType::fp32), tx = put(x, A), tw = put(w, A), td = put(dout, A);
  ops->rmsnorm_forward(to, tr, tx, tw, N, C, 1e-6f, 1.0f);
  ops->rmsnorm_backward(tdx, tdw, td, tx, tw, tr, N, C, 1.0f);
  expect_matches(get(to), out, "rmsnorm out");
  expect_matches(get(tr), rstd, "rstd", 1e-3);
  expect_matches(get(tdx), dx, "rmsnorm dx");
  expect_matches(get(tdw), dw, "rmsnorm dw");
}

// Qwen3's q/k norm: one RMSNorm of width HD per head, over the (N * NH, HD) rows of q.
TEST_P(Compute, PerHeadRmsnormMatchesTheCpuOps) {
  const int N = 6, NH = 4, HD = 32, rows = N * NH;
  auto q = act(rows * HD, 33), w = act(HD, 34), dout = act(rows * HD, 35);
  std::vector<float> out(q.size()), rstd(rows), dq(q.size(), 0.0f), dw(HD, 0.0f);
  kc::rmsnorm_forward(out.data(), rstd.data(), q.data(), w.data(), rows, HD, 1e-6f);
  kc::rmsnorm_backward(dq.data(), dw.data(), dout.data(), q.data(), w.data(), rstd.data(), rows, HD);
  Tensor to = alloc(out.size(), A), tr = alloc(rows, DType::fp32), tdq = alloc(dq.size(), A),
         tdw = alloc(HD, DType::fp32), tq = put(q, A), tw = put(w, A), td = put(dout, A);
  ops->rmsnorm_forward(to, tr, tq, tw, rows, HD, 1e-6f);
  ops->rmsnorm_backward(tdq, tdw, td, tq, tw, tr, rows, HD);
  expect_matches(get(to), out, "q_norm out");
  expect_matches(get(tr), rstd, "q_norm rstd", 1e-3);
  expect_matches(get(tdq), dq, "q_norm dq");
  expect_matches(get(tdw), dw, "q_norm dw");
}

TEST_P(Compute, BiasForwardAndBackwardMatchTheCpuOps) {
  const int N = 9, OC = 70;  // not a multiple of any vector width
  auto x = act(N * OC, 36), b = act(OC, 37), dout = act(N * OC, 38);
  std::vector<float> out = x, db(OC, 0.25f);
  kc::bias_forward(out.data(), b.data(), N, OC);
  kc::bias_backward(db.data(), dout.data(), N, OC);
  Tensor to = put(x, A), tb = put(b, A), td = put(dout, A),
         tdb = put(std::vector<float>(OC, 0.25f), DType::fp32);
  ops->bias_forward(to, tb, N, OC);
  ops->bias_backward(tdb, td, N, OC);
  expect_matches(get(to), out, "bias out");
  expect_matches(get(tdb), db, "bias db", 1e-2);
}

TEST_P(Compute, GegluForwardAndBackwardMatchTheCpuOps) {
  const std::size_t n = 300;
  auto g = act(n, 39, 2.0f), u = act(n, 40), d = act(n, 41);
  std::vector<float> out(n), dg(n), du(n);
  kc::geglu_forward(out.data(), g.data(), u.data(), n);
  kc::geglu_backward(dg.data(), du.data(), d.data(), g.data(), u.data(), n);
  Tensor tg = put(g, A), tu = put(u, A), td = put(d, A), to = alloc(n, A), tdg = alloc(n, A),
         tdu = alloc(n, A);
  ops->geglu_forward(to, tg, tu);
  ops->geglu_backward(tdg, tdu, td, tg, tu);
  expect_matches(get(to), out, "geglu out");
  expect_matches(get(tdg), dg, "geglu dgate");
  expect_matches(get(tdu), du, "geglu dup");
}

TEST_P(Compute, GegluBackwardInPlaceOverGateAndUpEqualsTheSeparateOutputs) {
  const std::size_t n = 1000;  // not a multiple of any vector width
  auto g = act(n, 42, 2.0f), u = act(n, 43), d = act(n, 44);
  Tensor tg = put(g, A), tu = put(u, A), td = put(d, A), tdg = alloc(n, A), tdu = alloc(n, A);
  ops->geglu_backward(tdg, tdu, td, tg, tu);
  ops->geglu_backward(tg, tu, td, tg, tu);
  const auto want_dg = get(tdg), want_du = get(tdu), got_dg = get(tg), got_du = get(tu);
  EXPECT_EQ(0, std::memcmp(got_dg.data(), want_dg.data(), n * sizeof(float))) << "dgate in place";
  EXPECT_EQ(0, std::memcmp(got_du.data(), want_du.data(), n * sizeof(float))) << "dup in place";
}

TEST_P(Compute, CrossEntropyLossAndGradientMatchTheCpuOps) {
  const int N = 6, V = 33;
  auto logits = act(N * V, 16, 2.0f);
  const std::vector<std::int32_t> tgt = {1, 32, -1, 0, 7, 7};
  std::vector<float> dl(N * V), losses(N);
  const float mean =
      kc::cross_entropy_forward_backward(dl.data(), losses.data(), logits.data(), tgt.data(), N, V, 0.5f);
  Tensor tl = put(logits, A), tdl = alloc(dl.size(), A), tlo = alloc(N, DType::fp32),
         tm = alloc(1, DType::fp32), tt = put_i32(tgt);
  ops->cross_entropy(tdl, tlo, tm, tl, tt, N, V, 0.5f);
  const float got = ops->read_f32(tm);
  if (GetParam() == "host")
    EXPECT_EQ(got, mean);
  else
    EXPECT_NEAR(got, mean, 1e-2 * std::abs(mean));
  expect_matches(get(tlo), losses, "per-row losses");
  expect_matches(get(tdl), dl, "dlogits");
}

TEST_P(Compute, CastsRoundExactlyAsCoreDtype) {
  std::vector<float> v = random_floats(1000, 17, 1e3f);
  v[0] = 65519.0f, v[1] = 70000.0f, v[2] = 1e-7f,
  v[3] = -0.0f;  // fp16 edge cases: rounding, overflow, subnormal
  Tensor src = put(v, DType::fp32), b = alloc(v.size(), DType::bf16), h = alloc(v.size(), DType::fp16),
         back = alloc(v.size(), DType::fp32);
  ops->cast(b, src);
  ops->cast(h, src);
  std::vector<float> want_b(v.size()), want_h(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    want_b[i] = bf16_to_f32(f32_to_bf16(v[i]));
    want_h[i] = f16_to_f32(f32_to_f16(v[i]));
  }
  ops->cast(back, b);
  EXPECT_EQ(0, std::memcmp(get(back).data(), want_b.data(), v.size() * 4)) << "fp32 -> bf16 -> fp32";
  ops->cast(back, h);
  EXPECT_EQ(0, std::memcmp(get(back).data(), want_h.data(), v.size() * 4)) << "fp32 -> fp16 -> fp32";
}

// fp16 <-> bf16 (the gather of fp16 working params into bf16 activations): widened exactly, rounded once.
TEST_P(Compute, CastsBetweenTheSixteenBitFormatsRoundOnceThroughFp32) {
  std::vector<float> v = random_floats(1000, 27, 1e3f);
  v[0] = 65504.0f, v[1] = 3e38f, v[2] = 1e-7f, v[3] = -0.0f, v[4] = 6.1e-5f;  // fp16 max, overflow, tiny
  std::vector<std::uint16_t> h(v.size()), b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) h[i] = f32_to_f16(v[i]), b[i] = f32_to_bf16(v[i]);
  std::vector<float> hv(v.size()), bv(v.size()), want_b(v.size()), want_h(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    hv[i] = f16_to_f32(h[i]), bv[i] = bf16_to_f32(b[i]);
    want_b[i] = bf16_to_f32(f32_to_bf16(hv[i]));
    want_h[i] = f16_to_f32(f32_to_f16(bv[i]));
  }
  Tensor th = put(hv, DType::fp16), tb = put(bv, DType::bf16), to_b = alloc(v.size(), DType::bf16),
         to_h = alloc(v.size(), DType::fp16);
  ops->cast(to_b, th);
  ops->cast(to_h, tb);
  EXPECT_EQ(0, std::memcmp(get(to_b).data(), want_b.data(), v.size() * 4)) << "fp16 -> bf16";
  EXPECT_EQ(0, std::memcmp(get(to_h).data(), want_h.data(), v.size() * 4)) << "bf16 -> fp16";
}

// The runtime role (the engine's copy streams): the helpers, no workspace, and a model op refused by name.
TEST_P(Compute, TheRuntimeRoleHasTheHelpersOnly) {
  auto s2 = dev->create_stream("runtime");
  const std::size_t before = dev->memory_stats().in_use;
  {
    std::unique_ptr<Ops> rt = make_ops(*dev, *s2, {.role = OpsRole::runtime});
    EXPECT_EQ(rt->device_bytes(), 0u);
    EXPECT_EQ(dev->memory_stats().in_use, before) << "a runtime-role object took device memory";
    std::vector<float> v = random_floats(64, 28);
    Tensor src = put(v, DType::fp32), dst = alloc(v.size(), A);
    stream->synchronize();  // the buffers' memsets ran on the test's stream
    rt->cast(dst, src);
    s2->synchronize();
    Tensor out = alloc(16, A), x = alloc(16, A), w = alloc(16, A);
    try {
      rt->linear_forward(out, x, w, 4, 4, 4);
      FAIL() << "a runtime-role object ran a matrix product";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("linear_forward"), std::string::npos) << e.what();
    }
  }
}

// An Ops object waits for the work it queued when it goes (its workspace and scratch outlive that work),
// so its owner destroys it before its stream. Held at a gate, the destruction cannot finish early.
TEST_P(Compute, DestroyingAnOpsObjectWaitsForItsWork) {
  auto s2 = dev->create_stream("destroyed-ops");
  std::unique_ptr<Ops> o = make_ops(*dev, *s2);
  Tensor x = alloc(256, DType::fp32);
  stream->synchronize();
  strata::test::StreamGate gate;
  gate.hold(*s2);
  o->scale(x, 2.0f);
  auto gone = std::async(std::launch::async, [&o] { o.reset(); });
  EXPECT_EQ(gone.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout)
      << "the object went while its work was still queued";
  gate.open();
  gone.get();
}

TEST_P(Compute, FillAddScaleNormAndNonFiniteCheckAgreeWithTheCpu) {
  std::vector<float> a = random_floats(5000, 18), b = random_floats(5000, 19);
  Tensor ta = put(a, DType::fp32), tb = put(b, DType::fp32), norm = alloc(8, DType::u8),
         flag = alloc(1, DType::i32);
  ops->add(ta, tb);
  ops->scale(ta, 0.25f);
  std::vector<float> want(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) want[i] = (a[i] + b[i]) * 0.25f;
  EXPECT_EQ(0, std::memcmp(get(ta).data(), want.data(), want.size() * 4)) << "add then scale";
  ops->squared_norm(norm, ta);
  const double n2 = kc::squared_norm(want.data(), want.size());
  if (GetParam() == "host")
    EXPECT_EQ(ops->read_f64(norm), n2);
  else
    EXPECT_NEAR(ops->read_f64(norm), n2, 1e-12 * n2);
  ops->nonfinite_check(flag, ta);
  EXPECT_EQ(ops->read_i32(flag), 0);
  ops->fill(tb, std::numeric_limits<float>::infinity());
  ops->nonfinite_check(flag, tb);
  EXPECT_EQ(ops->read_i32(flag), 1);
  ops->fill(tb, 1.5f);
  EXPECT_EQ(get(tb), std::vector<float>(b.size(), 1.5f));
}

// Gemma scales the embeddings on the residual stream (activation dtype) by sqrt(C): x * s rounded once to
// the activation dtype (core/dtype.h's rounding; exact fp32 on the host).
TEST_P(Compute, ScaleOfTheActivationDtypeRoundsOnceToIt) {
  const auto x = act(1001, 45, 3.0f);
  const float s = std::sqrt(2048.0f);
  Tensor t = put(x, A);
  ops->scale(t, s);
  std::vector<float> want(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    want[i] = x[i] * s;
    if (A == DType::bf16) want[i] = bf16_to_f32(f32_to_bf16(want[i]));
  }
  EXPECT_EQ(0, std::memcmp(get(t).data(), want.data(), want.size() * sizeof(float)));
}

// Dropout is kernels/cpu's in the activation dtype bit for bit on every backend — the same mask of (key,
// element index), the same factor and rounding — out of place and in place (cuda: the vectorised and the
// element-by-element paths, n not a multiple of 8, an unaligned slice).
TEST_P(Compute, DropoutIsTheCpuMaskAndRoundingBitForBit) {
  const std::size_t n = 1001;
  const auto x = act(n + 1, 50, 2.0f);
  const std::vector<float> xs(x.begin() + 1, x.end());
  for (double p : {0.0, 0.1, 0.5}) {
    std::vector<float> want(n);
    if (A == DType::bf16) {
      std::vector<kc::bf16_t> in(n), out(n);
      for (std::size_t i = 0; i < n; ++i) in[i] = f32_to_bf16(xs[i]);
      kc::dropout(out.data(), in.data(), n, p, 77);
      for (std::size_t i = 0; i < n; ++i) want[i] = bf16_to_f32(out[i]);
    } else {
      kc::dropout(want.data(), xs.data(), n, p, 77);
    }
    Tensor tx = put(xs, A), to = alloc(n, A), unaligned = put(x, A).slice(1, n);
    ops->dropout(to, tx, p, 77);
    ops->dropout(unaligned, unaligned, p, 77);
    const std::vector<float> got = get(to), got_in_place = get(unaligned);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), n * sizeof(float))) << "p " << p;
    EXPECT_EQ(0, std::memcmp(got_in_place.data(), want.data(), n * sizeof(float)))
        << "p " << p << " in place";
  }
}

// reserve_scratch(scratch_bytes(shapes)) covers the bias gradients (OC = C, NH * HD, NKV * HD) and, with
// head_norm, the per-head q/k norms (N * NH and N * NKV rows of HD): running them takes no more memory.
TEST_P(Compute, PlannedScratchCoversTheBiasAndPerHeadNormGradients) {
  const int N = 200, C = 64, NH = 8, NKV = 2, HD = 32;  // NH * HD > C: the heads' ops are the widest
  const OpShapes sh{.N = N, .C = C, .NH = NH, .NKV = NKV, .HD = HD, .head_norm = true};
  ops->reserve_scratch(ops->scratch_bytes(sh));
  const std::size_t planned = ops->device_bytes();
  for (int heads : {NH, NKV}) {
    const int rows = N * heads;
    Tensor x = put(act(std::size_t(rows) * HD, 46), A), w = put(act(HD, 47), A), d = put(act(x.numel, 48), A),
           out = alloc(x.numel, A), rstd = alloc(rows, DType::fp32), dx = alloc(x.numel, A),
           dw = alloc(HD, DType::fp32), db = alloc(std::size_t(heads) * HD, DType::fp32);
    ops->rmsnorm_forward(out, rstd, x, w, rows, HD, 1e-6f);
    ops->rmsnorm_backward(dx, dw, d, x, w, rstd, rows, HD);
    ops->bias_backward(db, d, N, heads * HD);  // d read as (N, heads * HD)
  }
  Tensor d = put(act(std::size_t(N) * C, 49), A), db = alloc(C, DType::fp32);
  ops->bias_backward(db, d, N, C);
  stream->synchronize();
  EXPECT_EQ(ops->device_bytes(), planned) << "an op grew the scratch past scratch_bytes()";
}

TEST_P(Compute, AdamwIsTheCpuUpdateBitForBit) {
  const std::size_t n = 777;
  auto p = random_floats(n, 20), g = random_floats(n, 21), m = random_floats(n, 22, 0.1f);
  auto v = random_floats(n, 23, 0.1f);
  for (float& x : v) x = x * x;
  Ops::AdamW hp{.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  Tensor tp = put(p, DType::fp32), tg = put(g, DType::fp32), tm = put(m, DType::fp32),
         tv = put(v, DType::fp32), tout = alloc(n, DType::bf16);
  std::vector<kc::bf16_t> out(n);
  kc::adamw_update(p.data(), g.data(), m.data(), v.data(), out.data(), n,
                   {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f}, 3, 0.5f);
  ops->adamw(tp, tg, tm, tv, tout, hp, 3, 0.5f);
  EXPECT_EQ(0, std::memcmp(get(tp).data(), p.data(), n * 4)) << "params";
  EXPECT_EQ(0, std::memcmp(get(tm).data(), m.data(), n * 4)) << "exp_avg";
  EXPECT_EQ(0, std::memcmp(get(tv).data(), v.data(), n * 4)) << "exp_avg_sq";
  std::vector<float> want_out(n);
  for (std::size_t i = 0; i < n; ++i) want_out[i] = bf16_to_f32(out[i]);
  EXPECT_EQ(0, std::memcmp(get(tout).data(), want_out.data(), n * 4)) << "bf16 params";
}

// An op issued after work enqueued on its stream sees that work's result, on every backend. The stream is
// held at a gate until the op has been issued (each op enqueues on the stream and returns: kernels/ops.h),
// so an op that did not wait for the stream would scale the buffer before the copy lands — whatever the
// timing. The copy comes from pinned memory: a held stream takes no copy from pageable memory
// (tests/common/stream_gate.h).
TEST_P(Compute, OpsRunAfterTheWorkAlreadyOnTheirStream) {
  std::vector<float> src = random_floats(4096, 24);
  Tensor x = alloc(src.size(), DType::fp32);
  PinnedBuffer staged(*dev, x.bytes());
  std::memcpy(staged.data(), src.data(), x.bytes());
  strata::test::StreamGate gate;
  gate.hold(*stream);
  stream->copy_async(x.data, staged.data(), x.bytes(), CopyKind::host_to_device);
  ops->scale(x, 2.0f);
  gate.open();
  std::vector<float> want(src.size());
  for (std::size_t i = 0; i < src.size(); ++i) want[i] = src[i] * 2.0f;
  EXPECT_EQ(get(x), want);
}

TEST_P(Compute, AWrongDtypeOrATooSmallBufferIsRefusedNamingTheOperand) {
  Tensor x = alloc(10, DType::fp16), y = alloc(4, DType::fp32);
  try {
    ops->scale(x, 2.0f);
    FAIL() << "an fp16 tensor was scaled as fp32";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scale target"), std::string::npos) << e.what();
  }
  Tensor big = alloc(10, DType::fp32);
  EXPECT_THROW(ops->add(y, big), Error);
}

INSTANTIATE_TEST_SUITE_P(Backends, Compute, ::testing::Values("host", "host_bf16", "cuda"),
                         ::strata::testing::backend_name);

// OpsOptions.workspace_bytes on the CPU: device memory taken as a library's workspace would be, so that a
// plan that counts device_bytes() is checked without a GPU.
TEST(ComputeFactory, TheCpuOpsTakeAStandInWorkspaceFromTheDevice) {
  auto dev = open_device({.backend = "host", .ordinal = 0, .memory_cap = 64u << 20});
  auto s = dev->create_stream("s");
  {
    auto ops = make_ops(*dev, *s, {.workspace_bytes = std::size_t(5) << 20});
    EXPECT_EQ(ops->device_bytes(), std::size_t(5) << 20);
    EXPECT_EQ(dev->memory_stats().in_use, std::size_t(5) << 20);
    EXPECT_EQ(ops->scratch_bytes({.N = 64, .C = 128, .V = 256, .reduce_numel = 1000}), 0u);
  }
  EXPECT_EQ(dev->memory_stats().in_use, 0u);
  EXPECT_THROW(make_ops(*dev, *s, {.workspace_bytes = std::size_t(65) << 20}), OutOfMemory);
}

TEST(ComputeFactory, TheHostBackendGetsTheCpuOpsInFp32) {
  auto dev = open_device({.backend = "host", .ordinal = 0, .memory_cap = 0});
  auto s = dev->create_stream("s");
  auto ops = make_ops(*dev, *s);
  EXPECT_EQ(ops->caps().activation, DType::fp32);
  EXPECT_TRUE(ops->caps().bit_reproducible);
}

TEST(ComputeFactory, Bf16MatrixProductsOnTheHostBackendMeanBf16Activations) {
  auto dev = open_device({.backend = "host", .ordinal = 0, .memory_cap = 0});
  auto s = dev->create_stream("s");
  auto ops = make_ops(*dev, *s, {.matmul = DType::bf16});
  EXPECT_EQ(ops->caps().activation, DType::bf16);
  EXPECT_NE(ops->caps().name.find("bf16 activations"), std::string::npos) << ops->caps().name;
  EXPECT_TRUE(ops->caps().bit_reproducible);
}

// With bf16 activations attention is the fused one: its saved state grows with T, not T^2.
TEST(ComputeFactory, Bf16AttentionOnTheHostBackendKeepsNoProbabilityMatrix) {
  auto dev = open_device({.backend = "host", .ordinal = 0, .memory_cap = 0});
  auto s = dev->create_stream("s");
  auto ops = make_ops(*dev, *s, {.matmul = DType::bf16});
  EXPECT_TRUE(ops->caps().fused_attention);
  const int B = 2, T = 1024, NH = 8, NKV = 4, HD = 64;
  const AttentionSizes as = ops->attention_sizes(B, T, NH, NKV, HD);
  EXPECT_LT(as.saved + as.scratch, std::size_t(B) * NH * T * T / 8);
  EXPECT_NE(ops->attention_path(B, T, NH, NKV, HD).find("fused"), std::string::npos);
}

}  // namespace
}  // namespace strata::kernels
