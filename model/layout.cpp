#include "model/layout.h"

#include "core/error.h"

namespace strata::model {
namespace {

size_t round_up(size_t n, size_t m) {
  return (n + m - 1) / m * m;
}

TensorSpec spec(std::string name, std::string hf_name, std::vector<int64_t> shape, size_t offset) {
  TensorSpec t;
  t.name = std::move(name);
  t.hf_name = std::move(hf_name);
  t.shape = std::move(shape);
  t.numel = 1;
  for (int64_t d : t.shape) t.numel *= size_t(d);
  t.offset = offset;
  return t;
}

// Adds tensors in enum order. A tensor is stored under its own name, or, between begin_fused() and
// end_fused(), as a part of one stored tensor stacking the parts' rows (laid out end to end).
class ChunkBuilder {
 public:
  ChunkBuilder(ChunkLayout& c, size_t align) : c_(c), align_(align) {}
  void add(int index, std::string name, std::string hf_name, std::vector<int64_t> shape) {
    const size_t at = fused_ ? end_ : round_up(end_, align_);
    TensorSpec t = spec(std::move(name), std::move(hf_name), std::move(shape), at);
    end_ = t.offset + t.numel;
    c_.numel += t.numel;
    if (c_.slots.size() <= size_t(index)) c_.slots.resize(size_t(index) + 1, -1);
    c_.slots[size_t(index)] = int(c_.tensors.size());
    if (fused_) {
      fused_rows_ += t.shape[0];
      cols_ = t.shape[1];
    } else {
      c_.stored.push_back(t);
    }
    c_.tensors.push_back(std::move(t));
  }
  void begin_fused(std::string hf_name) {
    fused_ = true;
    fused_name_ = std::move(hf_name);
    fused_rows_ = 0;
    fused_at_ = round_up(end_, align_);
    end_ = fused_at_;
  }
  void end_fused(std::string name) {
    fused_ = false;
    c_.stored.push_back(spec(std::move(name), fused_name_, {fused_rows_, cols_}, fused_at_));
  }
  size_t end() const { return end_; }

