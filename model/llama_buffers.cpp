// The decoder's device buffers (model/llama.h): which it allocates for a forward and backward over (B, T)
// and how large — the activations the engine plans for — with the two thresholds that bound them at long
// context (Note [The loss in row chunks], Note [The MLP in tiles]). llama.cpp computes with them.
#include <algorithm>
#include <atomic>
#include <vector>

#include "core/error.h"
#include "model/llama.h"
#include "model/rope.h"

namespace strata::model {

using kernels::Tensor;
namespace {

// The attention buffers of every layer: each layer's sliding window (Note [Sliding windows] in config.h)
// may take another path, with other sizes (kernels/cuda: Note [attention paths]), so the largest of each;
// with `documents` the paths that keep packed documents apart.
kernels::AttentionSizes layer_attention_sizes(const kernels::Ops& ops, const ModelConfig& cfg, int B, int T,
                                              bool documents) {
  kernels::AttentionSizes as{};
  std::vector<int64_t> seen;
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const int64_t w = cfg.window_of(l);
    if (std::find(seen.begin(), seen.end(), w) != seen.end()) continue;
    seen.push_back(w);
    const kernels::AttentionSizes s = ops.attention_sizes(B, T, int(cfg.n_heads), int(cfg.n_kv_heads),
                                                          int(cfg.head_dim()), int(w), documents);
    as.saved = std::max(as.saved, s.saved);
    as.scratch = std::max(as.scratch, s.scratch);
  }
  return as;
}

}  // namespace

template <typename M, typename Fn>
void LlamaModel::each_buffer(const ModelConfig& cfg, int B, int T, bool ckpt, bool stored, DType act,
                             kernels::AttentionSizes as, size_t logit_rows, M* m, Fn&& fn) {
  const size_t N = size_t(B) * size_t(T), C = size_t(cfg.d_model), F = size_t(cfg.ffn_dim);
  const size_t Q = size_t(cfg.q_dim()), KV = size_t(cfg.kv_dim()), V = size_t(cfg.vocab_size);
  const size_t L = size_t(cfg.n_layers), half = size_t(cfg.head_dim()) / 2;
  const size_t sets = ckpt ? 1 : L;
  const size_t MR = mlp_rows(cfg, N, ckpt);  // the MLP's rows at once (Note [The MLP in tiles])
  const bool lora = cfg.lora.active();
  const size_t R = lora ? size_t(cfg.lora.r) : 0;
  constexpr DType f32 = DType::fp32, i32 = DType::i32;
  auto at = [&](Buf LlamaModel::*b) { return m ? &(m->*b) : nullptr; };
  for (size_t i = 0; i < sets; ++i) {
    auto* a = m ? &m->acts_[i] : nullptr;
    auto in = [&](Buf BlockActs::*b) { return a ? &(a->*b) : nullptr; };
    fn(in(&BlockActs::rstd1), N, f32), fn(in(&BlockActs::xn1), N * C, act), fn(in(&BlockActs::q), N * Q, act);
    fn(in(&BlockActs::k), N * KV, act), fn(in(&BlockActs::v), N * KV, act),
        fn(in(&BlockActs::att), as.saved, f32);
    fn(in(&BlockActs::y), N * Q, act), fn(in(&BlockActs::x_mid), N * C, act),
        fn(in(&BlockActs::rstd2), N, f32);
    fn(in(&BlockActs::xn2), N * C, act), fn(in(&BlockActs::gate), MR * F, act),
        fn(in(&BlockActs::up), MR * F, act);
    fn(in(&BlockActs::h), MR * F, act);
    const bool qkn = cfg.traits().qk_norm;
    fn(in(&BlockActs::q_raw), qkn ? N * Q : 0, act), fn(in(&BlockActs::k_raw), qkn ? N * KV : 0, act);
    fn(in(&BlockActs::rstdq), qkn ? N * size_t(cfg.n_heads) : 0, f32),
        fn(in(&BlockActs::rstdk), qkn ? N * size_t(cfg.n_kv_heads) : 0, f32);
    fn(in(&BlockActs::lora_t), lora ? N * R * lora_sites_of(cfg).size() : 0, act);
  }
  fn(at(&LlamaModel::inputs_), N, i32), fn(at(&LlamaModel::targets_), N, i32),
      fn(at(&LlamaModel::positions_), N, i32);
  fn(at(&LlamaModel::rope_cos_), size_t(T) * half, f32),
      fn(at(&LlamaModel::rope_sin_), size_t(T) * half, f32);
  // Note [The head's buffers under checkpointing]: with one block set, the head's input and the final
  // norm's output live in it.
  fn(at(&LlamaModel::resid_), (ckpt ? (stored ? 0 : L) : L + 1) * N * C, act);
  fn(at(&LlamaModel::xf_), ckpt ? 0 : N * C, act), fn(at(&LlamaModel::rstdf_), N, f32),
      fn(at(&LlamaModel::logits_), logit_rows * V, act);
  fn(at(&LlamaModel::losses_), N, f32), fn(at(&LlamaModel::loss_), 1, f32);
  fn(at(&LlamaModel::dresid_), N * C, act), fn(at(&LlamaModel::dxn_), N * C, act);
  fn(at(&LlamaModel::dblock_), backward_scratch(N, MR * F, C, Q, KV).numel, act);
  fn(at(&LlamaModel::datt_), as.scratch, f32);
  fn(at(&LlamaModel::pad_row_), cfg.pad_token_id >= 0 ? C : 0, f32);
  fn(at(&LlamaModel::lora_u_), lora ? std::max(N * std::max({Q, KV, C}), MR * F) : 0, act);
  fn(at(&LlamaModel::lora_dt_), lora ? N * R : 0, act);
  fn(at(&LlamaModel::lora_x_), lora && cfg.lora.dropout > 0 ? N * std::max({Q, C, F}) : 0, act);
}

