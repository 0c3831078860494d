// strata/model/llama.h: the Llama-style decoder — forward and backward over chunks, on the CPU ops.
//
// Example (one training step on the in-memory provider):
//   strata::model::ModelConfig cfg = strata::model::ModelConfig::preset("tiny");
//   strata::model::InMemoryChunks chunks{strata::model::ModelLayout(cfg)};
//   chunks.init(/*seed=*/1);
//   strata::model::LlamaModel model(cfg, {.checkpoint_activations = true});
//   chunks.zero_grads();
//   float loss = model.forward(chunks, inputs, targets, B, T);   // inputs, targets: (B, T) int32
//   model.backward(chunks);                                      // gradients of loss into the chunks
//   // ... optimizer step over chunks.all_params() / all_grads() ...
//
// The model owns activations and scratch, never parameters: it reaches them only through ChunkProvider
// (model/chunk.h), in this order (L = n_layers, E = embedding chunk 0, H = head chunk L + 1):
//   forward:   E, block 0, ..., block L-1, H (+ E again while H runs, when embeddings are tied)
//   backward:  H (+ E), block L-1, ..., block 0, then E's gradients only (the embedding's backward needs
//              the tokens and the gradient, not the table, so E's parameters are not acquired)
// and hands each chunk's gradients back as soon as that chunk's backward is done.
//
// Note [Activation checkpointing]: with checkpoint_activations the forward keeps only each block's input
// (the residual stream, (B, T, C)) and one set of block activations that every block overwrites. The
// backward re-acquires the block, recomputes its forward from the saved input into that set, then runs
// its backward. The recomputation performs exactly the same op calls on exactly the same inputs, and the
// ops are deterministic, so the gradients are bit-identical to a run without checkpointing (a test checks
// this). Memory per block drops from about (6C + 2(Hq+2Hkv)D + 3F) N + Hq B T^2 floats to C N.
#pragma once

#include <cstdint>
#include <vector>

#include "model/chunk.h"
#include "model/config.h"
#include "model/profile.h"

namespace strata::model {

struct ModelOptions {
  bool checkpoint_activations = false;  // keep each block's input only, recompute in backward
};

class LlamaModel {
 public:
  explicit LlamaModel(const ModelConfig& cfg, ModelOptions opts = {});

  const ModelConfig& config() const { return cfg_; }
  // Takes effect at the next forward (backward always follows the mode its forward ran in).
  void set_checkpointing(bool on) { opts_.checkpoint_activations = on; }
  bool checkpointing() const { return opts_.checkpoint_activations; }
  // Per-op and per-chunk timings go to `p` (nullptr: off).
  void set_profile(Profile* p) { profile_ = p; }

  // Runs the model over inputs (B, T) with T <= max_seq_len. With targets (B, T) — a target < 0 is
  // ignored — returns the mean cross-entropy and keeps what backward needs; with targets == nullptr
  // computes the logits only and returns 0. Throws ConfigError for a bad B or T, strata::Error for a
  // token outside the vocabulary or a provider whose layout does not match this config.
  float forward(ChunkProvider& chunks, const int32_t* inputs, const int32_t* targets, int B, int T);
  // Adds the gradients of grad_scale × loss (the last forward's) into the chunks' gradient buffers,
  // handing each back as it finishes. Overwrites logits(). Requires a forward with targets.
  void backward(ChunkProvider& chunks, float grad_scale = 1.0f);

  const float* logits() const { return logits_.data(); }  // (B, T, V) after forward
  // Bytes of activations and scratch currently allocated (grows to the largest B × T seen).
  size_t activation_bytes() const;
  // Multiply-adds × 2 of one forward / backward over (B, T), as the profile counts them.
  double forward_flops(int B, int T) const;
  double backward_flops(int B, int T) const;

 private:
  struct BlockActs {
    std::vector<float> rstd1;  // (N)
    std::vector<float> xn1;    // (N, C) attn_norm output
    std::vector<float> q;      // (N, Hq*D) after rotary
    std::vector<float> k;      // (N, Hkv*D) after rotary
    std::vector<float> v;      // (N, Hkv*D)
    std::vector<float> att;    // (B, Hq, T, T) softmax probabilities
    std::vector<float> y;      // (N, Hq*D) attention output, before o_proj
    std::vector<float> x_mid;  // (N, C) residual stream after attention
    std::vector<float> rstd2;  // (N)
    std::vector<float> xn2;    // (N, C) ffn_norm output
    std::vector<float> gate;   // (N, F)
    std::vector<float> up;     // (N, F)
    std::vector<float> h;      // (N, F) silu(gate) * up
  };

  void ensure_buffers(int B, int T);
  void block_forward(const ChunkView& p, const float* x_in, float* x_out, BlockActs& a, Phase phase);
  void block_backward(const ChunkView& p, float* g, const float* x_in, BlockActs& a);
  void head_forward_logits(const float* w_head, const float* x);
  void check_layout(const ChunkProvider& chunks) const;
  template <typename Fn>
  void timed(const char* op, Phase phase, double flops, Fn&& fn, int64_t n = 0, int64_t ic = 0,
             int64_t oc = 0);

  ModelConfig cfg_;
  ModelOptions opts_;
  Profile* profile_ = nullptr;

  // Shape of the last forward.
  int B_ = 0, T_ = 0;
  bool have_targets_ = false, ckpt_ = false;
  int cap_N_ = 0, cap_T_ = 0, cap_B_ = 0;  // what the buffers are sized for
  double chunk_flops_ = 0;                 // flops since the current chunk began (profiling)

  std::vector<int32_t> inputs_, targets_;   // (N)
  std::vector<float> rope_cos_, rope_sin_;  // (T, D/2)
  int rope_T_ = 0;
  std::vector<float> resid_;       // (L + 1, N, C): resid_[l] is block l's input, [L] the head's
  std::vector<BlockActs> acts_;    // L sets, or 1 with checkpointing
  std::vector<float> xf_, rstdf_;  // (N, C), (N): final norm output and its rstd
  std::vector<float> logits_;      // (N, V); backward turns it into dlogits in place
  // Backward scratch.
  std::vector<float> dresid_, dxn_;      // (N, C)
  std::vector<float> dh_, dgate_, dup_;  // (N, F)
  std::vector<float> dy_, dq_;           // (N, Hq*D)
  std::vector<float> dk_, dv_;           // (N, Hkv*D)
  std::vector<float> datt_;              // (B, Hq, T, T)
};

}  // namespace strata::model
