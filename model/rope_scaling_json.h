// Internal to model/: Hugging Face's rope_scaling / rope_parameters objects read into RopeScaling and
// written back, as transformers 5 validates and defaults them (config.cpp's from_json, to_json and
// to_hf_json call these; model/rope.h computes the frequencies from the result).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "model/config.h"

namespace strata::model {

// Hugging Face's rope_scaling object (or rope_parameters, which also carries rope_theta); null: the
// default. `phi3`: Phi-3's config reads "yarn" as longrope too, and takes no other scaling. ConfigError
// naming `where` and the key for anything transformers would refuse.
RopeScaling parse_rope_scaling(const nlohmann::json& r, const std::string& where, bool phi3);
// longrope's remaining parameters once the model's sizes are known: the original length, the factors'
// count, the attention factor's default.
void finish_longrope(RopeScaling& s, const nlohmann::json& j, int64_t max_seq_len, int64_t head_dim,
                     const std::string& where);
// YaRN's defaults that need the model's sizes (from config.json `j` and max_seq_len).
void finish_yarn(RopeScaling& s, const nlohmann::json& j, int64_t max_seq_len, const std::string& where);
// The object config.json holds for `s`.
nlohmann::json rope_scaling_json(const RopeScaling& s);

}  // namespace strata::model