// Note [Backward buffers]: a block's backward has two phases. The MLP's (dh, from the down projection to
// the SwiGLU backward, a tile's rows x ffn_dim) reads every buffer of the block set. The attention's
// (dy from the o projection to the attention backward; dq, dk, dv from there to the q, k and v
// projections' backward) starts once the MLP's and ffn_norm's backward are done, and from then on three
// (N, C) buffers are no longer read: x_mid and xn2 (their last reader is the ffn_norm's and up/gate
// projections' backward) and dxn_ (zeroed again before the q projection's backward). So dy goes to dxn_
// (read only by the attention backward, before that zeroing), dq to x_mid and dk to xn2, where they fit
// (Hq·D, or Hkv·D, at most C); dv and whatever does not fit go to the dblock_ region, after nothing: the
// MLP's phase is over. At long context this keeps one (N, Hkv·D) buffer of scratch where there were four.
// The values are those of separate buffers bit for bit (every op writes or zeroes its output first).
LlamaModel::BackwardScratch LlamaModel::backward_scratch(size_t N, size_t mlp, size_t C, size_t Q,
                                                         size_t KV) {
  constexpr size_t kAlign = 128;
  auto up = [](size_t n) { return (n + kAlign - 1) / kAlign * kAlign; };
  BackwardScratch s;
  s.dh = 0;
  s.dy_in_dxn = Q <= C, s.dq_in_mid = Q <= C, s.dk_in_xn2 = KV <= C;
  size_t end = 0;
  auto place = [&](size_t* at, size_t n) { *at = up(end), end = *at + n; };
  if (!s.dy_in_dxn) place(&s.dy, N * Q);
  if (!s.dq_in_mid) place(&s.dq, N * Q);
  if (!s.dk_in_xn2) place(&s.dk, N * KV);
  place(&s.dv, N * KV);
  s.numel = std::max(mlp, end);
  return s;
}

void LlamaModel::ensure_buffers(int B, int T, bool whole_logits, bool stored) {
  const size_t sets = opts_.checkpoint_activations ? 1 : size_t(cfg_.n_layers);
  if (acts_.size() < sets) acts_.resize(sets);
  const kernels::AttentionSizes as = layer_attention_sizes(*ops_, cfg_, B, T, documents_);
  bool synced = false;
  // Grows a buffer (never shrinks, so repeated steps do not reallocate); contents unspecified.
  auto fit = [&](Buf* b, size_t n, DType dtype) {
    if (n == 0 && !b->t.data) {  // not needed in this mode (and never allocated)
      b->t = Tensor{nullptr, dtype, 0};
      return;
    }
    if (b->t.numel >= n && b->t.dtype == dtype && b->t.data) {
      b->t.numel = n;
      return;
    }
    if (!synced) ops_->stream().synchronize(), synced = true;  // earlier ops may still use the old one
    b->mem = DeviceBuffer();
    try {
      b->mem = DeviceBuffer(*dev_, std::max<size_t>(1, n * dtype_bytes(dtype)), "model activations");
    } catch (const OutOfMemory& e) {
      throw OutOfMemory(detail::cat(
          "the activations of ", cfg_.name, " for a micro-batch of ", B, " x ", T, " tokens (",
          format_bytes(activation_bytes(cfg_, B, T, opts_.checkpoint_activations, *ops_)),
          ") do not fit the device beside the model state: ", e.what(),
          ". Lower train_micro_batch_size_per_gpu or --seq-len, or tell the engine the sequence length it "
          "must plan for (EngineOptions.seq_len)"));
    }
    b->t = Tensor{b->mem.data(), dtype, n};
  };
  const size_t N = size_t(B) * size_t(T);
  each_buffer(cfg_, B, T, opts_.checkpoint_activations, stored, act_, as,
              whole_logits ? N : loss_rows(cfg_, N), this, fit);
  if (rope_T_ != T) {
    ops_->rope_cache(rope_cos_.t, rope_sin_.t, T, int(cfg_.head_dim()), rope_inv_freq(cfg_, T));
    if (const float a = rope_attention_factor(cfg_);
        a != 1.0f) {  // longrope: as transformers, after cos / sin
      ops_->scale(rope_cos_.t, a);
      ops_->scale(rope_sin_.t, a);
    }
    rope_T_ = T;
  }
}

