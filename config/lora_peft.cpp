// PEFT's LoraConfig fields and what Strata does with each (the table the strata.lora block, the reader of
// adapter_config.json and docs/config.md share), and adapter_config.json read and written.
#include "config/lora_peft.h"

#include <algorithm>
#include <cmath>

#include "config/config_impl.h"
#include "core/error.h"

namespace strata {

namespace config_detail {
namespace {

// What asks for nothing Strata lacks: null (not given, as everywhere in the config), and for the options
// that hold a list or a mapping of exceptions, an empty one.
bool nothing(const nlohmann::json& v) {
  return v.is_null() || ((v.is_array() || v.is_object() || v.is_string()) && v.empty());
}
bool not_true(const nlohmann::json& v) {
  return v.is_null() || v == false;
}
bool bias_none(const nlohmann::json& v) {
  return v.is_null() || v == "none";
}
bool causal_lm(const nlohmann::json& v) {
  return v.is_null() || v == "CAUSAL_LM";
}
bool lora_type(const nlohmann::json& v) {
  return v == "LORA";
}
bool a_boolean(const nlohmann::json& v) {
  return v.is_null() || v.is_boolean();
}

using R = PeftRole;
const nlohmann::json kNull = nullptr;
const nlohmann::json kEmpty = nlohmann::json::object();

// Note [PEFT's fields]: the fields of PEFT 0.21.2's LoraConfig (dataclasses.fields; peft/config.py and
// peft/tuners/lora/config.py), each decided once: read (what Strata computes), limited (a computation
// Strata does not do, refused unless at its default), or metadata (ignored: it describes the file, or it
// only matters beside a value that is refused). runtime_config is not among them: PEFT never writes it and
// ignores it on load, and so does Strata. A metadata entry's `reason` says why it may be ignored (docs).
std::vector<PeftField> build_peft_fields() {
  const char* layers =
      "choosing layers by index is not computed; name the layers' modules in target_modules "
      "(\"model.layers.1.self_attn.q_proj\") or match them with a regular expression";
  return {
      {"alora_invocation_tokens", R::limited, kNull, nothing, "null or []",
       "Activated LoRA (aLoRA) is not computed"},
      {"alpha_pattern", R::limited, kEmpty, nothing, "{} or null",
       "per-module alphas are not computed; every adapter has lora_alpha"},
      {"arrow_config", R::limited, kNull, nothing, "null", "Arrow routing is not computed"},
      {"auto_mapping", R::metadata, kNull, nullptr, nullptr, "the Python class of a custom base model"},
      {"base_model_name_or_path", R::metadata, kNull, nullptr, nullptr,
       "the base the adapters were trained on; the run names the model it loads"},
      {"bias", R::limited, "none", bias_none, "\"none\"",
       "training the base's biases (\"all\", \"lora_only\") is not computed; the base is frozen"},
      {"corda_config", R::metadata, kNull, nullptr, nullptr,
       "CorDA's settings: used only with init_lora_weights \"corda\", which is refused"},
      {"ensure_weight_tying", R::metadata, false, nullptr, nullptr,
       "ties the adapters of tied layers; Strata adapts no tied layer (saving a module of tied embeddings is "
       "refused)"},
      {"eva_config", R::metadata, kNull, nullptr, nullptr,
       "EVA's settings: used only with init_lora_weights \"eva\", which is refused"},
      {"exclude_modules", R::limited, kNull, nothing, "null or []",
       "excluding modules is not computed; list the modules to adapt in target_modules"},
      {"fan_in_fan_out", R::limited, false, not_true, "false",
       "weights stored (in, out), as GPT-2's Conv1D, are not computed; Strata's families store (out, in)"},
      {"inference_mode", R::metadata, true, nullptr, nullptr,
       "whether PEFT loads the adapters frozen; the run says whether Strata trains them"},
      {"init_lora_weights", R::limited, true, a_boolean, "true or false",
       "PEFT's other initialisations (\"gaussian\", \"pissa\", \"olora\", \"eva\", \"corda\", \"loftq\", "
       "\"orthogonal\", \"mica\", ...) are not computed"},
      {"kasa_config", R::limited, kNull, nothing, "null", "KaSA is not computed"},
      {"layer_replication", R::limited, kNull, nothing, "null or []", "layer replication is not computed"},
      {"layers_pattern", R::limited, kNull, nothing, "null or []", layers},
      {"layers_to_transform", R::limited, kNull, nothing, "null or []", layers},
      {"loftq_config", R::metadata, kEmpty, nullptr, nullptr,
       "LoftQ's settings: used only with init_lora_weights \"loftq\", which is refused"},
      {"lora_alpha", R::read, 8},
      {"lora_bias", R::limited, false, not_true, "false", "a bias on lora_B is not computed"},
      {"lora_dropout", R::read, 0.0},
      {"lora_ga_config", R::metadata, kNull, nullptr, nullptr,
       "LoRA-GA's settings: used only with an init_lora_weights that is refused"},
      {"megatron_config", R::limited, kNull, nothing, "null",
       "Megatron's parallel linear layers are not computed"},
      {"megatron_core", R::metadata, "megatron.core", nullptr, nullptr,
       "the module Megatron's layers come from: used only with megatron_config, which is refused"},
      {"modules_to_save", R::read, kNull},
      {"monteclora_config", R::limited, kNull, nothing, "null", "MonteCLoRA is not computed"},
      {"peft_type", R::limited, "LORA", lora_type, "\"LORA\"", "Strata reads LoRA adapters only",
       /*in_block=*/false},
      {"peft_version", R::metadata, kPeftFormatVersion, nullptr, nullptr,
       "the PEFT version that wrote the file"},
      {"qalora_group_size", R::metadata, 16, nullptr, nullptr, "used only with use_qalora, which is refused"},
      {"r", R::read, 8},
      {"rank_pattern", R::limited, kEmpty, nothing, "{} or null",
       "per-module ranks are not computed; every adapter has rank r"},
      {"revision", R::metadata, kNull, nullptr, nullptr, "the base model's revision on the Hub"},
      {"target_modules", R::read, kNull},
      {"target_parameters", R::limited, kNull, nothing, "null or []",
       "adapting parameters (target_parameters, for experts stored as one tensor) is not computed; "
       "target_modules names the linear layers to adapt"},
      {"task_type", R::limited, "CAUSAL_LM", causal_lm, "\"CAUSAL_LM\" or null",
       "Strata trains causal language models"},
      {"trainable_token_indices", R::limited, kNull, nothing, "null or []",
       "training chosen rows of the embedding is not computed; modules_to_save [\"embed_tokens\"] trains "
       "all of it"},
      {"use_bdlora", R::limited, kNull, nothing, "null", "block-diagonal LoRA (BD-LoRA) is not computed"},
      {"use_dora", R::limited, false, not_true, "false", "DoRA is not computed"},
      {"use_qalora", R::limited, false, not_true, "false", "QALoRA is not computed"},
      {"use_rslora", R::read, false},
      {"velora_config", R::limited, kNull, nothing, "null", "VeLoRA is not computed"},
  };
}

}  // namespace

const char* const kTargetModulesRequired =
    "give PEFT's module names, e.g. [\"q_proj\", \"v_proj\"], or \"all-linear\"";

const std::vector<PeftField>& peft_fields() {
  static const std::vector<PeftField> table = build_peft_fields();
  return table;
}

const PeftField* find_peft_field(std::string_view name) {
  for (const PeftField& f : peft_fields())
    if (name == f.name) return &f;
  return nullptr;
}

std::string peft_refusal(const PeftField& f, const nlohmann::json& v) {
  if (f.role != PeftRole::limited || f.accepts(v)) return "";
  return detail::cat(show(v), " is not supported: ", f.reason, "; allowed: ", f.accepted);
}

}  // namespace config_detail

using namespace config_detail;

// Note [Fields of newer PEFT versions]: a key of adapter_config.json that is none of PEFT 0.21's fields is
// ignored without a word. Each PEFT release adds fields (0.21 wrote a dozen that 0.14 did not), always with a
// default that keeps plain LoRA, and PEFT itself drops keys it does not know when loading a newer file
// (PeftConfigMixin.from_peft_type); refusing them would refuse every adapter a newer PEFT saves. A new
// option that changes the computation is caught when this table is brought to that version.
StrataConfig::Lora lora_from_peft(const nlohmann::json& adapter_config, const std::string& where) {
  if (!adapter_config.is_object())
    throw ConfigError(detail::cat(where, ": the top level is ", show(adapter_config),
                                  ", not a JSON object (PEFT's adapter_config.json is one)"));
  std::vector<std::string> errors;
  auto missing = [&](const char* key) {
    auto it = adapter_config.find(key);
    return it == adapter_config.end() || it->is_null();
  };
  if (missing("peft_type"))
    errors.push_back("peft_type: missing; PEFT writes \"peft_type\": \"LORA\" for LoRA adapters");
  Config scratch;  // the block's defaults, which are PEFT's
  for (const auto& [key, v] : adapter_config.items()) {
    const PeftField* f = find_peft_field(key);
    if (!f) continue;  // Note [Fields of newer PEFT versions]
    if (std::string why = peft_refusal(*f, v); !why.empty()) {
      errors.push_back(detail::cat(key, ": ", why));
      continue;
    }
    const int i = option_index("strata.lora." + key);
    if (i < 0 || v.is_null()) continue;  // metadata, or accepted and not stored; null: PEFT's default
    try {
      store(options()[std::size_t(i)], scratch, v, key);
    } catch (const ConfigError& e) {
      errors.push_back(e.what());
    }
  }
  if (missing("target_modules"))
    errors.push_back(detail::cat("target_modules: missing; ", kTargetModulesRequired));
  if (errors.size() == 1) throw ConfigError(detail::cat(where, ": ", errors[0]));
  if (!errors.empty())
    throw ConfigError(
        detail::cat(where, ": ", errors.size(), " problems:\n  ", detail::join(errors, "\n  ")));
  StrataConfig::Lora lora = scratch.strata.lora;
  lora.enabled = true;
  return lora;
}

nlohmann::json peft_adapter_config(const StrataConfig::Lora& lora, const std::string& base_model_name_or_path,
                                   const std::vector<std::string>& targets) {
  STRATA_CHECK(!targets.empty(), "peft_adapter_config: no target module; PEFT cannot load adapters of none");
  nlohmann::json out = nlohmann::json::object();  // keys sorted, as PEFT's json.dumps(sort_keys=True)
  for (const PeftField& f : peft_fields()) out[f.name] = f.written;
  out["r"] = lora.r;
  // PEFT's lora_alpha is an int: a whole alpha is written as one (16, not 16.0).
  const double alpha = lora.lora_alpha;
  if (std::floor(alpha) == alpha && std::fabs(alpha) < 9e15)
    out["lora_alpha"] = std::int64_t(alpha);
  else
    out["lora_alpha"] = alpha;
  out["lora_dropout"] = lora.lora_dropout;
  out["target_modules"] = targets;
  out["modules_to_save"] =
      lora.modules_to_save.empty() ? nlohmann::json(nullptr) : nlohmann::json(lora.modules_to_save);
  out["use_rslora"] = lora.use_rslora;
  out["init_lora_weights"] = lora.init_lora_weights;
  out["base_model_name_or_path"] =
      base_model_name_or_path.empty() ? nlohmann::json(nullptr) : nlohmann::json(base_model_name_or_path);
  return out;
}

}  // namespace strata
