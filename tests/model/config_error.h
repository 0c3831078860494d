// Test helper: the ConfigError a model config.json's reading raises, as text.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "model/config.h"

namespace strata::model {

// What ModelConfig::from_json(j, "config.json") refuses `j` with, or "(accepted)".
inline std::string config_error_of(const nlohmann::json& j) {
  try {
    ModelConfig::from_json(j, "config.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace strata::model
