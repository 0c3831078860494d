#include "model/llama.h"

#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "kernels/cpu/ops.h"

namespace strata::model {
namespace {

namespace kc = strata::kernels::cpu;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void zero(std::vector<float>& v) {
  std::memset(v.data(), 0, v.size() * sizeof(float));
}

// Grows `v` to n elements (contents unspecified); never shrinks, so repeated steps do not reallocate.
void fit(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

double linear_flops(int64_t n, int64_t ic, int64_t oc) {
  return 2.0 * double(n) * double(ic) * double(oc);
}

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

// Acquire/release pairs that also release when an op throws.
class Held {
 public:
  Held(ChunkProvider& c, int id) : c_(c), id_(id), view_(c.acquire(id)) {}
  ~Held() { c_.release(id_); }
  const ChunkView& view() const { return view_; }

 private:
  ChunkProvider& c_;
  int id_;
  ChunkView view_;
};

class HeldGrads {
 public:
  HeldGrads(ChunkProvider& c, int id) : c_(c), id_(id), g_(c.acquire_grads(id)) {}
  ~HeldGrads() { c_.release_grads(id_); }
  float* data() const { return g_; }

 private:
  ChunkProvider& c_;
  int id_;
  float* g_;
};

}  // namespace

LlamaModel::LlamaModel(const ModelConfig& cfg, ModelOptions opts) : cfg_(cfg), opts_(opts) {
  cfg_.validate("LlamaModel");
  STRATA_CHECK(cfg_.vocab_size <= INT32_MAX && cfg_.d_model <= INT32_MAX && cfg_.ffn_dim <= INT32_MAX,
               "model dimensions must fit int for the ops");
}

template <typename Fn>
void LlamaModel::timed(const char* op, Phase phase, double flops, Fn&& fn, int64_t n, int64_t ic,
                       int64_t oc) {
  chunk_flops_ += flops;
  if (!profile_) {
    fn();
    return;
  }
  auto t0 = Clock::now();
  fn();
  profile_->add_op(op, phase, seconds_since(t0), flops, n, ic, oc);
}

void LlamaModel::check_layout(const ChunkProvider& chunks) const {
  const ModelConfig& have = chunks.layout().config();
  STRATA_CHECK(have == cfg_, "the chunk provider's layout is for model '", have.name, "' (",
               have.to_json().dump(), "), this LlamaModel is '", cfg_.name, "' (", cfg_.to_json().dump(),
               ")");
}

void LlamaModel::ensure_buffers(int B, int T) {
  const size_t N = size_t(B) * size_t(T), C = size_t(cfg_.d_model), F = size_t(cfg_.ffn_dim);
  const size_t Q = size_t(cfg_.q_dim()), KV = size_t(cfg_.kv_dim()), V = size_t(cfg_.vocab_size);
  const size_t L = size_t(cfg_.n_layers), ATT = size_t(B) * size_t(cfg_.n_heads) * size_t(T) * size_t(T);
  const size_t sets = opts_.checkpoint_activations ? 1 : L;
  if (acts_.size() < sets) acts_.resize(sets);
  for (size_t i = 0; i < sets; ++i) {
    BlockActs& a = acts_[i];
    fit(a.rstd1, N), fit(a.xn1, N * C), fit(a.q, N * Q), fit(a.k, N * KV), fit(a.v, N * KV);
    fit(a.att, ATT), fit(a.y, N * Q), fit(a.x_mid, N * C), fit(a.rstd2, N), fit(a.xn2, N * C);
    fit(a.gate, N * F), fit(a.up, N * F), fit(a.h, N * F);
  }
  fit(resid_, (L + 1) * N * C);
  fit(xf_, N * C), fit(rstdf_, N), fit(logits_, N * V);
  fit(dresid_, N * C), fit(dxn_, N * C), fit(dh_, N * F), fit(dgate_, N * F), fit(dup_, N * F);
  fit(dy_, N * Q), fit(dq_, N * Q), fit(dk_, N * KV), fit(dv_, N * KV), fit(datt_, ATT);
  if (rope_T_ != T) {
    const size_t half = size_t(cfg_.head_dim()) / 2;
    rope_cos_.assign(size_t(T) * half, 0.0f);
    rope_sin_.assign(size_t(T) * half, 0.0f);
    kc::rope_cache(rope_cos_.data(), rope_sin_.data(), T, int(cfg_.head_dim()), cfg_.rope_theta);
    rope_T_ = T;
  }
}

size_t LlamaModel::activation_bytes() const {
  size_t n = 0;
  auto add = [&](const std::vector<float>& v) { n += v.capacity() * sizeof(float); };
  for (const BlockActs& a : acts_) {
    for (const auto* v :
         {&a.rstd1, &a.xn1, &a.q, &a.k, &a.v, &a.att, &a.y, &a.x_mid, &a.rstd2, &a.xn2, &a.gate, &a.up, &a.h})
      add(*v);
  }
  for (const auto* v : {&resid_, &xf_, &rstdf_, &logits_, &dresid_, &dxn_, &dh_, &dgate_, &dup_, &dy_, &dq_,
                        &dk_, &dv_, &datt_})
    add(*v);
  return n;
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

void LlamaModel::block_forward(const ChunkView& p, const float* x_in, float* x_out, BlockActs& a,
                               Phase phase) {
  const int B = B_, T = T_, N = B * T, C = int(cfg_.d_model), F = int(cfg_.ffn_dim);
  const int NH = int(cfg_.n_heads), NKV = int(cfg_.n_kv_heads), D = int(cfg_.head_dim());
  const int Q = NH * D, KV = NKV * D;
  const float eps = cfg_.norm_eps;

  timed("attn_norm", phase, 0,
        [&] { kc::rmsnorm_forward(a.xn1.data(), a.rstd1.data(), x_in, p.tensor(kAttnNorm), N, C, eps); });
  timed(
      "q_proj", phase, linear_flops(N, C, Q),
      [&] { kc::linear_forward(a.q.data(), a.xn1.data(), p.tensor(kWq), N, C, Q); }, N, C, Q);
  timed(
      "k_proj", phase, linear_flops(N, C, KV),
      [&] { kc::linear_forward(a.k.data(), a.xn1.data(), p.tensor(kWk), N, C, KV); }, N, C, KV);
  timed(
      "v_proj", phase, linear_flops(N, C, KV),
      [&] { kc::linear_forward(a.v.data(), a.xn1.data(), p.tensor(kWv), N, C, KV); }, N, C, KV);
  timed("rope", phase, 0, [&] {
    kc::rope_forward(a.q.data(), a.q.data(), rope_cos_.data(), rope_sin_.data(), B, T, NH, D);
    kc::rope_forward(a.k.data(), a.k.data(), rope_cos_.data(), rope_sin_.data(), B, T, NKV, D);
  });
  timed("attention", phase, attention_flops(B, T, NH, D), [&] {
    kc::attention_forward(a.y.data(), a.att.data(), a.q.data(), a.k.data(), a.v.data(), B, T, NH, NKV, D);
  });
  // o_proj writes into x_mid, then the residual adds the block input in place.
  timed(
      "o_proj", phase, linear_flops(N, Q, C),
      [&] { kc::linear_forward(a.x_mid.data(), a.y.data(), p.tensor(kWo), N, Q, C); }, N, Q, C);
  timed("residual", phase, 0,
        [&] { kc::residual_forward(a.x_mid.data(), x_in, a.x_mid.data(), size_t(N) * C); });
  timed("ffn_norm", phase, 0, [&] {
    kc::rmsnorm_forward(a.xn2.data(), a.rstd2.data(), a.x_mid.data(), p.tensor(kFfnNorm), N, C, eps);
  });
  timed(
      "gate_proj", phase, linear_flops(N, C, F),
      [&] { kc::linear_forward(a.gate.data(), a.xn2.data(), p.tensor(kWGate), N, C, F); }, N, C, F);
  timed(
      "up_proj", phase, linear_flops(N, C, F),
      [&] { kc::linear_forward(a.up.data(), a.xn2.data(), p.tensor(kWUp), N, C, F); }, N, C, F);
  timed("swiglu", phase, 0,
        [&] { kc::swiglu_forward(a.h.data(), a.gate.data(), a.up.data(), size_t(N) * F); });
  timed(
      "down_proj", phase, linear_flops(N, F, C),
      [&] { kc::linear_forward(x_out, a.h.data(), p.tensor(kWDown), N, F, C); }, N, F, C);
  timed("residual", phase, 0, [&] { kc::residual_forward(x_out, a.x_mid.data(), x_out, size_t(N) * C); });
}

// On entry dresid_ holds d(loss)/d(x_out); on return d(loss)/d(x_in). Parameter gradients go into g.
void LlamaModel::block_backward(const ChunkView& p, float* g, const float* x_in, BlockActs& a) {
  const int B = B_, T = T_, N = B * T, C = int(cfg_.d_model), F = int(cfg_.ffn_dim);
  const int NH = int(cfg_.n_heads), NKV = int(cfg_.n_kv_heads), D = int(cfg_.head_dim());
  const int Q = NH * D, KV = NKV * D;
  const auto& t = p.layout->tensors;
  auto grad = [&](int i) { return g + t[size_t(i)].offset; };
  const Phase ph = Phase::backward;

  // x_out = x_mid + down_proj(h): the residual passes dresid_ to both.
  zero(dh_);
  timed(
      "down_proj", ph, 2 * linear_flops(N, F, C),
      [&] {
        kc::linear_backward(dh_.data(), grad(kWDown), dresid_.data(), a.h.data(), p.tensor(kWDown), N, F, C);
      },
      N, F, C);
  timed("swiglu", ph, 0, [&] {
    kc::swiglu_backward(dgate_.data(), dup_.data(), dh_.data(), a.gate.data(), a.up.data(), size_t(N) * F);
  });
  zero(dxn_);
  timed(
      "gate_proj", ph, 2 * linear_flops(N, C, F),
      [&] {
        kc::linear_backward(dxn_.data(), grad(kWGate), dgate_.data(), a.xn2.data(), p.tensor(kWGate), N, C,
                            F);
      },
      N, C, F);
  timed(
      "up_proj", ph, 2 * linear_flops(N, C, F),
      [&] {
        kc::linear_backward(dxn_.data(), grad(kWUp), dup_.data(), a.xn2.data(), p.tensor(kWUp), N, C, F);
      },
      N, C, F);
  timed("ffn_norm", ph, 0, [&] {
    kc::rmsnorm_backward(dresid_.data(), grad(kFfnNorm), dxn_.data(), a.x_mid.data(), p.tensor(kFfnNorm),
                         a.rstd2.data(), N, C);
  });
  // x_mid = x_in + o_proj(y).
  zero(dy_);
  timed(
      "o_proj", ph, 2 * linear_flops(N, Q, C),
      [&] { kc::linear_backward(dy_.data(), grad(kWo), dresid_.data(), a.y.data(), p.tensor(kWo), N, Q, C); },
      N, Q, C);
  timed("attention", ph, 2 * attention_flops(B, T, NH, D), [&] {
    kc::attention_backward(dq_.data(), dk_.data(), dv_.data(), datt_.data(), dy_.data(), a.q.data(),
                           a.k.data(), a.v.data(), a.att.data(), B, T, NH, NKV, D);
  });
  timed("rope", ph, 0, [&] {
    kc::rope_backward(dq_.data(), dq_.data(), rope_cos_.data(), rope_sin_.data(), B, T, NH, D);
    kc::rope_backward(dk_.data(), dk_.data(), rope_cos_.data(), rope_sin_.data(), B, T, NKV, D);
  });
  zero(dxn_);
  timed(
      "q_proj", ph, 2 * linear_flops(N, C, Q),
      [&] { kc::linear_backward(dxn_.data(), grad(kWq), dq_.data(), a.xn1.data(), p.tensor(kWq), N, C, Q); },
      N, C, Q);
  timed(
      "k_proj", ph, 2 * linear_flops(N, C, KV),
      [&] { kc::linear_backward(dxn_.data(), grad(kWk), dk_.data(), a.xn1.data(), p.tensor(kWk), N, C, KV); },
      N, C, KV);
  timed(
      "v_proj", ph, 2 * linear_flops(N, C, KV),
      [&] { kc::linear_backward(dxn_.data(), grad(kWv), dv_.data(), a.xn1.data(), p.tensor(kWv), N, C, KV); },
      N, C, KV);
  timed("attn_norm", ph, 0, [&] {
    kc::rmsnorm_backward(dresid_.data(), grad(kAttnNorm), dxn_.data(), x_in, p.tensor(kAttnNorm),
                         a.rstd1.data(), N, C);
  });
}

float LlamaModel::forward(ChunkProvider& chunks, const int32_t* inputs, const int32_t* targets, int B,
                          int T) {
  check_layout(chunks);
  if (B < 1 || T < 1 || T > cfg_.max_seq_len)
    throw ConfigError(detail::cat("LlamaModel::forward: B = ", B, ", T = ", T,
                                  "; B must be >= 1 and T in [1, ", cfg_.max_seq_len,
                                  "] (max_seq_len of model '", cfg_.name, "')"));
  if (int64_t(B) * T > INT32_MAX)
    throw ConfigError(detail::cat("LlamaModel::forward: B * T = ", int64_t(B) * T,
                                  " tokens do not fit the ops' int row count; use a smaller batch"));
  B_ = B, T_ = T;
  ckpt_ = opts_.checkpoint_activations;
  ensure_buffers(B, T);
  const int N = B * T, C = int(cfg_.d_model), V = int(cfg_.vocab_size), L = int(cfg_.n_layers);
  const ModelLayout& layout = chunks.layout();
  inputs_.assign(inputs, inputs + N);
  have_targets_ = false;  // set on success only: a forward that throws leaves nothing to backward
  if (targets) targets_.assign(targets, targets + N);
  auto resid = [&](int l) { return resid_.data() + size_t(l) * N * C; };

  {
    ChunkTimer ct(profile_, layout.embedding_chunk(), Phase::forward, &chunk_flops_);
    Held e(chunks, layout.embedding_chunk());
    timed("embedding", Phase::forward, 0,
          [&] { kc::embedding_forward(resid(0), inputs_.data(), e.view().tensor(kTokEmbeddings), N, C, V); });
  }
  for (int l = 0; l < L; ++l) {
    ChunkTimer ct(profile_, layout.block_chunk(l), Phase::forward, &chunk_flops_);
    Held b(chunks, layout.block_chunk(l));
    block_forward(b.view(), resid(l), resid(l + 1), acts_[ckpt_ ? 0 : size_t(l)], Phase::forward);
  }
  float loss = 0.0f;
  {
    ChunkTimer ct(profile_, layout.head_chunk(), Phase::forward, &chunk_flops_);
    Held h(chunks, layout.head_chunk());
    timed("final_norm", Phase::forward, 0, [&] {
      kc::rmsnorm_forward(xf_.data(), rstdf_.data(), resid(L), h.view().tensor(kFinalNorm), N, C,
                          cfg_.norm_eps);
    });
    if (cfg_.tie_embeddings) {
      Held e(chunks, layout.embedding_chunk());
      head_forward_logits(e.view().tensor(kTokEmbeddings), xf_.data());
    } else {
      head_forward_logits(h.view().tensor(kLmHead), xf_.data());
    }
    if (targets)
      timed("cross_entropy", Phase::forward, 0, [&] {
        loss =
            kc::cross_entropy_forward_backward(nullptr, nullptr, logits_.data(), targets_.data(), N, V, 1.0f);
      });
  }
  have_targets_ = targets != nullptr;
  return loss;
}

void LlamaModel::head_forward_logits(const float* w_head, const float* x) {
  const int N = B_ * T_, C = int(cfg_.d_model), V = int(cfg_.vocab_size);
  timed(
      "lm_head", Phase::forward, linear_flops(N, C, V),
      [&] { kc::linear_forward(logits_.data(), x, w_head, N, C, V); }, N, C, V);
}

void LlamaModel::backward(ChunkProvider& chunks, float grad_scale) {
  STRATA_CHECK(B_ > 0 && have_targets_, "LlamaModel::backward needs a forward with targets first");
  check_layout(chunks);
  have_targets_ = false;  // the logits become dlogits below; a second backward needs a new forward
  const int B = B_, T = T_, N = B * T, C = int(cfg_.d_model), V = int(cfg_.vocab_size),
            L = int(cfg_.n_layers);
  const ModelLayout& layout = chunks.layout();
  auto resid = [&](int l) { return resid_.data() + size_t(l) * N * C; };
  const Phase ph = Phase::backward;

  {
    ChunkTimer ct(profile_, layout.head_chunk(), ph, &chunk_flops_);
    Held h(chunks, layout.head_chunk());
    HeldGrads hg(chunks, layout.head_chunk());
    const auto& ht = layout.chunk(layout.head_chunk()).tensors;
    timed("cross_entropy", ph, 0, [&] {
      kc::cross_entropy_forward_backward(logits_.data(), nullptr, logits_.data(), targets_.data(), N, V,
                                         grad_scale);
    });
    zero(dxn_);
    auto lm_head_backward = [&](const float* w, float* dw) {
      timed(
          "lm_head", ph, 2 * linear_flops(N, C, V),
          [&] { kc::linear_backward(dxn_.data(), dw, logits_.data(), xf_.data(), w, N, C, V); }, N, C, V);
    };
    if (cfg_.tie_embeddings) {
      const int e_id = layout.embedding_chunk();
      Held e(chunks, e_id);
      HeldGrads eg(chunks, e_id);
      lm_head_backward(e.view().tensor(kTokEmbeddings),
                       eg.data() + layout.chunk(e_id).tensors[kTokEmbeddings].offset);
    } else {
      lm_head_backward(h.view().tensor(kLmHead), hg.data() + ht[kLmHead].offset);
    }
    zero(dresid_);
    timed("final_norm", ph, 0, [&] {
      kc::rmsnorm_backward(dresid_.data(), hg.data() + ht[kFinalNorm].offset, dxn_.data(), resid(L),
                           h.view().tensor(kFinalNorm), rstdf_.data(), N, C);
    });
  }
  for (int l = L - 1; l >= 0; --l) {
    ChunkTimer ct(profile_, layout.block_chunk(l), ph, &chunk_flops_);
    Held b(chunks, layout.block_chunk(l));
    HeldGrads bg(chunks, layout.block_chunk(l));
    BlockActs& a = acts_[ckpt_ ? 0 : size_t(l)];
    if (ckpt_) {
      // The recomputed block output is not needed (resid(l + 1) holds it); dxn_ takes it as scratch
      // before block_backward zeroes it.
      block_forward(b.view(), resid(l), dxn_.data(), a, Phase::recompute);
    }
    block_backward(b.view(), bg.data(), resid(l), a);
  }
  {
    const int e_id = layout.embedding_chunk();
    ChunkTimer ct(profile_, e_id, ph, &chunk_flops_);
    HeldGrads eg(chunks, e_id);
    timed("embedding", ph, 0, [&] {
      kc::embedding_backward(eg.data() + layout.chunk(e_id).tensors[kTokEmbeddings].offset, dresid_.data(),
                             inputs_.data(), N, C, V);
    });
  }
}

}  // namespace strata::model
