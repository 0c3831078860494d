// strata/model/lora.h: LoRA adapters as PEFT computes them, described as part of the model's shape.
//
// Example (what the session builder does with a config's strata.lora block or an adapter directory):
//   model::LoraTargets want{.modules = {"q_proj", "v_proj"}};          // PEFT's target_modules
//   mcfg.lora = model::resolve_lora(mcfg, want, {.r = 16, .alpha = 32}, "strata.lora");
//   model::ModelLayout layout(mcfg);       // the base's chunks, then one adapter chunk per adapted block
//   layout.adapter_chunk(3);               // block 3's lora_A / lora_B tensors, or -1
//
// Note [LoRA as PEFT computes it]: an adapted linear layer computes y = W x (+ b) + s · B (A x), with
// A (r, in) and B (out, r), s = alpha / r (alpha / sqrt(r) with rslora), A's input x passed through dropout
// when lora_dropout > 0. A PEFT "module" is what the family's checkpoint calls a linear layer: q_proj,
// k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj — or, for a family that stores projections fused
// (Phi-3), qkv_proj and gate_up_proj, each one A and one B whose rows stack the parts (q, k, v; gate, up)
// as the fused weight does. Those are the LoRA "sites" of a block. Strata computes B (s · (A x)): the
// same product as PEFT's (B (A x)) · s up to rounding of the last bit in fp32.
//
// The base is frozen (Note [Chunk protocol] in chunk.h): its chunks keep their working copy only. The
// adapters of block l are one trainable chunk, after the base's chunks in the layout, acquired beside block
// l's. modules_to_save trains a base module in full as PEFT's copy of it does: "embed_tokens" is the
// embedding chunk (alone in it), "lm_head" moves the head's matrix into a chunk of its own (the final norm
// stays frozen in the head chunk). Neither is allowed with tied embeddings (PEFT's copy would then train the
// lookup's copy only, which Strata does not compute).
//
// Matching target_modules (PEFT's check_target_module_exists): a list matches a module whose full name
// (model.layers.3.self_attn.q_proj) equals an entry or ends with "." + entry; a string is a regular
// expression that must match the full name; "all-linear" is every linear layer of the blocks (lm_head
// excluded, as PEFT excludes the output layer).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace strata::model {

struct ModelConfig;

// The linear layers a block can adapt. The first seven exist in families with separate projections, the
// fused two (and o, down) in families that store them fused.
enum LoraSite : int {
  kSiteQ = 0,
  kSiteK,
  kSiteV,
  kSiteO,
  kSiteGate,
  kSiteUp,
  kSiteDown,
  kSiteQkv,
  kSiteGateUp
};
constexpr int kNumLoraSites = 9;

// An adapter chunk's tensors: lora_A of site s at index 2 s, lora_B at 2 s + 1.
constexpr int lora_a_index(int site) {
  return 2 * site;
}
constexpr int lora_b_index(int site) {
  return 2 * site + 1;
}
constexpr int kNumAdapterTensors = 2 * kNumLoraSites;

// Adapters of a model: none when r == 0.
struct LoraSpec {
  std::int64_t r = 0;
  double alpha = 0;
  bool rslora = false;
  double dropout = 0;                // on A's input, [0, 1)
  std::vector<std::uint32_t> sites;  // per block: bit s set when site s is adapted (n_layers entries)
  bool save_embed = false;           // modules_to_save "embed_tokens": the embedding trains in full
  bool save_lm_head = false;         // modules_to_save "lm_head": the output matrix trains in full
  // QLoRA's base (strata.lora.base_dtype "nf4"): the frozen blocks' projection weights are kept in NF4
  // (model/nf4_chunk.h), with the absmax double-quantised when double_quant.
  bool nf4_base = false;
  bool double_quant = true;

  bool active() const { return r > 0; }
  bool adapts(int layer, int site) const {
    return active() && (sites.at(std::size_t(layer)) >> site & 1u) != 0;
  }
  bool any_site(int layer) const { return active() && sites.at(std::size_t(layer)) != 0; }
  // PEFT's scaling, as the fp32 factor the products use: alpha / r, or alpha / sqrt(r) with rslora.
  float scale() const;
};

// The PEFT module name of a site ("q_proj"), its parent in the block ("self_attn" or "mlp"), and the full
// name in block `layer` ("model.layers.3.self_attn.q_proj").
const char* lora_site_module(int site);
const char* lora_site_parent(int site);
std::string lora_module_path(int layer, int site);
// The sites a family has: the seven separate projections, or qkv, o, gate_up, down when fused.
std::vector<int> lora_sites_of(const ModelConfig& cfg);
// A site's input and output widths in `cfg`.
std::int64_t lora_site_in(const ModelConfig& cfg, int site);
std::int64_t lora_site_out(const ModelConfig& cfg, int site);
// The projection (BlockTensor) a site feeds, and where its rows start in the site's B: the site of
// projection `proj` in `cfg`'s family, and the row offset of that projection inside it.
int lora_site_of_projection(const ModelConfig& cfg, int proj, std::int64_t* row_offset);
// Parameters of the adapters and the saved modules' extra copies: r (in + out) per adapted site. (The saved
// modules are base parameters that train; they add none.)
std::int64_t lora_parameters(const ModelConfig& cfg);

// What the user asked for, before it is checked against the model.
struct LoraTargets {
  std::vector<std::string> modules = {};  // names or paths, or one "all-linear"
  bool regex = false;                     // modules[0] is PEFT's full-match regular expression
  std::vector<std::string> modules_to_save = {};
};
struct LoraShape {
  std::int64_t r = 8;
  double alpha = 8;
  bool rslora = false;
  double dropout = 0;
  bool nf4_base = false;  // the base's projections in NF4 (LoraSpec.nf4_base)
  bool double_quant = true;
};
// The adapters of `cfg` for these targets: ConfigError prefixed by `where` for r < 1, a dropout outside
// [0, 1), a target naming no module of this family (naming the family's modules), a target list matching
// nothing, a module_to_save Strata does not train in full (the ones it does named), or a saved module
// with tied embeddings.
LoraSpec resolve_lora(const ModelConfig& cfg, const LoraTargets& targets, const LoraShape& shape,
                      const std::string& where);
// The adapted modules' full names, in block then site order (PEFT's adapter_config target_modules).
std::vector<std::string> lora_target_paths(const ModelConfig& cfg);
// The modules_to_save names of `spec` ("embed_tokens", "lm_head").
std::vector<std::string> lora_saved_modules(const LoraSpec& spec);

// The spec as ModelConfig::to_json writes it (our keys) and back; ConfigError prefixed by `where`.
nlohmann::json lora_to_json(const ModelConfig& cfg);
LoraSpec lora_from_json(const nlohmann::json& j, const ModelConfig& cfg, const std::string& where);

}  // namespace strata::model
