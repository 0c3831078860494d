#include "model/llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/dtype.h"
#include "model/llama_impl.h"
#include "model/packed_docs.h"
#include "model/rope.h"

namespace strata::model {
namespace {

using kernels::Tensor;
using Clock = LlamaClock;

// Q K^T and att V over the causal half: 2 products of B*H*D*T(T+1)/2 multiply-adds.
double attention_flops(int64_t B, int64_t T, int64_t H, int64_t D) {
  return 4.0 * double(B) * double(H) * double(D) * double(T) * double(T + 1) / 2.0;
}

// RAII timing of one chunk's forward or backward (acquire to release) for the profile.
class ChunkTimer {
 public:
  ChunkTimer(Profile* p, int chunk, Phase phase, double* flops)
      : p_(p), chunk_(chunk), phase_(phase), flops_(flops), t0_(Clock::now()) {
    *flops_ = 0;
  }
  ~ChunkTimer() {
    if (p_) p_->add_chunk(chunk_, phase_, seconds_since(t0_), *flops_);
  }

 private:
  Profile* p_;
  int chunk_;
  Phase phase_;
  double* flops_;
  Clock::time_point t0_;
};

// Acquire/release pairs that also release when an op throws. A release does work that can fail (a
// gradient hand-off writes to NVMe): on the way out of the scope its error propagates; while another
// error unwinds the scope, the release still runs and its own error is dropped, the first one is reported.
class Release {
 public:
  Release() : unwinding_(std::uncaught_exceptions()) {}
  template <class F>
  void run(F&& release) const {
    if (std::uncaught_exceptions() == unwinding_) {
      release();
      return;
    }
    try {
      release();
    } catch (...) {  // NOLINT(bugprone-empty-catch): the error already unwinding is the one reported
    }
  }

 private:
  int unwinding_;
};

class Held {
 public:
  Held(ChunkProvider& c, int id) : c_(c), id_(id), view_(c.acquire(id)) {}
  ~Held() noexcept(false) {
    rel_.run([&] { c_.release(id_); });
  }
  const ChunkView& view() const { return view_; }

 private:
  ChunkProvider& c_;
  int id_;
  ChunkView view_;
  Release rel_;
};

// A chunk's gradient buffer while its backward runs; none (data() null) for a frozen chunk.
class HeldGrads {
 public:
  HeldGrads(ChunkProvider& c, int id) : c_(c), id_(id), g_(c.trains(id) ? c.acquire_grads(id) : nullptr) {}
  ~HeldGrads() noexcept(false) {
    if (g_) rel_.run([&] { c_.release_grads(id_); });
  }
  float* data() const { return g_; }

