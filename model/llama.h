// strata/model/llama.h: the Llama-style decoder — forward and backward over chunks, on the compute
// interface (kernels/ops.h): its activations and scratch are device allocations, its ops are enqueued on
// the interface's stream, and the loss is the one value that comes back to the host per forward.
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
//
// Where it computes: ModelOptions.device and .ops (the engine passes its own: Engine::device(),
// Engine::ops()), whose device memory is counted against the device cap; without them the model opens a
// host-backend device of its own and the CPU ops (the reference, for tests and tools).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/device.h"
#include "kernels/ops.h"
#include "model/chunk.h"
#include "model/config.h"
#include "model/profile.h"
#include "model/trainable.h"

namespace strata::model {

// The decoder every ModelConfig describes today: a TrainableModel (model/trainable.h), the engine's seam,
// made and planned for through its Architecture, "llama-decoder" (model/architecture.h).
class LlamaModel final : public TrainableModel {
 public:
  explicit LlamaModel(const ModelConfig& cfg, ModelOptions opts = {});
  ~LlamaModel() override;
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  const ModelConfig& config() const override { return cfg_; }
  // Takes effect at the next forward (backward always follows the mode its forward ran in).
  void set_checkpointing(bool on) { opts_.checkpoint_activations = on; }
  bool checkpointing() const { return opts_.checkpoint_activations; }
  // Per-op and per-chunk timings go to `p` (nullptr: off).
  void set_profile(Profile* p) { profile_ = p; }

  // Runs the model over inputs (B, T) with T <= max_seq_len. With targets (B, T) — a target < 0 is
  // ignored — returns the mean cross-entropy and keeps what backward needs; with targets == nullptr
  // computes the logits only and returns 0. With positions (B, T), packed documents kept apart
  // (TrainableModel::forward). Throws ConfigError for a bad B or T or positions that are not documents'
  // (each 0 or one more than the one before it, all below T), strata::Error for a token outside the
  // vocabulary or a provider whose layout does not match this config.
  float forward(ChunkProvider& chunks, const int32_t* inputs, const int32_t* targets, int B, int T,
                const int32_t* positions = nullptr) override;
  // Adds the gradients of grad_scale × loss (the last forward's) into the chunks' gradient buffers,
  // handing each back as it finishes. Overwrites logits(). Requires a forward with targets.
  void backward(ChunkProvider& chunks, float grad_scale) override;
  void backward(ChunkProvider& chunks) { backward(chunks, 1.0f); }

  // (B, T, V) after forward, on the host (copied from the device).
  std::vector<float> logits() const override;
  // Note [Dropout keys] (model/trainable.h): the next forward with targets drops A's inputs out with the
  // masks of `key` when lora_dropout > 0; a forward not armed, or without targets, does not.
  void arm_dropout(std::uint64_t key) override { armed_key_ = key; }
  // Bytes of activations and scratch currently allocated (grows to the largest B × T seen).
  size_t activation_bytes() const;
  // Device bytes of activations and scratch a forward and backward over (B, T) allocate with `ops`
  // (what activation_bytes() reaches): the engine reserves them in its device plan. `checkpoints_stored`:
  // the block inputs are kept by the provider's CheckpointStore (Note [Checkpoints off the device] in
  // model/chunk.h), not counted here. `documents`: forwards with positions (packed documents kept apart),
  // whose attention may take another path with other buffers.
  static size_t activation_bytes(const ModelConfig& cfg, int B, int T, bool checkpoint_activations,
                                 const kernels::Ops& ops, bool checkpoints_stored = false,
                                 bool documents = false);
  // The block inputs a checkpointing forward over (B, T) keeps: n_layers of checkpoint_bytes each.
  static size_t checkpoint_bytes(const ModelConfig& cfg, int B, int T, const kernels::Ops& ops);
  // The largest shapes its ops run for a micro-batch of B x T tokens, for the compute interface's
  // scratch (kernels::Ops::scratch_bytes; reduce_numel is the caller's to set).
  static kernels::OpShapes op_shapes(const ModelConfig& cfg, int B, int T);
  // The rows of logits a training forward and backward hold at once for N rows (Note [The loss in row
  // chunks] in model/llama.cpp): N while N x vocab_size is at most kLossChunkElements, else that many
  // elements' worth.
  static constexpr size_t kLossChunkElements = size_t(1) << 24;
  static size_t loss_rows(const ModelConfig& cfg, size_t N);
  // The threshold loss_rows() uses: kLossChunkElements, or what a test sets for the whole process (0
  // restores the default). Set it before any model plans or runs.
  static void set_loss_chunk_elements(size_t elements);
  // The rows of the MLP's intermediates a checkpointed forward and backward hold at once (Note [The MLP
  // in tiles] in model/llama.cpp): N while N x ffn_dim is at most the threshold (kMlpTileElements, or what
  // a test sets), else that many elements' worth; N without checkpointing, and with LoRA dropout.
  static constexpr size_t kMlpTileElements = size_t(1) << 23;
  static size_t mlp_rows(const ModelConfig& cfg, size_t N, bool checkpointed);
  static void set_mlp_tile_elements(size_t elements);
  // Multiply-adds × 2 of one forward / backward over (B, T), as the profile counts them.
  double forward_flops(int B, int T) const;
  double backward_flops(int B, int T) const;

