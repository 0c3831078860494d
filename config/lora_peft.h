// strata/config/lora_peft.h: PEFT's adapter_config.json, read into and written from a StrataConfig::Lora.
//
// Example:
//   // --adapter DIR: the adapters a PEFT run (or an earlier Strata run) saved
//   std::ifstream in(dir + "/adapter_config.json");
//   StrataConfig::Lora lora = lora_from_peft(nlohmann::json::parse(in), dir + "/adapter_config.json");
//   lora.adapter_dir = dir;
//   ...
//   // saving: the module paths model/lora.h adapted (lora_target_paths), for PeftModel.from_pretrained
//   std::ofstream(out + "/adapter_config.json")
//       << peft_adapter_config(lora, "meta-llama/Llama-3.2-1B", targets).dump(2);
//
// Every field of PEFT 0.21's LoraConfig is one of: read (r, lora_alpha, lora_dropout, target_modules,
// modules_to_save, use_rslora, init_lora_weights), checked (peft_type "LORA"; task_type "CAUSAL_LM" or
// null), a computation Strata does not do, refused by name unless at its default (use_dora, bias,
// rank_pattern, ...), or metadata, ignored (peft_version, base_model_name_or_path, inference_mode, ...).
// docs/config.md lists them all. The refusals are the ones the strata.lora block gives, word for word.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/config.h"

namespace strata {

// The PEFT version whose adapter_config.json fields peft_adapter_config writes (as "peft_version").
inline constexpr const char* kPeftFormatVersion = "0.21.2";

// Reads PEFT's adapter_config.json (already parsed) into a Lora; `where` names the file in errors.
// The result has enabled true and the block's defaults for what the file does not carry (base_dtype bf16,
// double_quant true, adapter_dir empty). Every problem in the file raises one ConfigError that starts with
// `where` (all of them, as Config::parse reports a config's): peft_type other than "LORA", task_type other
// than "CAUSAL_LM" or null, a value out of range, no target_modules, a PEFT option Strata does not compute.
StrataConfig::Lora lora_from_peft(const nlohmann::json& adapter_config, const std::string& where);

// The adapter_config.json PEFT's PeftModel.from_pretrained loads for these settings, naming the base
// (base_model_name_or_path; "" writes null) and listing `targets` as target_modules. Every field PEFT
// 0.21.2 writes is there, at PEFT's defaults but for r, lora_alpha, lora_dropout, target_modules,
// modules_to_save (null when empty), use_rslora, init_lora_weights, base_model_name_or_path, and
// inference_mode true (PeftModel.save_pretrained writes it so). base_dtype and double_quant are not PEFT's.
nlohmann::json peft_adapter_config(const StrataConfig::Lora& lora, const std::string& base_model_name_or_path,
                                   const std::vector<std::string>& targets);

}  // namespace strata
