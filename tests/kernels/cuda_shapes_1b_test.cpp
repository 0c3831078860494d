// The compute interface on cuda (make_ops on a cuda Device) against the CPU ops with bf16 matrix products
// (make_ops on a host Device, OpsOptions::matmul = bf16) at the shapes of configs/models/1b.json — d_model
// 2048, 32 query heads and 4 key/value heads of 64 (grouped 8:1), ffn 5632, vocabulary 32000 — and at
// head dimension 128 (16 heads, 2 key/value heads), on a few rows (B = 1, T = 128 or 256): the engine's
// and the model's other cuda tests use the tiny preset only (head dimension 8).
//
// Both sides get the same inputs, values bf16 holds exactly. Bounds are compute_interface_test.cpp's, as
// relative L2 error of the cuda result against the CPU's: 2e-2 per output (bf16 storage rounds each by up
// to 2^-9; both sides accumulate in fp32), 3e-2 for attention's gradients (cuDNN rounds the probabilities
// and their gradients to bf16 before its products), 1e-3 for rmsnorm's saved rstd, 1e-2 for the mean
// loss. Attention runs twice: through the interface (cuDNN's fused attention where cuDNN takes the shape;
// the path taken is printed) and through kernels/cuda's own unfused kernel, which the interface does not
// choose when cuDNN is there. Skipped, with the reason, without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "kernels/cuda/ops.h"
#include "kernels/ops.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/reference.h"

namespace strata::kernels::test {
namespace {

namespace kcu = strata::kernels::cuda;

constexpr double kTol = 2e-2;            // one op's output
constexpr double kAttentionGrad = 3e-2;  // dq, dk, dv
constexpr double kRstd = 1e-3;

// n values in [-scale, scale), rounded to bf16 (both sides see the same inputs): a splitmix64 stream, fast
// enough for the 65M elements of a 32000 x 2048 embedding table.
std::vector<float> values(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(n);
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (float& x : v) {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float u = float(z >> 40) / float(1ull << 24);  // [0, 1)
    x = bf16_to_f32(f32_to_bf16((2.0f * u - 1.0f) * scale));
  }
  return v;
}

// One device and its ops: the CPU (host backend, bf16 products) or cuda.
struct Side {
  std::unique_ptr<Device> dev;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<Ops> ops;
  std::vector<strata::DeviceBuffer> bufs;

  DType act() const { return ops->caps().activation; }
  Tensor alloc(std::size_t n, DType t) {
    bufs.emplace_back(*dev, std::max<std::size_t>(1, n * dtype_bytes(t)), "1b shapes test");
    Tensor x{bufs.back().data(), t, n};
    stream->memset_async(x.data, 0, std::max<std::size_t>(1, x.bytes()));
    return x;
  }
  Tensor put(const std::vector<float>& v, DType t) {
    Tensor x = alloc(v.size(), t);
    std::vector<std::uint16_t> h;
    const void* src = v.data();
    if (t == DType::bf16) {
      h.resize(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
      src = h.data();
    }
    stream->copy_async(x.data, src, x.bytes(), CopyKind::host_to_device);
    stream->synchronize();
    return x;
  }
  Tensor put_i32(const std::vector<std::int32_t>& v) {
    Tensor x = alloc(v.size(), DType::i32);
    stream->copy_async(x.data, v.data(), x.bytes(), CopyKind::host_to_device);
    stream->synchronize();
    return x;
  }
  std::vector<float> get(Tensor x) {
    std::vector<char> raw(x.bytes());
    stream->copy_async(raw.data(), x.data, raw.size(), CopyKind::device_to_host);
    stream->synchronize();
    return widen(raw.data(), x.dtype, x.numel);
  }
};

// The same tensor on both sides.
struct Pair {
  Tensor cpu, gpu;
};

class CudaShapes1b : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = no_gpu_reason();
    if (!reason.empty()) GTEST_SKIP() << reason;
    cpu_.dev = open_device({.backend = "host"});
    cpu_.stream = cpu_.dev->create_stream("cpu-ops");
    cpu_.ops = make_ops(*cpu_.dev, *cpu_.stream, {.matmul = DType::bf16});
    gpu_.dev = open_device({.backend = "cuda"});  // opened last: this thread's device is the GPU
    gpu_.stream = gpu_.dev->create_stream("cuda-ops");
    gpu_.ops = make_ops(*gpu_.dev, *gpu_.stream);
    ASSERT_EQ(gpu_.act(), DType::bf16);
  }
  void TearDown() override {
    for (Side* s : {&gpu_, &cpu_}) {
      if (s->stream) s->stream->synchronize();
      s->bufs.clear();
      s->ops.reset();
      s->stream.reset();
      s->dev.reset();
    }
  }