 private:
  // A device buffer and the tensor view of its first elements.
  struct Buf {
    DeviceBuffer mem;
    kernels::Tensor t;
  };
  struct BlockActs {
    Buf rstd1;  // (N) fp32
    Buf xn1;    // (N, C) attn_norm output
    Buf q;      // (N, Hq*D) after rotary
    Buf k;      // (N, Hkv*D) after rotary
    Buf v;      // (N, Hkv*D)
    Buf att;    // attention state saved for backward (CPU: (B, Hq, T, T) probabilities), fp32
    Buf y;      // (N, Hq*D) attention output, before o_proj
    Buf x_mid;  // (N, C) residual stream after attention
    Buf rstd2;  // (N) fp32
    Buf xn2;    // (N, C) ffn_norm output
    Buf gate;   // (N, F)
    Buf up;     // (N, F)
    Buf h;      // (N, F) act(gate) * up
    // Per-head q/k norm (Qwen3) only, else empty: the projections before the norm and its rstd.
    Buf q_raw, k_raw;  // (N, Hq*D), (N, Hkv*D)
    Buf rstdq, rstdk;  // (N*Hq), (N*Hkv) fp32
    // With LoRA adapters: each adapted site's s · A x, (N, r) at slot lora_slot(site) (model/lora.h).
    Buf lora_t;
  };
  // Calls fn(buffer, elements, dtype) for every buffer a forward + backward over (B, T) needs, in one
  // fixed order; `m` null: buffer null (sizes only, for the static activation_bytes()). M: LlamaModel,
  // or const LlamaModel to read what is allocated.
  // `logit_rows`: the rows of logits held (loss_rows(), or every row for a forward without targets).
  // `stored`: the block inputs are in a CheckpointStore; resid_ holds the head's input only.
  template <typename M, typename Fn>
  static void each_buffer(const ModelConfig& cfg, int B, int T, bool ckpt, bool stored, DType act,
                          kernels::AttentionSizes as, size_t logit_rows, M* m, Fn&& fn);

