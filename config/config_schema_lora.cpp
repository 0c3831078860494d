// The config schema's strata.lora block: LoRA adapters on a frozen base, with PEFT's LoraConfig key names
// and defaults (peft/tuners/lora/config.py), so that a LoraConfig(...) carries over key for key. Appended by
// build_options (config_schema.cpp) in table order. PEFT's fields that are not keys here are in
// lora_peft.cpp's table: accepted in the block at their defaults, refused by name otherwise.
//
// The keys apply only where the block is given ("lora": {...}); "lora": null or no block leaves
// StrataConfig::Lora::enabled false, and then none of them is in force (nor in the resolved table).
#include "config/config_schema_util.h"

namespace strata::config_detail {
namespace {

bool lora_on(const Config& c) {
  return c.strata.lora.enabled;
}
constexpr const char* kLoraBlock = "a strata.lora block";

}  // namespace

void add_lora_options(std::vector<Option>& o) {
  o.push_back({.path = "strata.lora.r",
               .kind = Kind::integer,
               .def = 8,
               .meaning = "LoRA rank: each adapted linear layer W (out, in) gains A (r, in) and B (out, r).",
               .field = STRATA_FIELD(strata.lora.r),
               .min = 1,
               .applies = lora_on,
               .applies_note = kLoraBlock});
  o.push_back({.path = "strata.lora.lora_alpha",
               .kind = Kind::real,
               .def = 8,
               .meaning = "The adapters' scale is lora_alpha / r (lora_alpha / sqrt(r) with use_rslora).",
               .field = STRATA_FIELD(strata.lora.lora_alpha),
               .min = 0,
               .min_exclusive = true,
               .applies = lora_on,
               .applies_note = kLoraBlock});
  o.push_back({.path = "strata.lora.lora_dropout",
               .kind = Kind::real,
               .def = 0.0,
               .meaning = "Dropout on the adapters' input (A's), in training only.",
               .field = STRATA_FIELD(strata.lora.lora_dropout),
               .min = 0,
               .max = 1,
               .max_exclusive = true,
               .applies = lora_on,
               .applies_note = kLoraBlock});
  o.push_back(
      {.path = "strata.lora.target_modules",
       .kind = Kind::modules,
       .def = nullptr,
       .meaning =
           "The linear layers to adapt, as PEFT matches them: a list of names (a module whose path is an "
           "entry or ends with \".\" + entry: \"q_proj\", \"model.layers.1.self_attn.k_proj\"), "
           "\"all-linear\" "
           "(every linear layer of the blocks; not lm_head), or one other string: a regular expression the "
           "whole module path must match (ECMAScript syntax, which PEFT's usual Python patterns share). "
           "Required in the block.",
       .field = [](Config& c) -> FieldRef {
         return ModulesRef{&c.strata.lora.target_modules, &c.strata.lora.target_modules_regex};
       },
       .default_note = "required",
       .applies = lora_on,
       .applies_note = kLoraBlock});
  o.push_back({.path = "strata.lora.modules_to_save",
               .kind = Kind::names,
               .def = nullptr,
               .meaning = "Base modules trained in full beside the adapters and saved with them, as PEFT's "
                          "modules_to_save: \"lm_head\", \"embed_tokens\" (not with tied embeddings).",
               .field = STRATA_FIELD(strata.lora.modules_to_save),
               .default_note = "none",
               .applies = lora_on,
               .applies_note = kLoraBlock});
  o.push_back({.path = "strata.lora.use_rslora",
               .kind = Kind::boolean,
               .def = false,
               .meaning = "Rank-stabilised LoRA: scale lora_alpha / sqrt(r) instead of lora_alpha / r.",
               .field = STRATA_FIELD(strata.lora.use_rslora),
               .applies = lora_on,
               .applies_note = kLoraBlock});
  o.push_back({.path = "strata.lora.init_lora_weights",
               .kind = Kind::boolean,
               .def = true,
               .meaning = "PEFT's initialisation of new adapters: true, A Kaiming-uniform and B zero (the "
                          "adapted model starts as the base); false, B random too (PEFT's debugging choice). "
                          "PEFT's other initialisations (\"gaussian\", \"pissa\", ...) are refused.",
               .field = STRATA_FIELD(strata.lora.init_lora_weights),
               .applies = lora_on,
               .applies_note = kLoraBlock});
  o.push_back({.path = "strata.lora.base_dtype",
               .kind = Kind::choice,
               .def = "bf16",
               .meaning =
                   "How the frozen base weights are stored: bf16, or nf4 (QLoRA's 4-bit NormalFloat, as "
                   "bitsandbytes' load_in_4bit: every block's projection weights in blocks of 64, about "
                   "0.52 byte a parameter; norms, biases, embedding and lm_head stay bf16). nf4 needs "
                   "a base read from files (--init-from). Not a PEFT key.",
               .field = STRATA_FIELD(strata.lora.base_dtype),
               .choices = {"bf16", "nf4"},
               .applies = lora_on,
               .applies_note = kLoraBlock});
  o.push_back({.path = "strata.lora.double_quant",
               .kind = Kind::boolean,
               .def = true,
               .meaning = "With base_dtype nf4: quantise the absmax values too (QLoRA's double quantisation, "
                          "its default). No effect with bf16. Not a PEFT key.",
               .field = STRATA_FIELD(strata.lora.double_quant),
               .applies = lora_on,
               .applies_note = kLoraBlock});
}

}  // namespace strata::config_detail
