#include "model/layout.h"

#include "core/error.h"

namespace strata::model {
namespace {

size_t round_up(size_t n, size_t m) {
  return (n + m - 1) / m * m;
}

class ChunkBuilder {
 public:
  ChunkBuilder(ChunkLayout& c, size_t align) : c_(c), align_(align) {}
  void add(std::string name, std::string hf_name, std::vector<int64_t> shape) {
    TensorSpec t;
    t.name = std::move(name);
    t.hf_name = std::move(hf_name);
    t.shape = std::move(shape);
    t.numel = 1;
    for (int64_t d : t.shape) t.numel *= size_t(d);
    t.offset = round_up(end_, align_);
    end_ = t.offset + t.numel;
    c_.numel += t.numel;
    c_.tensors.push_back(std::move(t));
  }
  size_t end() const { return end_; }

 private:
  ChunkLayout& c_;
  size_t align_;
  size_t end_ = 0;
};

}  // namespace

const TensorSpec& ChunkLayout::tensor(std::string_view want) const {
  std::string names;
  for (const TensorSpec& t : tensors) {
    if (t.name == want) return t;
    names += (names.empty() ? "" : ", ") + t.name;
  }
  throw Error(detail::cat("chunk ", id, " (", name, ") has no tensor '", want, "'; it holds ", names));
}

ModelLayout::ModelLayout(const ModelConfig& cfg, LayoutOptions opts) : cfg_(cfg), opts_(opts) {
  cfg_.validate("model layout");
  STRATA_CHECK(opts.tensor_align >= 1 && opts.chunk_multiple >= 1, "alignment must be at least 1 element");
  const int64_t V = cfg.vocab_size, C = cfg.d_model, F = cfg.ffn_dim;
  const int64_t Q = cfg.q_dim(), KV = cfg.kv_dim();

  auto finish = [&](ChunkLayout& c, const ChunkBuilder& b) {
    c.id = int(chunks_.size());
    c.padded_numel = round_up(std::max<size_t>(b.end(), 1), opts_.chunk_multiple);
    c.flat_offset = total_padded_numel_;
    total_numel_ += c.numel;
    total_padded_numel_ += c.padded_numel;
    chunks_.push_back(std::move(c));
  };

  {
    ChunkLayout c;
    c.kind = ChunkKind::embedding;
    c.name = "embedding";
    ChunkBuilder b(c, opts_.tensor_align);
    b.add("tok_embeddings", "model.embed_tokens.weight", {V, C});
    finish(c, b);
  }
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    ChunkLayout c;
    c.kind = ChunkKind::block;
    c.layer = int(l);
    c.name = detail::cat("block.", l);
    const std::string p = detail::cat("model.layers.", l, ".");
    ChunkBuilder b(c, opts_.tensor_align);
    // The order matches BlockTensor.
    b.add("attn_norm", p + "input_layernorm.weight", {C});
    b.add("wq", p + "self_attn.q_proj.weight", {Q, C});
    b.add("wk", p + "self_attn.k_proj.weight", {KV, C});
    b.add("wv", p + "self_attn.v_proj.weight", {KV, C});
    b.add("wo", p + "self_attn.o_proj.weight", {C, Q});
    b.add("ffn_norm", p + "post_attention_layernorm.weight", {C});
    b.add("w_gate", p + "mlp.gate_proj.weight", {F, C});
    b.add("w_up", p + "mlp.up_proj.weight", {F, C});
    b.add("w_down", p + "mlp.down_proj.weight", {C, F});
    finish(c, b);
  }
  {
    ChunkLayout c;
    c.kind = ChunkKind::head;
    c.name = "head";
    ChunkBuilder b(c, opts_.tensor_align);
    b.add("final_norm", "model.norm.weight", {C});
    if (!cfg.tie_embeddings) b.add("lm_head", "lm_head.weight", {V, C});
    finish(c, b);
  }
  STRATA_CHECK(total_numel_ == size_t(cfg.num_parameters()), "layout holds ", total_numel_,
               " parameters, the config counts ", cfg.num_parameters());
}

const ChunkLayout& ModelLayout::chunk(int id) const {
  STRATA_CHECK(id >= 0 && id < num_chunks(), "chunk id ", id, " is outside [0, ", num_chunks(), ")");
  return chunks_[size_t(id)];
}

const TensorSpec* ModelLayout::find_hf(std::string_view hf_name, int* chunk_id) const {
  for (const ChunkLayout& c : chunks_) {
    for (const TensorSpec& t : c.tensors) {
      if (t.hf_name == hf_name) {
        if (chunk_id) *chunk_id = c.id;
        return &t;
      }
    }
  }
  return nullptr;
}

}  // namespace strata::model