  // `whole_logits`: every row's logits (a forward without targets, whose logits() the caller reads).
  void ensure_buffers(int B, int T, bool whole_logits, bool stored);
  // `ad`: the block's adapter chunk (its LoRA tensors), nullptr when it has none; `ag` its gradients.
  void block_forward(const ChunkView& p, const ChunkView* ad, kernels::Tensor x_in, kernels::Tensor x_out,
                     BlockActs& a, Phase phase);
  void block_backward(const ChunkView& p, float* g, const ChunkView* ad, float* ag, kernels::Tensor x_in,
                      BlockActs& a);
  // Note [LoRA as PEFT computes it] (model/lora.h). lora_forward adds s · B_p (A x) to projection `proj`'s
  // output `out` (its input x); the site's s · A x is computed at its first projection and kept in lora_t.
  // lora_backward takes the projection's output gradient `dout` to dB_p and, at the site's last part, to
  // dA and to the input gradient `dx` (+=).
  void lora_forward(const ChunkView& ad, BlockActs& a, kernels::Tensor out, kernels::Tensor x, int proj,
                    int N, int OC, Phase phase);
  void lora_backward(const ChunkView& ad, float* ag, BlockActs& a, kernels::Tensor dx, kernels::Tensor dout,
                     kernels::Tensor x, int proj, int N, int OC);
  // A's input: x, or — in a forward armed with a key (Note [Dropout keys]) with lora_dropout > 0 — x through
  // the dropout mask of (that key, lora_layer_, site), written to lora_x_.
  kernels::Tensor lora_input(kernels::Tensor x, int site, int N, int IC);
  // The key of the mask of `site` in block lora_layer_, under the last forward's key.
  std::uint64_t lora_mask_key(int site) const;
  int lora_slot(int site) const;
  std::array<int, kNumLoraSites> lora_slots_{};  // site -> slot in lora_t, -1 for a site the family lacks
  // Where the block's backward keeps dh, dy, dq, dk and dv (Note [Backward buffers] in llama_buffers.cpp):
  // dy in dxn_, dq in the block set's x_mid and dk in its xn2 where the flags say they fit, else — and dv
  // always — in dblock_ at these element offsets (each rounded up to 128 elements: 512 bytes in fp32, 256
  // in bf16, the alignment the cuBLASLt and cuDNN paths want); numel: the region's size.
  struct BackwardScratch {
    size_t dh = 0, dy = 0, dq = 0, dk = 0, dv = 0, numel = 0;
    bool dy_in_dxn = false, dq_in_mid = false, dk_in_xn2 = false;
  };
  // mlp: the elements of the MLP's phase (dh: the tile's rows x ffn_dim).
  static BackwardScratch backward_scratch(size_t N, size_t mlp, size_t C, size_t Q, size_t KV);
  // The head's input (block L's output) and the final norm's output: their own buffers, or under
  // checkpointing buffers of the block set (Note [The head's buffers under checkpointing]).
  kernels::Tensor xf() const;
  // logits_[0, n) = x[r0, r0 + n) W^T: n rows of logits, from row r0 of the final norm's output.
  void head_forward_logits(kernels::Tensor w_head, size_t r0, size_t n, Phase phase);
  void check_layout(const ChunkProvider& chunks) const;
  // y = x W^T (+ b where the family has bias `bias_index`, -1 for none).
  void project(const ChunkView& p, const ChunkView* ad, BlockActs& a, kernels::Tensor out, kernels::Tensor x,
               int w_index, int bias_index, int N, int IC, int OC, const char* op, Phase phase);
  // The embedding scale of the family (Gemma: sqrt(d_model) rounded to the activation dtype), else 1.
  float embed_scale() const;
  // Chunk tensor `index` as the ops see it, and its fp32 gradient in `g`.
  kernels::Tensor weight(const ChunkView& p, int index) const;
  static kernels::Tensor grad(const ChunkView& p, float* g, int index);
  kernels::Tensor resid(int l) const;
  // The last forward's positions for the rope and attention ops, or empty without documents.
  kernels::Tensor positions() const { return documents_ ? positions_.t : kernels::Tensor{}; }
  template <typename Fn>
  void timed(const char* op, Phase phase, double flops, Fn&& fn, int64_t n = 0, int64_t ic = 0,
             int64_t oc = 0);