 private:
  ChunkLayout& c_;
  size_t align_;
  size_t end_ = 0;
  bool fused_ = false;
  std::string fused_name_;
  int64_t fused_rows_ = 0, cols_ = 0;
  size_t fused_at_ = 0;
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

const TensorSpec& ChunkLayout::at(int index) const {
  STRATA_CHECK(has(index), "chunk ", id, " (", name, ") has no tensor of index ", index);
  return tensors[size_t(slots[size_t(index)])];
}

ModelLayout::ModelLayout(const ModelConfig& cfg, LayoutOptions opts) : cfg_(cfg), opts_(opts) {
  cfg_.validate("model layout");
  STRATA_CHECK(opts.tensor_align >= 1 && opts.chunk_multiple >= 1, "alignment must be at least 1 element");
  const int64_t V = cfg.vocab_size, C = cfg.d_model, F = cfg.ffn_dim;
  const int64_t Q = cfg.q_dim(), KV = cfg.kv_dim(), D = cfg.head_dim();
  const Family& fam = cfg.traits();

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
    b.add(kTokEmbeddings, "tok_embeddings", "model.embed_tokens.weight", {V, C});
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
    const std::string a = p + "self_attn.";
    b.add(kAttnNorm, "attn_norm", p + "input_layernorm.weight", {C});
    if (fam.fused_projections) b.begin_fused(a + "qkv_proj.weight");
    b.add(kWq, "wq", a + "q_proj.weight", {Q, C});
    b.add(kWk, "wk", a + "k_proj.weight", {KV, C});
    b.add(kWv, "wv", a + "v_proj.weight", {KV, C});
    if (fam.fused_projections) b.end_fused("wqkv");
    b.add(kWo, "wo", a + "o_proj.weight", {C, Q});
    b.add(kFfnNorm, "ffn_norm", p + "post_attention_layernorm.weight", {C});
    if (fam.fused_projections) b.begin_fused(p + "mlp.gate_up_proj.weight");
    b.add(kWGate, "w_gate", p + "mlp.gate_proj.weight", {F, C});
    b.add(kWUp, "w_up", p + "mlp.up_proj.weight", {F, C});
    if (fam.fused_projections) b.end_fused("w_gate_up");
    b.add(kWDown, "w_down", p + "mlp.down_proj.weight", {C, F});
    if (cfg.qkv_bias()) {
      b.add(kBq, "bq", a + "q_proj.bias", {Q});
      b.add(kBk, "bk", a + "k_proj.bias", {KV});
      b.add(kBv, "bv", a + "v_proj.bias", {KV});
    }
    if (cfg.o_bias()) b.add(kBo, "bo", a + "o_proj.bias", {C});
    if (fam.qk_norm) {
      b.add(kQNorm, "q_norm", a + "q_norm.weight", {D});
      b.add(kKNorm, "k_norm", a + "k_norm.weight", {D});
    }
    c.slots.resize(kNumBlockTensors, -1);
    finish(c, b);
  }
  {
    ChunkLayout c;
    c.kind = ChunkKind::head;
    c.name = "head";
    ChunkBuilder b(c, opts_.tensor_align);
    b.add(kFinalNorm, "final_norm", "model.norm.weight", {C});
    const bool own_lm_head = cfg.lora.active() && cfg.lora.save_lm_head && !cfg.tie_embeddings;
    if (!cfg.tie_embeddings && !own_lm_head) {
      b.add(kLmHead, "lm_head", "lm_head.weight", {V, C});
      lm_head_chunk_ = int(chunks_.size());
    }
    finish(c, b);
  }
  if (cfg.lora.active()) {
    const LoraSpec& lora = cfg.lora;
    adapter_chunks_.assign(size_t(cfg.n_layers), -1);
    for (int64_t l = 0; l < cfg.n_layers; ++l) {
      if (!lora.any_site(int(l))) continue;
      ChunkLayout c;
      c.kind = ChunkKind::adapter;
      c.layer = int(l);
      c.name = detail::cat("adapter.", l);
      ChunkBuilder b(c, opts_.tensor_align);
      for (int site : lora_sites_of(cfg)) {
        if (!lora.adapts(int(l), site)) continue;
        const std::string path = lora_module_path(int(l), site), m = lora_site_module(site);
        b.add(lora_a_index(site), "lora_A." + m, path + ".lora_A.weight", {lora.r, lora_site_in(cfg, site)});
        b.add(lora_b_index(site), "lora_B." + m, path + ".lora_B.weight", {lora_site_out(cfg, site), lora.r});
      }
      c.slots.resize(kNumAdapterTensors, -1);
      adapter_chunks_[size_t(l)] = int(chunks_.size());
      finish(c, b);
    }
    if (lora.save_lm_head && !cfg.tie_embeddings) {
      ChunkLayout c;
      c.kind = ChunkKind::lm_head;
      c.name = "lm_head";
      ChunkBuilder b(c, opts_.tensor_align);
      b.add(kLmHead, "lm_head", "lm_head.weight", {V, C});
      lm_head_chunk_ = int(chunks_.size());
      finish(c, b);
    }
  }
  const size_t want = size_t(cfg.num_parameters() + lora_parameters(cfg));
  STRATA_CHECK(total_numel_ == want, "layout holds ", total_numel_, " parameters, the config counts ", want);
}

std::vector<int> ModelLayout::frozen_chunks() const {
  std::vector<int> out;
  if (!cfg_.lora.active()) return out;
  for (const ChunkLayout& c : chunks_) {
    const bool trains = c.kind == ChunkKind::adapter || c.kind == ChunkKind::lm_head ||
                        (c.kind == ChunkKind::embedding && cfg_.lora.save_embed);
    if (!trains) out.push_back(c.id);
  }
  return out;
}

const ChunkLayout& ModelLayout::chunk(int id) const {
  STRATA_CHECK(id >= 0 && id < num_chunks(), "chunk id ", id, " is outside [0, ", num_chunks(), ")");
  return chunks_[size_t(id)];
}

const TensorSpec* ModelLayout::find_hf(std::string_view hf_name, int* chunk_id) const {
  for (const ChunkLayout& c : chunks_) {
    for (const TensorSpec& t : c.stored) {
      if (t.hf_name == hf_name) {
        if (chunk_id) *chunk_id = c.id;
        return &t;
      }
    }
  }
  return nullptr;
}

}  // namespace strata::model