size_t LlamaModel::activation_bytes() const {
  if (acts_.empty()) return 0;  // no forward yet: nothing allocated
  size_t n = 0;
  // Every set of block activations allocated so far (one, or one per layer), whatever the shape.
  const bool one_set = acts_.size() < size_t(cfg_.n_layers);
  each_buffer(cfg_, 1, 1, one_set, false, act_, {}, 1, this,
              [&](const Buf* b, size_t, DType) { n += b->mem.size(); });
  return n;
}

size_t LlamaModel::activation_bytes(const ModelConfig& cfg, int B, int T, bool checkpoint_activations,
                                    const kernels::Ops& ops, bool checkpoints_stored, bool documents) {
  const kernels::AttentionSizes as = layer_attention_sizes(ops, cfg, B, T, documents);
  size_t n = 0;
  each_buffer(cfg, B, T, checkpoint_activations, checkpoint_activations && checkpoints_stored,
              ops.caps().activation, as, loss_rows(cfg, size_t(B) * size_t(T)),
              static_cast<LlamaModel*>(nullptr),
              [&](Buf*, size_t numel, DType dtype) { n += numel > 0 ? numel * dtype_bytes(dtype) : 0; });
  return n;
}

// Note [The loss in row chunks]: the LM head's logits are N x V — at long context and a large vocabulary
// the largest activation by far (32k tokens of a 152k vocabulary: 10 GB in bf16). Training never needs them
// whole: the loss and dlogits of a row depend on that row alone, dx's rows likewise, and the head's weight
// gradient is a sum over rows. So when N x V exceeds kLossChunkElements, forward computes the logits and the
// loss chunk by chunk (loss_rows() rows each, in row order) keeping only each row's loss, and backward
// computes each chunk's logits again, turns them into dlogits in place, and takes that chunk's dx rows and
// adds its share of dW, chunks in row order (deterministic whatever the threads). Each row's cross-entropy
// divides by the whole batch's count of targets (the ops' n_valid), so every row's loss, dlogits and dx are
// those of the whole-logits computation bit for bit; the loss is the double sum of the rows' fp32 losses in
// row order over that count (the whole computation sums the rows' double losses: within an fp32 rounding),
// and dW differs by the order of its fp32 sums. The cost: one more product of the head a step (its forward,
// in backward). Below the threshold nothing changes. A forward without targets (logits() read back) holds
// every row's logits.
namespace {
std::atomic<size_t> g_loss_chunk_elements{LlamaModel::kLossChunkElements};
}  // namespace

void LlamaModel::set_loss_chunk_elements(size_t elements) {
  g_loss_chunk_elements.store(elements > 0 ? elements : kLossChunkElements, std::memory_order_relaxed);
}

size_t LlamaModel::loss_rows(const ModelConfig& cfg, size_t N) {
  const size_t V = std::max<size_t>(1, size_t(cfg.vocab_size));
  const size_t budget = g_loss_chunk_elements.load(std::memory_order_relaxed);
  if (N * V <= budget) return N;
  return std::max<size_t>(1, budget / V);
}

// Note [The MLP in tiles]: with checkpointing, one block's MLP intermediates (gate, up and act(gate) up:
// 3 x N x ffn_dim, and the backward's d(h)) are the largest activations at long context. Nothing after the
// MLP needs them whole: its rows are independent, and its weight gradients are sums over rows. So when
// N x ffn_dim exceeds the threshold the MLP runs over row tiles of that size: forward computes each tile's
// gate, up, h and down projection into the block's output rows; the recompute in backward stops before
// the MLP, and backward computes each tile's forward again and takes it back at once (down, the
// activation, gate and up), adding its share of the weight gradients, tiles in row order (deterministic
// whatever the threads). Each row's values are the untiled computation's; the weight gradients differ by
// the order of their fp32 sums. LoRA's products follow their rows (lora_row0_: a site's s · A x for the
// tile's rows); with LoRA dropout, whose masks are drawn over the whole tensor, the MLP is not tiled.
// Without checkpointing every block keeps its activations for backward, so nothing is tiled.
namespace {
std::atomic<size_t> g_mlp_tile_elements{LlamaModel::kMlpTileElements};
}  // namespace

void LlamaModel::set_mlp_tile_elements(size_t elements) {
  g_mlp_tile_elements.store(elements > 0 ? elements : kMlpTileElements, std::memory_order_relaxed);
}

size_t LlamaModel::mlp_rows(const ModelConfig& cfg, size_t N, bool checkpointed) {
  const size_t F = std::max<size_t>(1, size_t(cfg.ffn_dim));
  const size_t budget = g_mlp_tile_elements.load(std::memory_order_relaxed);
  if (!checkpointed || N * F <= budget || (cfg.lora.active() && cfg.lora.dropout > 0)) return N;
  return std::max<size_t>(1, budget / F);
}

size_t LlamaModel::checkpoint_bytes(const ModelConfig& cfg, int B, int T, const kernels::Ops& ops) {
  return size_t(B) * size_t(T) * size_t(cfg.d_model) * dtype_bytes(ops.caps().activation);
}

}  // namespace strata::model
