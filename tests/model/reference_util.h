// tests/model/reference_util.h: reading the reference dumps of tests/reference/make_reference.py and
// make_lora_reference.py (reference.safetensors and reference.json) for the tests that compare with them.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/safetensors.h"

namespace strata::model::testing {

// Tensor `name` of a dump, as fp32; ConfigError naming it when absent.
inline std::vector<float> read_all(const SafetensorsReader& r, const std::string& name) {
  const SafetensorsEntry* e = r.find(name);
  if (!e) throw ConfigError("reference dump " + r.path() + " has no tensor " + name);
  std::vector<float> v(e->numel());
  r.read_f32(name, e->shape, v.data());
  return v;
}

inline double norm(const float* a, std::size_t n) {
  double s = 0;
  for (std::size_t i = 0; i < n; ++i) s += double(a[i]) * a[i];
  return std::sqrt(s);
}

// The dump's batch: input_ids (B, T + 1) as inputs (B, T) and the next tokens as targets.
struct ShiftedBatch {
  int B = 0, T = 0;
  std::vector<std::int32_t> in, tgt;
};
inline ShiftedBatch shifted_batch(const SafetensorsReader& ref, const nlohmann::json& meta) {
  ShiftedBatch s{.B = meta["batch"], .T = meta["seq_len"], .in = {}, .tgt = {}};
  const std::vector<float> ids = read_all(ref, "input_ids");
  s.in.resize(std::size_t(s.B) * std::size_t(s.T));
  s.tgt.resize(s.in.size());
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < s.T; ++t) {
      s.in[std::size_t(b) * s.T + t] = std::int32_t(ids[std::size_t(b) * (s.T + 1) + t]);
      s.tgt[std::size_t(b) * s.T + t] = std::int32_t(ids[std::size_t(b) * (s.T + 1) + t + 1]);
    }
  return s;
}

// Every logit within 2e-5 of the dump's largest magnitude.
inline void expect_logits_match(const std::vector<float>& logits, const SafetensorsReader& ref) {
  const std::vector<float> want = read_all(ref, "logits");
  ASSERT_EQ(logits.size(), want.size());
  float max_abs = 0;
  for (float v : want) max_abs = std::max(max_abs, std::fabs(v));
  for (std::size_t i = 0; i < logits.size(); ++i)
    ASSERT_NEAR(logits[i], want[i], 2e-5 * max_abs + 1e-6) << "logit " << i;
}

}  // namespace strata::model::testing
