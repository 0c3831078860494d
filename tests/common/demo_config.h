// The stock demo config (configs/demo_cpu.json) as the tests train with it: its schedule over
// scripts/demo.sh's 60 steps, the length the file leaves to the run ("auto"; Note [Loud auto] in
// config/config.cpp).
//
// Example:
//   nlohmann::json doc = test::demo_config_doc();
//   doc["gradient_accumulation_steps"] = 2;
//   const Config cfg = Config::parse(doc);
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/common/source_dir.h"

namespace strata::test {

inline constexpr int kDemoSteps = 60;  // scripts/demo.sh's --steps

inline nlohmann::json demo_config_doc() {
  std::ifstream in(source_path("configs/demo_cpu.json"));
  nlohmann::json doc = nlohmann::json::parse(in);
  doc["scheduler"]["params"]["total_num_steps"] = kDemoSteps;
  return doc;
}

}  // namespace strata::test
