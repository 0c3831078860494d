// strata/model/layout.h: where every parameter tensor lives inside its chunk (DESIGN.md §2).
//
// Example:
//   strata::model::ModelLayout layout(cfg, {.tensor_align = 16, .chunk_multiple = world * 16});
//   const auto& blk = layout.chunk(layout.block_chunk(3));
//   const auto& wq = blk.tensors[strata::model::kWq];     // hf_name "model.layers.3.self_attn.q_proj.weight"
//   float* q_weight = chunk_buffer + wq.offset;             // (q_dim, d_model) row-major
//
// One table serves the model (which reaches tensors by index), the engine (which moves whole chunks of
// padded_numel elements and shards them), and safetensors I/O (which maps hf_name <-> offset and shape).
//
// Chunks, in forward order:
//   0          embedding   tok_embeddings (V, C)
//   1 + l      block l     attn_norm (C), wq (Hq*D, C), wk (Hkv*D, C), wv (Hkv*D, C), wo (C, Hq*D),
//                          ffn_norm (C), w_gate (F, C), w_up (F, C), w_down (C, F), then as the family
//                          has them (Note [Model families] in config.h): bq (Hq*D), bk, bv (Hkv*D),
//                          bo (C), q_norm (D), k_norm (D)
//   L + 1      head        final_norm (C), lm_head (V, C) — lm_head absent when tie_embeddings, the head
//                          then reads tok_embeddings from chunk 0
// and with LoRA adapters (ModelConfig::lora), after those:
//   L + 2 ...  adapter l   for each block l with an adapted site, in block order: lora_A (r, in) and lora_B
//                          (out, r) of each adapted site (AdapterTensor order, model/lora.h)
//   last       lm_head     lm_head (V, C) alone, when modules_to_save trains it (the head chunk then holds
//                          final_norm only)
// Matrices are PyTorch nn.Linear weights, (out_features, in_features) row-major, as in Hugging Face files.
// A chunk's `tensors` are the model's; its `stored` are the tensors a checkpoint holds, which differ only
// where a family stores projections fused (Phi-3's qkv_proj = wq, wk, wv stacked, gate_up_proj = w_gate,
// w_up): those parts are laid out end to end with no gap, so one stored tensor covers them.
// Tensor offsets are multiples of tensor_align elements; the gaps and the tail padding are zero and their
// gradients stay zero.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"

namespace strata::model {

// adapter: block `layer`'s LoRA tensors; lm_head: the output matrix alone, when it trains beside adapters
// (model/lora.h, Note [LoRA as PEFT computes it]).
enum class ChunkKind { embedding, block, head, adapter, lm_head };

// Tensor indices inside each kind of chunk.
enum EmbeddingTensor : int { kTokEmbeddings = 0 };
enum BlockTensor : int {
  kAttnNorm = 0,
  kWq,
  kWk,
  kWv,
  kWo,
  kFfnNorm,
  kWGate,
  kWUp,
  kWDown,
  kBq,  // the family's optional tensors (ChunkLayout::has)
  kBk,
  kBv,
  kBo,
  kQNorm,
  kKNorm,
  kNumBlockTensors
};
enum HeadTensor : int { kFinalNorm = 0, kLmHead };

struct TensorSpec {
  std::string name;            // short name: "wq", "tok_embeddings", ...
  std::string hf_name;         // Hugging Face Llama name: "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // row-major
  size_t offset = 0;           // elements from the start of the chunk
  size_t numel = 0;
};

struct ChunkLayout {
  int id = 0;
  ChunkKind kind = ChunkKind::embedding;
  int layer = -1;                   // block index for ChunkKind::block, else -1
  std::string name;                 // "embedding", "block.3", "head"
  std::vector<TensorSpec> tensors;  // the model's, in the kind's enum order, absent ones left out
  std::vector<TensorSpec> stored;   // as a checkpoint holds them (names, shapes; what safetensors I/O uses)
  size_t numel = 0;                 // parameters, without padding
  size_t padded_numel = 0;          // buffer length in elements (multiple of chunk_multiple)
  size_t flat_offset = 0;           // where this chunk starts when all chunks are laid end to end

  // Throws strata::Error naming the chunk and its tensors when `name` is not one of them.
  const TensorSpec& tensor(std::string_view name) const;
  // The tensor of enum index `index` (BlockTensor, ...), and whether the family has it.
  bool has(int index) const {
    return index >= 0 && size_t(index) < slots.size() && slots[size_t(index)] >= 0;
  }
  const TensorSpec& at(int index) const;
  std::vector<int> slots;  // enum index -> position in tensors, or -1
};

struct LayoutOptions {
  size_t tensor_align = 16;    // elements; every tensor offset is a multiple (16 fp32 = 64 bytes)
  size_t chunk_multiple = 16;  // elements; padded_numel is a multiple (the engine passes world × alignment)
};

class ModelLayout {
 public:
  explicit ModelLayout(const ModelConfig& cfg, LayoutOptions opts = {});

  const ModelConfig& config() const { return cfg_; }
  const LayoutOptions& options() const { return opts_; }
  int num_chunks() const { return int(chunks_.size()); }
  const ChunkLayout& chunk(int id) const;
  const std::vector<ChunkLayout>& chunks() const { return chunks_; }

  int embedding_chunk() const { return 0; }
  int block_chunk(int layer) const { return 1 + layer; }
  int head_chunk() const { return int(cfg_.n_layers) + 1; }
  // Block `layer`'s adapter chunk, or -1 when the block has none.
  int adapter_chunk(int layer) const {
    return adapter_chunks_.empty() ? -1 : adapter_chunks_.at(size_t(layer));
  }
  // The chunk holding lm_head (kLmHead): the head chunk, a chunk of its own (lora.save_lm_head), or -1 when
  // the head reads tok_embeddings (tie_embeddings).
  int lm_head_chunk() const { return lm_head_chunk_; }
  // The chunks that do not train under LoRA adapters (ModelConfig::lora): every base chunk but the saved
  // modules' (embed_tokens: the embedding; lm_head: its own chunk). Empty without adapters.
  std::vector<int> frozen_chunks() const;
  // Whether chunk `id` holds the base's parameters (embedding, block, head, lm_head) rather than adapters.
  bool is_base(int id) const { return chunk(id).kind != ChunkKind::adapter; }

  size_t total_numel() const { return total_numel_; }                // parameters, no padding
  size_t total_padded_numel() const { return total_padded_numel_; }  // sum of padded_numel

  // The stored tensor (ChunkLayout::stored) with this Hugging Face name, or nullptr; `chunk_id` receives
  // its chunk.
  const TensorSpec* find_hf(std::string_view hf_name, int* chunk_id = nullptr) const;

 private:
  ModelConfig cfg_;
  LayoutOptions opts_;
  std::vector<ChunkLayout> chunks_;
  std::vector<int> adapter_chunks_;  // per block, with adapters
  int lm_head_chunk_ = -1;
  size_t total_numel_ = 0, total_padded_numel_ = 0;
};

}  // namespace strata::model