 private:
  ChunkProvider& c_;
  int id_;
  float* g_;
  Release rel_;
};

}  // namespace

LlamaModel::LlamaModel(const ModelConfig& cfg, ModelOptions opts) : cfg_(cfg), opts_(opts) {
  cfg_.validate("LlamaModel");
  STRATA_CHECK(cfg_.vocab_size <= INT32_MAX && cfg_.d_model <= INT32_MAX && cfg_.ffn_dim <= INT32_MAX,
               "model dimensions must fit int for the ops");
  STRATA_CHECK((opts_.device == nullptr) == (opts_.ops == nullptr),
               "LlamaModel: give both ModelOptions.device and .ops, or neither");
  if (!opts_.ops) {
    own_device_ = open_device({.backend = "host", .ordinal = 0, .memory_cap = 0});
    own_stream_ = own_device_->create_stream("model-compute");
    own_ops_ = kernels::make_ops(*own_device_, *own_stream_);
  }
  dev_ = opts_.device ? opts_.device : own_device_.get();
  ops_ = opts_.ops ? opts_.ops : own_ops_.get();
  act_ = ops_->caps().activation;
  lora_slots_.fill(-1);  // each site's place in BlockActs::lora_t, once (lora_slot runs per projection)
  const std::vector<int> sites = lora_sites_of(cfg_);
  for (size_t i = 0; i < sites.size(); ++i) lora_slots_[size_t(sites[i])] = int(i);
}

LlamaModel::~LlamaModel() {
  try {
    ops_->stream().synchronize();  // nothing may still use the buffers freed below
  } catch (...) {
  }
}

void LlamaModel::check_layout(const ChunkProvider& chunks) const {
  const ModelConfig& have = chunks.layout().config();
  STRATA_CHECK(have == cfg_, "the chunk provider's layout is for model '", have.name, "' (",
               have.to_json().dump(), "), this LlamaModel is '", cfg_.name, "' (", cfg_.to_json().dump(),
               ")");
}

kernels::OpShapes LlamaModel::op_shapes(const ModelConfig& cfg, int B, int T) {
  return {.N = B * T,
          .C = int(cfg.d_model),
          .V = int(cfg.vocab_size),
          .B = B,
          .T = T,
          .NH = int(cfg.n_heads),
          .NKV = int(cfg.n_kv_heads),
          .HD = int(cfg.head_dim()),
          .reduce_numel = 0,
          .head_norm = cfg.traits().qk_norm,
          .window = int(cfg.sliding_window)};  // every windowed layer's (Note [Sliding windows])
}

std::vector<float> LlamaModel::logits() const {
  const size_t n = size_t(B_) * size_t(T_) * size_t(cfg_.vocab_size);
  std::vector<float> out(n);
  if (n == 0) return out;
  std::vector<char> raw(n * dtype_bytes(act_));
  ops_->stream().copy_async(raw.data(), logits_.t.data, raw.size(), CopyKind::device_to_host);
  ops_->stream().synchronize();
  convert_to_f32(act_, raw.data(), n, out.data());
  return out;
}

Tensor LlamaModel::weight(const ChunkView& p, int index) const {
  const TensorSpec& t = p.layout->at(index);
  STRATA_CHECK(p.dtype == act_, "LlamaModel: chunk ", p.layout->name, " is gathered as ", dtype_name(p.dtype),
               ", the ops compute in ", dtype_name(act_));
  return Tensor{const_cast<void*>(p.tensor(index)), p.dtype, t.numel};
}

Tensor LlamaModel::grad(const ChunkView& p, float* g, int index) {
  if (g == nullptr) return Tensor{};  // frozen: the ops skip the weight's gradient
  const TensorSpec& t = p.layout->at(index);
  return Tensor{g + t.offset, DType::fp32, t.numel};
}

// Note [The head's buffers under checkpointing]: with one block set that every block overwrites, the head
// needs no buffers of its own for its input (the last block's output) and the final norm's output: the last
// block's forward reads xn1 only in the q, k and v projections, before its down projection writes the
// block's output, so that output goes to xn1; once the last block's forward is done nothing in the set is
// read until backward recomputes block L-1, after the head's backward, so the final norm's output goes to
// x_mid. Both are (N, C). Without checkpointing every block keeps its set for backward: the head has its own.
Tensor LlamaModel::resid(int l) const {
  const size_t NC = size_t(B_) * size_t(T_) * size_t(cfg_.d_model);
  if (ckpt_ && l == int(cfg_.n_layers)) return acts_[0].xn1.t.slice(0, NC);
  if (store_ == nullptr) return resid_.t.slice(size_t(l) * NC, NC);
  STRATA_CHECK(stored_[size_t(l)] != nullptr, "LlamaModel: block input ", l, " is not on the device now");
  return Tensor{stored_[size_t(l)], act_, NC};
}

Tensor LlamaModel::xf() const {
  const size_t NC = size_t(B_) * size_t(T_) * size_t(cfg_.d_model);
  return ckpt_ ? acts_[0].x_mid.t.slice(0, NC) : xf_.t.slice(0, NC);
}

double LlamaModel::forward_flops(int B, int T) const {
  const int64_t N = int64_t(B) * T, C = cfg_.d_model, F = cfg_.ffn_dim, Q = cfg_.q_dim(), KV = cfg_.kv_dim();
  double block = linear_flops(N, C, Q) + 2 * linear_flops(N, C, KV) + linear_flops(N, Q, C) +
                 2 * linear_flops(N, C, F) + linear_flops(N, F, C) +
                 attention_flops(B, T, cfg_.n_heads, cfg_.head_dim());
  return double(cfg_.n_layers) * block + linear_flops(N, C, cfg_.vocab_size);
}

double LlamaModel::backward_flops(int B, int T) const {
  double f = 2.0 * forward_flops(B, T);
  if (opts_.checkpoint_activations)
    f += forward_flops(B, T) - linear_flops(int64_t(B) * T, cfg_.d_model, cfg_.vocab_size);
  return f;
}

void LlamaModel::project(const ChunkView& p, const ChunkView* ad, BlockActs& a, Tensor out, Tensor x,
                         int w_index, int bias_index, int N, int IC, int OC, const char* op, Phase phase) {
  timed(
      op, phase, linear_flops(N, IC, OC),
      [&] { ops_->linear_forward(out, x, weight(p, w_index), N, IC, OC); }, N, IC, OC);
  if (bias_index >= 0 && p.layout->has(bias_index)) ops_->bias_forward(out, weight(p, bias_index), N, OC);
  if (ad) lora_forward(*ad, a, out, x, w_index, N, OC, phase);
}

float LlamaModel::embed_scale() const {
  if (!cfg_.traits().embed_scale) return 1.0f;
  // transformers: a tensor of sqrt(hidden_size) (fp32), cast to the weights' dtype before the product.
  const float s = float(std::sqrt(double(cfg_.d_model)));
  return act_ == DType::bf16 ? bf16_to_f32(f32_to_bf16(s)) : s;
}

// Note [Model families] (config.h): the family's pieces are the optional steps below — biases on the
// projections, the per-head q/k norm (RMSNorm over N * heads rows of D), the norm's weight offset and the
// MLP's activation. Llama runs none of them, and its op sequence is what it was.
void LlamaModel::block_forward(const ChunkView& p, const ChunkView* ad, Tensor x_in, Tensor x_out,
                               BlockActs& a, Phase phase) {
  const int B = B_, T = T_, N = B * T, C = int(cfg_.d_model);
  const int NH = int(cfg_.n_heads), NKV = int(cfg_.n_kv_heads), D = int(cfg_.head_dim());
  const int Q = NH * D, KV = NKV * D;
  const Family& fam = cfg_.traits();  // one lookup per block
  const float eps = cfg_.norm_eps, w_off = fam.norm_offset;
  const bool qkn = fam.qk_norm;
  kernels::Ops& o = *ops_;

  timed("attn_norm", phase, 0,
        [&] { o.rmsnorm_forward(a.xn1.t, a.rstd1.t, x_in, weight(p, kAttnNorm), N, C, eps, w_off); });
  // With the per-head norm, the projections land in q_raw / k_raw and the norm writes q / k.
  project(p, ad, a, qkn ? a.q_raw.t : a.q.t, a.xn1.t, kWq, kBq, N, C, Q, "q_proj", phase);
  project(p, ad, a, qkn ? a.k_raw.t : a.k.t, a.xn1.t, kWk, kBk, N, C, KV, "k_proj", phase);
  project(p, ad, a, a.v.t, a.xn1.t, kWv, kBv, N, C, KV, "v_proj", phase);
  if (qkn) {
    timed("qk_norm", phase, 0, [&] {
      o.rmsnorm_forward(a.q.t, a.rstdq.t, a.q_raw.t, weight(p, kQNorm), N * NH, D, eps);
      o.rmsnorm_forward(a.k.t, a.rstdk.t, a.k_raw.t, weight(p, kKNorm), N * NKV, D, eps);
    });
  }
  timed("rope", phase, 0, [&] {
    o.rope_forward(a.q.t, a.q.t, rope_cos_.t, rope_sin_.t, B, T, NH, D, positions());
    o.rope_forward(a.k.t, a.k.t, rope_cos_.t, rope_sin_.t, B, T, NKV, D, positions());
  });
  const int W = int(cfg_.window_of(lora_layer_));  // this block's sliding window (lora_layer_: its index)
  timed("attention", phase, attention_flops(B, T, NH, D),
        [&] { o.attention_forward(a.y.t, a.att.t, a.q.t, a.k.t, a.v.t, B, T, NH, NKV, D, W, positions()); });
  // o_proj writes into x_mid, then the residual adds the block input in place.
  project(p, ad, a, a.x_mid.t, a.y.t, kWo, kBo, N, Q, C, "o_proj", phase);
  timed("residual", phase, 0, [&] { o.residual_forward(a.x_mid.t, x_in, a.x_mid.t); });
  timed("ffn_norm", phase, 0,
        [&] { o.rmsnorm_forward(a.xn2.t, a.rstd2.t, a.x_mid.t, weight(p, kFfnNorm), N, C, eps, w_off); });
  const size_t M = mlp_rows(cfg_, size_t(N), ckpt_);
  if (M < size_t(N) && phase == Phase::recompute) return;  // backward computes the MLP tile by tile
  for (size_t r0 = 0; r0 < size_t(N); r0 += M)
    mlp_tile_forward(p, ad, a, x_out, r0, std::min(M, size_t(N) - r0), phase);
  timed("residual", phase, 0, [&] { o.residual_forward(x_out, a.x_mid.t, x_out); });
}

void LlamaModel::mlp_tile_forward(const ChunkView& p, const ChunkView* ad, BlockActs& a, Tensor x_out,
                                  size_t r0, size_t n, Phase phase) {
  const int C = int(cfg_.d_model), F = int(cfg_.ffn_dim), rows = int(n);
  kernels::Ops& o = *ops_;
  const Tensor xn2 = a.xn2.t.slice(r0 * size_t(C), n * size_t(C));
  const Tensor gate = a.gate.t.slice(0, n * size_t(F)), up = a.up.t.slice(0, n * size_t(F)),
               h = a.h.t.slice(0, n * size_t(F));
  lora_row0_ = r0;
  project(p, ad, a, gate, xn2, kWGate, -1, rows, C, F, "gate_proj", phase);
  project(p, ad, a, up, xn2, kWUp, -1, rows, C, F, "up_proj", phase);
  if (cfg_.traits().act == MlpActivation::gelu_tanh)
    timed("geglu", phase, 0, [&] { o.geglu_forward(h, gate, up); });
  else
    timed("swiglu", phase, 0, [&] { o.swiglu_forward(h, gate, up); });
  if (x_out) {
    project(p, ad, a, x_out.slice(r0 * size_t(C), n * size_t(C)), h, kWDown, -1, rows, F, C, "down_proj",
            phase);
  } else if (ad) {
    lora_project_a(*ad, a, h, kWDown, rows, phase);  // the down projection's s · A h, for its backward
  }
  lora_row0_ = 0;
}

// On entry dresid_ holds d(loss)/d(x_out); on return d(loss)/d(x_in). Parameter gradients go into g; a
// frozen block (g null) gets none, only d(loss)/d(x_in).
void LlamaModel::block_backward(const ChunkView& p, float* g, const ChunkView* ad, float* ag, Tensor x_in,
                                BlockActs& a) {
  const int B = B_, T = T_, N = B * T, C = int(cfg_.d_model), F = int(cfg_.ffn_dim);
  const int NH = int(cfg_.n_heads), NKV = int(cfg_.n_kv_heads), D = int(cfg_.head_dim());
  const int Q = NH * D, KV = NKV * D;
  const Phase ph = Phase::backward;
  kernels::Ops& o = *ops_;
  auto dw = [&](int i) { return grad(p, g, i); };
  auto has = [&](int i) { return p.layout->has(i); };
  // The adapters' share of a projection's input gradient, once its base's is in.
  auto lora = [&](Tensor dx, Tensor dout, Tensor x, int proj, int OC) {
    if (ad) lora_backward(*ad, ag, a, dx, dout, x, proj, N, OC);
  };
  const Family& fam = cfg_.traits();  // one lookup per block
  const float w_off = fam.norm_offset;
  // Note [Backward buffers] (llama_buffers.cpp): dy, dq and dk in buffers the attention's phase no longer
  // reads.
  const BackwardScratch sc = backward_scratch(size_t(N), mlp_rows(cfg_, size_t(N), ckpt_) * size_t(F),
                                              size_t(C), size_t(Q), size_t(KV));
  const Tensor dy = (sc.dy_in_dxn ? dxn_.t : dblock_.t).slice(sc.dy, size_t(N) * Q);
  const Tensor dq = (sc.dq_in_mid ? a.x_mid.t : dblock_.t).slice(sc.dq, size_t(N) * Q);
  const Tensor dk = (sc.dk_in_xn2 ? a.xn2.t : dblock_.t).slice(sc.dk, size_t(N) * KV);
  const Tensor dv = dblock_.t.slice(sc.dv, size_t(N) * KV);

  // x_out = x_mid + down_proj(h): the residual passes dresid_ to both. The MLP's rows tile by tile (one
  // tile of all N rows unless Note [The MLP in tiles] tiles it, its forward recomputed here per tile).
  o.zero(dxn_.t);
  const size_t M = mlp_rows(cfg_, size_t(N), ckpt_);
  for (size_t r0 = 0; r0 < size_t(N); r0 += M) {
    const size_t n = std::min(M, size_t(N) - r0);
    const int rows = int(n);
    if (M < size_t(N)) mlp_tile_forward(p, ad, a, Tensor{}, r0, n, Phase::recompute);
    lora_row0_ = r0;
    auto lora_t = [&](Tensor dx, Tensor dout, Tensor x, int proj, int OC) {
      if (ad) lora_backward(*ad, ag, a, dx, dout, x, proj, rows, OC);
    };
    const Tensor dres = dresid_.t.slice(r0 * size_t(C), n * size_t(C)),
                 dxn = dxn_.t.slice(r0 * size_t(C), n * size_t(C)),
                 xn2 = a.xn2.t.slice(r0 * size_t(C), n * size_t(C));
    const Tensor gate = a.gate.t.slice(0, n * size_t(F)), up = a.up.t.slice(0, n * size_t(F)),
                 h = a.h.t.slice(0, n * size_t(F)), dht = dblock_.t.slice(sc.dh, n * size_t(F));
    o.zero(dht);
    timed(
        "down_proj", ph, 2 * linear_flops(rows, F, C),
        [&] { o.linear_backward(dht, dw(kWDown), dres, h, weight(p, kWDown), rows, F, C); }, rows, F, C);
    lora_t(dht, dres, h, kWDown, C);
    // In place: each element's gate and up are read before its dgate and dup are written, and nothing
    // after this reads the saved gate or up (a checkpointed block recomputes them).
    if (fam.act == MlpActivation::gelu_tanh)
      timed("geglu", ph, 0, [&] { o.geglu_backward(gate, up, dht, gate, up); });
    else
      timed("swiglu", ph, 0, [&] { o.swiglu_backward(gate, up, dht, gate, up); });
    const Tensor dgate = gate, dup = up;
    timed(
        "gate_proj", ph, 2 * linear_flops(rows, C, F),
        [&] { o.linear_backward(dxn, dw(kWGate), dgate, xn2, weight(p, kWGate), rows, C, F); }, rows, C, F);
    lora_t(dxn, dgate, xn2, kWGate, F);
    timed(
        "up_proj", ph, 2 * linear_flops(rows, C, F),
        [&] { o.linear_backward(dxn, dw(kWUp), dup, xn2, weight(p, kWUp), rows, C, F); }, rows, C, F);
    lora_t(dxn, dup, xn2, kWUp, F);
    lora_row0_ = 0;
  }
  timed("ffn_norm", ph, 0, [&] {
    o.rmsnorm_backward(dresid_.t, dw(kFfnNorm), dxn_.t, a.x_mid.t, weight(p, kFfnNorm), a.rstd2.t, N, C,
                       w_off);
  });
  // x_mid = x_in + o_proj(y).
  if (has(kBo) && g) o.bias_backward(dw(kBo), dresid_.t, N, C);
  o.zero(dy);
  timed(
      "o_proj", ph, 2 * linear_flops(N, Q, C),
      [&] { o.linear_backward(dy, dw(kWo), dresid_.t, a.y.t, weight(p, kWo), N, Q, C); }, N, Q, C);
  lora(dy, dresid_.t, a.y.t, kWo, C);
  const int W = int(cfg_.window_of(lora_layer_));  // this block's sliding window (lora_layer_: its index)
  timed("attention", ph, 2 * attention_flops(B, T, NH, D), [&] {
    o.attention_backward(dq, dk, dv, datt_.t, dy, a.q.t, a.k.t, a.v.t, a.y.t, a.att.t, B, T, NH, NKV, D, W,
                         positions());
  });
  timed("rope", ph, 0, [&] {
    o.rope_backward(dq, dq, rope_cos_.t, rope_sin_.t, B, T, NH, D, positions());
    o.rope_backward(dk, dk, rope_cos_.t, rope_sin_.t, B, T, NKV, D, positions());
  });
  // The per-head norm's backward takes dq, dk to the projections' outputs. Its dx accumulates, so it goes
  // to zeroed buffers no longer read: y (o_proj's backward is done) and v (attention's is).
  Tensor dq_proj = dq, dk_proj = dk;
  if (fam.qk_norm) {
    dq_proj = a.y.t.slice(0, size_t(N) * Q), dk_proj = a.v.t.slice(0, size_t(N) * KV);
    o.zero(dq_proj), o.zero(dk_proj);
    timed("qk_norm", ph, 0, [&] {
      o.rmsnorm_backward(dq_proj, dw(kQNorm), dq, a.q_raw.t, weight(p, kQNorm), a.rstdq.t, N * NH, D);
      o.rmsnorm_backward(dk_proj, dw(kKNorm), dk, a.k_raw.t, weight(p, kKNorm), a.rstdk.t, N * NKV, D);
    });
  }
  if (has(kBq) && g) {
    o.bias_backward(dw(kBq), dq_proj, N, Q);
    o.bias_backward(dw(kBk), dk_proj, N, KV);
    o.bias_backward(dw(kBv), dv, N, KV);
  }
  o.zero(dxn_.t);
  timed(
      "q_proj", ph, 2 * linear_flops(N, C, Q),
      [&] { o.linear_backward(dxn_.t, dw(kWq), dq_proj, a.xn1.t, weight(p, kWq), N, C, Q); }, N, C, Q);
  lora(dxn_.t, dq_proj, a.xn1.t, kWq, Q);
  timed(
      "k_proj", ph, 2 * linear_flops(N, C, KV),
      [&] { o.linear_backward(dxn_.t, dw(kWk), dk_proj, a.xn1.t, weight(p, kWk), N, C, KV); }, N, C, KV);
  lora(dxn_.t, dk_proj, a.xn1.t, kWk, KV);
  timed(
      "v_proj", ph, 2 * linear_flops(N, C, KV),
      [&] { o.linear_backward(dxn_.t, dw(kWv), dv, a.xn1.t, weight(p, kWv), N, C, KV); }, N, C, KV);
  lora(dxn_.t, dv, a.xn1.t, kWv, KV);
  timed("attn_norm", ph, 0, [&] {
    o.rmsnorm_backward(dresid_.t, dw(kAttnNorm), dxn_.t, x_in, weight(p, kAttnNorm), a.rstd1.t, N, C, w_off);
  });
}

float LlamaModel::forward(ChunkProvider& chunks, const int32_t* inputs, const int32_t* targets, int B, int T,
                          const int32_t* positions) {
  // Note [Dropout keys]: only an armed forward with targets drops out; the arming is this forward's alone,
  // taken even by a forward that throws below.
  const std::optional<std::uint64_t> armed = std::exchange(armed_key_, std::nullopt);
  check_layout(chunks);
  if (B < 1 || T < 1 || T > cfg_.max_seq_len)
    throw ConfigError(detail::cat("LlamaModel::forward: B = ", B, ", T = ", T,
                                  "; B must be >= 1 and T in [1, ", cfg_.max_seq_len,
                                  "] (max_seq_len of model '", cfg_.name, "')"));
  if (int64_t(B) * T > INT32_MAX)
    throw ConfigError(detail::cat("LlamaModel::forward: B * T = ", int64_t(B) * T,
                                  " tokens do not fit the ops' int row count; use a smaller batch"));
  have_targets_ = false;  // set on success only: a forward that throws leaves nothing to backward
  dropping_ = armed.has_value() && targets != nullptr && cfg_.lora.active() && cfg_.lora.dropout > 0;
  forward_key_ = armed.value_or(0);
  if (positions) check_document_positions(positions, B, T, "LlamaModel::forward");
  B_ = B, T_ = T;
  documents_ = positions != nullptr;
  ckpt_ = opts_.checkpoint_activations;
  // Note [Checkpoints off the device] (model/chunk.h): a checkpointing forward with targets keeps its block
  // inputs where the provider says, when it has a store.
  store_ = ckpt_ && targets != nullptr ? chunks.checkpoint_store() : nullptr;
  ensure_buffers(B, T, targets == nullptr, store_ != nullptr);
  const int N = B * T, C = int(cfg_.d_model), V = int(cfg_.vocab_size), L = int(cfg_.n_layers);
  const ModelLayout& layout = chunks.layout();
  kernels::Ops& o = *ops_;
  Stream& s = o.stream();
  // Every row's tokens are checked on the host: on the device a bad id is a NaN row, not an error.
  for (int i = 0; i < N; ++i) {
    if (inputs[i] < 0 || inputs[i] >= V)
      throw Error(detail::cat("LlamaModel::forward: token ", inputs[i], " at position ", i,
                              " is outside the vocabulary [0, ", V, ") of model '", cfg_.name, "'"));
    if (targets && targets[i] >= V)
      throw Error(detail::cat("LlamaModel::forward: target ", targets[i], " at position ", i,
                              " is outside the vocabulary [0, ", V, ") of model '", cfg_.name, "'"));
  }
  // The token ids go to the device on the compute stream, from pinned staging of the model's own (the
  // caller's arrays may go when this returns; the stream copies later). The staging is reused once the
  // last forward's copies are done, which they long are: the host does not wait for the stream here.
  const size_t tok_bytes = size_t(N) * sizeof(int32_t);
  if (tokens_copied_) tokens_copied_->synchronize();
  if (tokens_host_.size() < 3 * tok_bytes) tokens_host_ = PinnedBuffer(*dev_, 3 * tok_bytes);
  auto* staged = static_cast<int32_t*>(tokens_host_.data());
  std::memcpy(staged, inputs, tok_bytes);
  s.copy_async(inputs_.t.data, staged, tok_bytes, CopyKind::host_to_device);
  if (targets) {
    std::memcpy(staged + N, targets, tok_bytes);
    s.copy_async(targets_.t.data, staged + N, tok_bytes, CopyKind::host_to_device);
  }
  if (positions) {
    std::memcpy(staged + 2 * N, positions, tok_bytes);
    s.copy_async(positions_.t.data, staged + 2 * N, tok_bytes, CopyKind::host_to_device);
  }
  if (!tokens_copied_) tokens_copied_ = dev_->create_event();
  s.record(*tokens_copied_);

  if (store_) {
    stored_.assign(size_t(L), nullptr);
    store_->begin(L, size_t(N) * size_t(C) * dtype_bytes(act_));
    stored_[0] = store_->put(0);
  }
  {
    ChunkTimer ct(profile_, layout.embedding_chunk(), Phase::forward, &chunk_flops_);
    Held e(chunks, layout.embedding_chunk());
    timed("embedding", Phase::forward, 0, [&] {
      o.embedding_forward(resid(0), inputs_.t, weight(e.view(), kTokEmbeddings), N, C, V);
      if (embed_scale() != 1.0f) o.scale(resid(0), embed_scale());
    });
  }
  if (store_) store_->written(0);
  for (int l = 0; l < L; ++l) {
    ChunkTimer ct(profile_, layout.block_chunk(l), Phase::forward, &chunk_flops_);
    Held b(chunks, layout.block_chunk(l));
    const int ad_id = layout.adapter_chunk(l);
    std::optional<Held> ad;
    if (ad_id >= 0) ad.emplace(chunks, ad_id);
    lora_layer_ = l;
    const bool to_store = store_ && l + 1 < L;
    if (to_store) stored_[size_t(l) + 1] = store_->put(l + 1);
    block_forward(b.view(), ad ? &ad->view() : nullptr, resid(l), resid(l + 1), acts_[ckpt_ ? 0 : size_t(l)],
                  Phase::forward);
    if (to_store) store_->written(l + 1);
    if (store_) store_->forward_done(l), stored_[size_t(l)] = nullptr;
  }
  float loss = 0.0f;
  {
    ChunkTimer ct(profile_, layout.head_chunk(), Phase::forward, &chunk_flops_);
    Held h(chunks, layout.head_chunk());
    timed("final_norm", Phase::forward, 0, [&] {
      o.rmsnorm_forward(xf(), rstdf_.t, resid(L), weight(h.view(), kFinalNorm), N, C, cfg_.norm_eps,
                        cfg_.traits().norm_offset);
    });
    std::optional<Held> e, lm;
    Tensor w;
    if (cfg_.tie_embeddings) {
      e.emplace(chunks, layout.embedding_chunk());
      w = weight(e->view(), kTokEmbeddings);
    } else if (layout.lm_head_chunk() != layout.head_chunk()) {  // lm_head trains beside adapters
      lm.emplace(chunks, layout.lm_head_chunk());
      w = weight(lm->view(), kLmHead);
    } else {
      w = weight(h.view(), kLmHead);
    }
    const size_t rows = targets ? loss_rows(cfg_, size_t(N)) : size_t(N);
    if (targets) {
      n_valid_ = 0;
      for (int i = 0; i < N; ++i) n_valid_ += targets[i] >= 0 ? 1 : 0;
    }
    if (rows == size_t(N)) {
      head_forward_logits(w, 0, size_t(N), Phase::forward);
      if (targets) {
        timed("cross_entropy", Phase::forward, 0,
              [&] { o.cross_entropy(Tensor{}, losses_.t, loss_.t, logits_.t, targets_.t, N, V, 1.0f); });
        loss = o.read_f32(loss_.t);
      }
    } else {  // Note [The loss in row chunks]
      for (size_t r0 = 0; r0 < size_t(N); r0 += rows) {
        const size_t n = std::min(rows, size_t(N) - r0);
        head_forward_logits(w, r0, n, Phase::forward);
        timed("cross_entropy", Phase::forward, 0, [&] {
          o.cross_entropy(Tensor{}, losses_.t.slice(r0, n), loss_.t, logits_.t.slice(0, n * size_t(V)),
                          targets_.t.slice(r0, n), int(n), V, 1.0f, n_valid_);
        });
      }
      std::vector<float> row_loss(static_cast<size_t>(N));
      s.copy_async(row_loss.data(), losses_.t.data, row_loss.size() * sizeof(float),
                   CopyKind::device_to_host);
      s.synchronize();
      double total = 0.0;
      for (float l : row_loss) total += double(l);  // an ignored row's loss is 0
      loss = n_valid_ > 0 ? float(total / n_valid_) : 0.0f;
    }
  }
  have_targets_ = targets != nullptr;
  return loss;
}

void LlamaModel::head_forward_logits(Tensor w_head, size_t r0, size_t n, Phase phase) {
  const int C = int(cfg_.d_model), V = int(cfg_.vocab_size);
  timed(
      "lm_head", phase, linear_flops(int(n), C, V),
      [&] {
        ops_->linear_forward(logits_.t.slice(0, n * size_t(V)), xf().slice(r0 * size_t(C), n * size_t(C)),
                             w_head, int(n), C, V);
      },
      int(n), C, V);
}

void LlamaModel::backward(ChunkProvider& chunks, float grad_scale) {
  STRATA_CHECK(B_ > 0 && have_targets_, "LlamaModel::backward needs a forward with targets first");
  check_layout(chunks);
  have_targets_ = false;  // the logits become dlogits below; a second backward needs a new forward
  const int B = B_, T = T_, N = B * T, C = int(cfg_.d_model), V = int(cfg_.vocab_size),
            L = int(cfg_.n_layers);
  const ModelLayout& layout = chunks.layout();
  const Phase ph = Phase::backward;
  kernels::Ops& o = *ops_;

  {
    ChunkTimer ct(profile_, layout.head_chunk(), ph, &chunk_flops_);
    Held h(chunks, layout.head_chunk());
    HeldGrads hg(chunks, layout.head_chunk());
    const size_t rows = loss_rows(cfg_, size_t(N));
    if (rows == size_t(N))
      timed("cross_entropy", ph, 0,
            [&] { o.cross_entropy(logits_.t, losses_.t, loss_.t, logits_.t, targets_.t, N, V, grad_scale); });
    o.zero(dxn_.t);
    auto lm_head_backward = [&](Tensor w, Tensor dw) {
      if (rows == size_t(N)) {
        timed(
            "lm_head", ph, 2 * linear_flops(N, C, V),
            [&] { o.linear_backward(dxn_.t, dw, logits_.t, xf(), w, N, C, V); }, N, C, V);
        return;
      }
      // Note [The loss in row chunks]: each chunk's logits again, its dlogits in place, its dx rows and
      // its share of dW, in row order.
      for (size_t r0 = 0; r0 < size_t(N); r0 += rows) {
        const size_t n = std::min(rows, size_t(N) - r0);
        const Tensor lg = logits_.t.slice(0, n * size_t(V));
        const Tensor x = xf().slice(r0 * size_t(C), n * size_t(C));
        head_forward_logits(w, r0, n, Phase::recompute);
        timed("cross_entropy", ph, 0, [&] {
          o.cross_entropy(lg, losses_.t.slice(r0, n), loss_.t, lg, targets_.t.slice(r0, n), int(n), V,
                          grad_scale, n_valid_);
        });
        timed(
            "lm_head", ph, 2 * linear_flops(int(n), C, V),
            [&] {
              o.linear_backward(dxn_.t.slice(r0 * size_t(C), n * size_t(C)), dw, lg, x, w, int(n), C, V);
            },
            int(n), C, V);
      }
    };
    if (cfg_.tie_embeddings) {
      const int e_id = layout.embedding_chunk();
      Held e(chunks, e_id);
      HeldGrads eg(chunks, e_id);
      lm_head_backward(weight(e.view(), kTokEmbeddings), grad(e.view(), eg.data(), kTokEmbeddings));
    } else if (const int lm_id = layout.lm_head_chunk(); lm_id != layout.head_chunk()) {
      Held lm(chunks, lm_id);
      HeldGrads lg(chunks, lm_id);
      lm_head_backward(weight(lm.view(), kLmHead), grad(lm.view(), lg.data(), kLmHead));
    } else {
      lm_head_backward(weight(h.view(), kLmHead), grad(h.view(), hg.data(), kLmHead));
    }
    o.zero(dresid_.t);
    timed("final_norm", ph, 0, [&] {
      o.rmsnorm_backward(dresid_.t, grad(h.view(), hg.data(), kFinalNorm), dxn_.t, resid(L),
                         weight(h.view(), kFinalNorm), rstdf_.t, N, C, cfg_.traits().norm_offset);
    });
  }
  for (int l = L - 1; l >= 0; --l) {
    ChunkTimer ct(profile_, layout.block_chunk(l), ph, &chunk_flops_);
    Held b(chunks, layout.block_chunk(l));
    HeldGrads bg(chunks, layout.block_chunk(l));
    const int ad_id = layout.adapter_chunk(l);
    std::optional<Held> ad;
    std::optional<HeldGrads> ag;
    if (ad_id >= 0) ad.emplace(chunks, ad_id), ag.emplace(chunks, ad_id);
    const ChunkView* adv = ad ? &ad->view() : nullptr;
    BlockActs& a = acts_[ckpt_ ? 0 : size_t(l)];
    lora_layer_ = l;
    if (store_) stored_[size_t(l)] = store_->get(l, l - 1);
    if (ckpt_) {
      // The recomputed block output is not needed (resid(l + 1) holds it); dxn_ takes it as scratch
      // before block_backward zeroes it.
      block_forward(b.view(), adv, resid(l), dxn_.t, a, Phase::recompute);
    }
    block_backward(b.view(), bg.data(), adv, ag ? ag->data() : nullptr, resid(l), a);
    if (store_) store_->backward_done(l), stored_[size_t(l)] = nullptr;
  }
  if (chunks.trains(layout.embedding_chunk())) {  // frozen: the lookup's backward has nothing to compute
    const int e_id = layout.embedding_chunk();
    ChunkTimer ct(profile_, e_id, ph, &chunk_flops_);
    HeldGrads eg(chunks, e_id);
    const TensorSpec& et = layout.chunk(e_id).at(kTokEmbeddings);
    const Tensor dwte{eg.data() + et.offset, DType::fp32, et.numel};
    timed("embedding", ph, 0, [&] {
      if (embed_scale() != 1.0f) o.scale(dresid_.t, embed_scale());
      // transformers' padding_idx: the lookup adds nothing to the pad token's row (a tied head's part stays).
      const Tensor pad = cfg_.pad_token_id >= 0 ? dwte.slice(size_t(cfg_.pad_token_id) * C, C) : Tensor{};
      if (pad) o.cast(pad_row_.t, pad);
      o.embedding_backward(dwte, dresid_.t, inputs_.t, N, C, V);
      if (pad) o.cast(pad, pad_row_.t);
    });
  }
  // For a provider that reads its gradients on the host (its own accumulator), they are complete when
  // backward returns, and an op's failure surfaces here. One that orders its hand-offs by stream events
  // (the engine) waits where it reads.
  if (!chunks.orders_grads_by_stream()) o.stream().synchronize();
}

}  // namespace strata::model