  // Activations (each side's dtype), fp32 and zeroed buffers, i32 ids.
  Pair act(const std::vector<float>& v) { return {cpu_.put(v, cpu_.act()), gpu_.put(v, gpu_.act())}; }
  Pair act_zeros(std::size_t n) { return {cpu_.alloc(n, cpu_.act()), gpu_.alloc(n, gpu_.act())}; }
  Pair f32_zeros(std::size_t n) { return {cpu_.alloc(n, DType::fp32), gpu_.alloc(n, DType::fp32)}; }
  Pair ids(const std::vector<std::int32_t>& v) { return {cpu_.put_i32(v), gpu_.put_i32(v)}; }

  // The cuda result's relative L2 error against the CPU's.
  double error(const Pair& p) { return rel_l2(gpu_.get(p.gpu), cpu_.get(p.cpu)); }

  Side cpu_, gpu_;
};

// ---- linear: the 1b model's five product shapes ------------------------------------------------------

// (IC, OC): attention q / o (2048 -> 2048), k / v (2048 -> 256: 4 heads of 64), MLP gate / up
// (2048 -> 5632), MLP down (5632 -> 2048), the head (2048 -> 32000).
class CudaShapes1bLinear : public CudaShapes1b, public ::testing::WithParamInterface<std::tuple<int, int>> {};

TEST_P(CudaShapes1bLinear, ForwardAndBackwardMatchTheCpu) {
  const auto [IC, OC] = GetParam();
  const int N = 128;  // B = 1, T = 128
  const auto x = values(std::size_t(N) * IC, 1),
             w = values(std::size_t(OC) * IC, 2, 1.0f / std::sqrt(float(IC)));
  const auto dout = values(std::size_t(N) * OC, 3);
  Pair tx = act(x), tw = act(w), tdout = act(dout), out = act_zeros(std::size_t(N) * OC),
       dx = act_zeros(x.size()), dw = f32_zeros(w.size());
  for (Side* s : {&cpu_, &gpu_}) {
    const bool g = s == &gpu_;
    s->ops->linear_forward(g ? out.gpu : out.cpu, g ? tx.gpu : tx.cpu, g ? tw.gpu : tw.cpu, N, IC, OC);
    s->ops->linear_backward(g ? dx.gpu : dx.cpu, g ? dw.gpu : dw.cpu, g ? tdout.gpu : tdout.cpu,
                            g ? tx.gpu : tx.cpu, g ? tw.gpu : tw.cpu, N, IC, OC);
  }
  EXPECT_LT(error(out), kTol) << "out";
  EXPECT_LT(error(dx), kTol) << "dx";
  EXPECT_LT(error(dw), kTol) << "dw";
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaShapes1bLinear,
                         ::testing::Values(std::make_tuple(2048, 2048), std::make_tuple(2048, 256),
                                           std::make_tuple(2048, 5632), std::make_tuple(5632, 2048),
                                           std::make_tuple(2048, 32000)),
                         [](const auto& i) {
                           return std::to_string(std::get<0>(i.param)) + "_to_" +
                                  std::to_string(std::get<1>(i.param));
                         });

// Each side's tensor of a pair, for calls written once.
#define SIDE(p) (g ? (p).gpu : (p).cpu)

// ---- RMSNorm, SwiGLU, cross-entropy, embedding ---------------------------------------------------------

TEST_F(CudaShapes1b, RmsnormAtDModel2048) {
  const int N = 256, C = 2048;
  const auto x = values(std::size_t(N) * C, 4), w = values(C, 5), dout = values(std::size_t(N) * C, 6);
  Pair tx = act(x), tw = act(w), td = act(dout), out = act_zeros(x.size()), rstd = f32_zeros(N),
       dx = act_zeros(x.size()), dw = f32_zeros(C);
  for (Side* s : {&cpu_, &gpu_}) {
    const bool g = s == &gpu_;
    s->ops->rmsnorm_forward(SIDE(out), SIDE(rstd), SIDE(tx), SIDE(tw), N, C, 1e-5f);
    s->ops->rmsnorm_backward(SIDE(dx), SIDE(dw), SIDE(td), SIDE(tx), SIDE(tw), SIDE(rstd), N, C);
  }
  EXPECT_LT(error(out), kTol) << "out";
  EXPECT_LT(error(rstd), kRstd) << "rstd";
  EXPECT_LT(error(dx), kTol) << "dx";
  EXPECT_LT(error(dw), kTol) << "dw";
}

TEST_F(CudaShapes1b, SwigluAtFfn5632) {
  const std::size_t n = std::size_t(256) * 5632;
  const auto gate = values(n, 7, 3.0f), up = values(n, 8), dout = values(n, 9);
  Pair tg = act(gate), tu = act(up), td = act(dout), out = act_zeros(n), dg = act_zeros(n), du = act_zeros(n);
  for (Side* s : {&cpu_, &gpu_}) {
    const bool g = s == &gpu_;
    s->ops->swiglu_forward(SIDE(out), SIDE(tg), SIDE(tu));
    s->ops->swiglu_backward(SIDE(dg), SIDE(du), SIDE(td), SIDE(tg), SIDE(tu));
  }
  EXPECT_LT(error(out), kTol) << "out";
  EXPECT_LT(error(dg), kTol) << "dgate";
  EXPECT_LT(error(du), kTol) << "dup";
}

TEST_F(CudaShapes1b, CrossEntropyAtVocabulary32000) {
  const int N = 128, V = 32000;
  const auto logits = values(std::size_t(N) * V, 10, 4.0f);
  std::vector<std::int32_t> targets(N);
  for (int i = 0; i < N; ++i)
    targets[std::size_t(i)] = i % 17 == 5 ? -1 : int((std::uint64_t(i) * 7919u) % V);
  targets.back() = V - 1;
  Pair tl = act(logits), tt = ids(targets), dl = act_zeros(logits.size()), losses = f32_zeros(N),
       mean = f32_zeros(1);
  for (Side* s : {&cpu_, &gpu_}) {
    const bool g = s == &gpu_;
    s->ops->cross_entropy(SIDE(dl), SIDE(losses), SIDE(mean), SIDE(tl), SIDE(tt), N, V, 0.5f);
  }
  const float want = cpu_.ops->read_f32(mean.cpu), got = gpu_.ops->read_f32(mean.gpu);
  EXPECT_NEAR(got, want, 1e-2 * std::abs(want)) << "mean loss";
  EXPECT_LT(error(losses), kTol) << "per-row losses";
  EXPECT_LT(error(dl), kTol) << "dlogits";
}

TEST_F(CudaShapes1b, EmbeddingAtVocabulary32000AndDModel2048) {
  const int N = 256, C = 2048, V = 32000;
  const auto wte = values(std::size_t(V) * C, 11), dout = values(std::size_t(N) * C, 12);
  std::vector<std::int32_t> tokens(N);
  for (int i = 0; i < N; ++i) tokens[std::size_t(i)] = int((std::uint64_t(i) * 104729u + 13) % V);
  tokens[1] = tokens[0];  // a repeated token: its gradient rows add
  tokens[2] = V - 1;
  Pair tw = act(wte), td = act(dout), tt = ids(tokens), out = act_zeros(std::size_t(N) * C),
       dwte = f32_zeros(wte.size());
  for (Side* s : {&cpu_, &gpu_}) {
    const bool g = s == &gpu_;
    s->ops->embedding_forward(SIDE(out), SIDE(tt), SIDE(tw), N, C, V);
    s->ops->embedding_backward(SIDE(dwte), SIDE(td), SIDE(tt), N, C, V);
  }
  EXPECT_LT(error(out), kTol) << "out";
  EXPECT_LT(error(dwte), kTol) << "dwte";
}

// ---- rotary embedding and attention at head dimensions 64 (1b) and 128 ------------------------------------

struct AttentionCase {
  int B, T, NH, NKV, HD;
  float theta;
};

class CudaShapes1bAttention : public CudaShapes1b, public ::testing::WithParamInterface<AttentionCase> {};

TEST_P(CudaShapes1bAttention, RopeMatchesTheCpu) {
  const AttentionCase c = GetParam();
  const std::size_t nq = std::size_t(c.B) * c.T * c.NH * c.HD;
  const auto q = values(nq, 13), dout = values(nq, 14);
  Pair cos = f32_zeros(std::size_t(c.T) * c.HD / 2), sin = f32_zeros(cos.cpu.numel), tq = act(q),
       out = act_zeros(nq), dq = act_zeros(nq), td = act(dout);
  for (Side* s : {&cpu_, &gpu_}) {
    const bool g = s == &gpu_;
    s->ops->rope_cache(SIDE(cos), SIDE(sin), c.T, c.HD, c.theta);
    s->ops->rope_forward(SIDE(out), SIDE(tq), SIDE(cos), SIDE(sin), c.B, c.T, c.NH, c.HD);
    s->ops->rope_backward(SIDE(dq), SIDE(td), SIDE(cos), SIDE(sin), c.B, c.T, c.NH, c.HD);
  }
  EXPECT_LT(error(cos), 1e-6) << "cos table";
  EXPECT_LT(error(sin), 1e-6) << "sin table";
  EXPECT_LT(error(out), kTol) << "rope out";
  EXPECT_LT(error(dq), kTol) << "rope dx";
}

// Through the interface: cuDNN's fused attention where cuDNN takes the shape, else kernels/cuda's kernel.
TEST_P(CudaShapes1bAttention, AttentionThroughTheInterfaceMatchesTheCpu) {
  const AttentionCase c = GetParam();
  const std::size_t nq = std::size_t(c.B) * c.T * c.NH * c.HD, nkv = std::size_t(c.B) * c.T * c.NKV * c.HD;
  const std::string path = gpu_.ops->attention_path(c.B, c.T, c.NH, c.NKV, c.HD);
  RecordProperty("attention_path", path);
  std::printf("attention (B=%d T=%d NH=%d NKV=%d HD=%d) on cuda: %s\n", c.B, c.T, c.NH, c.NKV, c.HD,
              path.c_str());
  const auto q = values(nq, 15, 2.0f), k = values(nkv, 16, 2.0f), v = values(nkv, 17), dout = values(nq, 18);
  Pair tq = act(q), tk = act(k), tv = act(v), td = act(dout), out = act_zeros(nq), dq = act_zeros(nq),
       dk = act_zeros(nkv), dv = act_zeros(nkv);
  Pair saved, scratch;
  for (Side* s : {&cpu_, &gpu_}) {
    const AttentionSizes as = s->ops->attention_sizes(c.B, c.T, c.NH, c.NKV, c.HD);
    (s == &gpu_ ? saved.gpu : saved.cpu) = s->alloc(as.saved, DType::fp32);
    (s == &gpu_ ? scratch.gpu : scratch.cpu) = s->alloc(as.scratch, DType::fp32);
  }
  for (Side* s : {&cpu_, &gpu_}) {
    const bool g = s == &gpu_;
    s->ops->attention_forward(SIDE(out), SIDE(saved), SIDE(tq), SIDE(tk), SIDE(tv), c.B, c.T, c.NH, c.NKV,
                              c.HD);
    s->ops->attention_backward(SIDE(dq), SIDE(dk), SIDE(dv), SIDE(scratch), SIDE(td), SIDE(tq), SIDE(tk),
                               SIDE(tv), SIDE(out), SIDE(saved), c.B, c.T, c.NH, c.NKV, c.HD);
  }
  EXPECT_LT(error(out), kTol) << "out (" << path << ")";
  EXPECT_LT(error(dq), kAttentionGrad) << "dq (" << path << ")";
  EXPECT_LT(error(dk), kAttentionGrad) << "dk (" << path << ")";
  EXPECT_LT(error(dv), kAttentionGrad) << "dv (" << path << ")";
}

// kernels/cuda's own unfused kernel, called directly (the interface prefers cuDNN where it is built).
TEST_P(CudaShapes1bAttention, TheUnfusedCudaKernelMatchesTheCpu) {
  const AttentionCase c = GetParam();
  const std::size_t nq = std::size_t(c.B) * c.T * c.NH * c.HD, nkv = std::size_t(c.B) * c.T * c.NKV * c.HD;
  const std::size_t natt = std::size_t(c.B) * c.NH * c.T * c.T;
  const auto q = values(nq, 19, 2.0f), k = values(nkv, 20, 2.0f), v = values(nkv, 21), dout = values(nq, 22);
  Pair tq = act(q), tk = act(k), tv = act(v), td = act(dout), out = act_zeros(nq), dq = act_zeros(nq),
       dk = act_zeros(nkv), dv = act_zeros(nkv);
  const AttentionSizes as = cpu_.ops->attention_sizes(c.B, c.T, c.NH, c.NKV, c.HD);
  Tensor saved = cpu_.alloc(as.saved, DType::fp32), scratch = cpu_.alloc(as.scratch, DType::fp32);
  cpu_.ops->attention_forward(out.cpu, saved, tq.cpu, tk.cpu, tv.cpu, c.B, c.T, c.NH, c.NKV, c.HD);
  cpu_.ops->attention_backward(dq.cpu, dk.cpu, dv.cpu, scratch, td.cpu, tq.cpu, tk.cpu, tv.cpu, out.cpu,
                               saved, c.B, c.T, c.NH, c.NKV, c.HD);
  Tensor att = gpu_.alloc(natt, DType::fp32), att_scratch = gpu_.alloc(natt, DType::fp32);
  auto* s = static_cast<cudaStream_t>(gpu_.stream->native_handle());
  auto bf = [](Tensor t) { return t.as<kcu::bf16>(); };
  kcu::attention_forward(bf(out.gpu), att.as<float>(), bf(tq.gpu), bf(tk.gpu), bf(tv.gpu), c.B, c.T, c.NH,
                         c.NKV, c.HD, /*window=*/0, /*pos=*/nullptr, s);
  kcu::attention_backward(bf(dq.gpu), bf(dk.gpu), bf(dv.gpu), att_scratch.as<float>(), bf(td.gpu), bf(tq.gpu),
                          bf(tk.gpu), bf(tv.gpu), bf(out.gpu), att.as<float>(), c.B, c.T, c.NH, c.NKV, c.HD,
                          /*window=*/0, /*pos=*/nullptr, s);
  EXPECT_LT(error(out), kTol) << "out";
  EXPECT_LT(error(dq), kAttentionGrad) << "dq";
  EXPECT_LT(error(dk), kAttentionGrad) << "dk";
  EXPECT_LT(error(dv), kAttentionGrad) << "dv";
}

// "T256_NH32_NKV4_HD64" (appended piece by piece: GCC 12 warns falsely about "T" + std::to_string(...)).
std::string attention_name(const ::testing::TestParamInfo<AttentionCase>& i) {
  const AttentionCase& c = i.param;
  std::string s;
  for (auto [label, v] : {std::pair{"T", c.T}, {"_NH", c.NH}, {"_NKV", c.NKV}, {"_HD", c.HD}}) {
    s += label;
    s += std::to_string(v);
  }
  return s;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaShapes1bAttention,
                         ::testing::Values(AttentionCase{1, 256, 32, 4, 64, 10000.0f},
                                           AttentionCase{1, 128, 32, 4, 64, 10000.0f},
                                           AttentionCase{1, 256, 16, 2, 128, 500000.0f}),
                         attention_name);

#undef SIDE

}  // namespace
}  // namespace strata::kernels::test