  ModelConfig cfg_;
  ModelOptions opts_;
  Profile* profile_ = nullptr;
  // The host device, stream and ops of a model constructed without them.
  std::unique_ptr<Device> own_device_;
  std::unique_ptr<Stream> own_stream_;
  std::unique_ptr<kernels::Ops> own_ops_;
  Device* dev_ = nullptr;
  kernels::Ops* ops_ = nullptr;
  DType act_ = DType::fp32;  // the ops' activation dtype

  // Shape of the last forward.
  int B_ = 0, T_ = 0;
  bool have_targets_ = false, ckpt_ = false;
  bool documents_ = false;  // the last forward had positions (positions_ holds them)
  double chunk_flops_ = 0;  // flops since the current chunk began (profiling)

  Buf inputs_, targets_, positions_;      // (N) i32
  PinnedBuffer tokens_host_;              // (3, N) i32: inputs, targets, positions on their way to the device
  std::unique_ptr<Event> tokens_copied_;  // the compute stream after their copies
  Buf rope_cos_, rope_sin_;               // (T, D/2) fp32
  int rope_T_ = 0;
  Buf resid_;  // (L + 1, N, C): resid_[l] is block l's input, [L] the head's; under checkpointing (L, N, C),
               // or nothing while store_ keeps the block inputs (the head's is in the block set)
  // The last checkpointing forward's CheckpointStore (null: none) and the device memory of each block
  // input it gave (Note [Checkpoints off the device] in model/chunk.h).
  CheckpointStore* store_ = nullptr;
  std::vector<void*> stored_;
  std::vector<BlockActs> acts_;  // L sets, or 1 with checkpointing
  Buf xf_, rstdf_;               // (N, C), (N) fp32: final norm output (xf()) and its rstd
  Buf logits_;                   // (loss_rows(N), V); backward turns them into dlogits in place
  Buf losses_, loss_;            // (N), (1) fp32: cross-entropy per row and mean
  int n_valid_ = 0;              // the last forward's targets that count (>= 0)
  // Backward scratch.
  Buf dresid_, dxn_;  // (N, C)
  // One region for the block's two backward phases, which never overlap (backward_scratch()): the MLP's
  // dh (N, F), then the attention's dy (N, Hq*D), dq (N, Hq*D), dk and dv (N, Hkv*D).
  Buf dblock_;
  Buf datt_;     // attention backward scratch, fp32
  Buf pad_row_;  // (C) fp32: the padding row's gradient, kept across the embedding's backward (pad_token_id)
  // LoRA scratch: B's product before it is added (N, widest projection output), A's gradient input
  // (N, r), and A's input through dropout (N, widest projection input; lora_dropout > 0 only), which in
  // backward, once dA has read it, also takes the input gradient dt A on its way through the mask.
  Buf lora_u_, lora_dt_, lora_x_;
  // The MLP in tiles (Note [The MLP in tiles]): the first row of the tile the LoRA products are for (their
  // rows of lora_t), 0 outside one.
  size_t lora_row0_ = 0;
  // The block's MLP forward over rows [r0, r0 + n): gate, up and h in the tile's buffers, x_out's rows of
  // the down projection unless `out` is empty.
  void mlp_tile_forward(const ChunkView& p, const ChunkView* ad, BlockActs& a, kernels::Tensor x_out,
                        size_t r0, size_t n, Phase phase);
  // s · A x of projection `proj`'s site into its lora_t rows (LoRA's first product alone).
  void lora_project_a(const ChunkView& ad, BlockActs& a, kernels::Tensor x, int proj, int N, Phase phase);
  kernels::Tensor lora_t_rows(BlockActs& a, int site, int N);
  int lora_layer_ = 0;  // the block whose adapters run (the dropout mask's key)
  // Note [Dropout keys]: the key arm_dropout() gave the next forward; the last forward's, and whether it
  // drops out (its backward draws the same masks).
  std::optional<std::uint64_t> armed_key_;
  std::uint64_t forward_key_ = 0;
  bool dropping_ = false;
};

}  // namespace strata::model
