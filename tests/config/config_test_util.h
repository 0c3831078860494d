// Helpers shared by the config tests: fixtures, the scratch directory (tests/common) and error capture.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "config/config.h"
#include "core/error.h"
#include "tests/common/scratch_dir.h"
#include "tests/common/source_dir.h"

namespace strata::testing {

inline std::string source_path(const std::string& rel) {
  return strata::test::source_path(rel);
}
inline std::string fixture_path(const std::string& name) {
  return source_path("tests/config/fixtures/" + name);
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return nlohmann::json::parse(in);
}

inline std::string write_file(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

// The ConfigError message parse() raises, or "" (and a test failure) when it accepts the document.
inline std::string parse_error(const nlohmann::json& doc, const Overrides& ov = {}, int world = 1) {
  try {
    Config::parse(doc, ov, world);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << doc.dump();
  return "";
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

inline bool any_contains(const std::vector<std::string>& lines, const std::string& needle) {
  for (const auto& l : lines)
    if (contains(l, needle)) return true;
  return false;
}

}  // namespace strata::testing
