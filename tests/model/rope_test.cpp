// The rope scalings "linear" and "yarn" against transformers 5.24 (tests/reference/make_rope_reference.py
// dumped its inv_freq and attention factor for each case of tests/reference/data/rope_inv_freq.json, a
// config.json's keys as given): the frequencies bit for bit, except where torch's fp32 pow of theta is not
// the correctly rounded one (Note [Rope arithmetic], model/rope.cpp); their config keys in the older
// rope_scaling and the newer rope_parameters form, written back as read; bad values refused by name. The
// models these scalings compute end to end: tests/model/reference_test.cpp (rope_linear, rope_yarn).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/config.h"
#include "model/rope.h"
#include "tests/common/source_dir.h"
#include "tests/model/config_error.h"

namespace strata::model {
namespace {

using json = nlohmann::json;

json reference_cases() {
  return json::parse(std::ifstream(test::source_path("tests/reference/data/rope_inv_freq.json")))["cases"];
}

// Every case of `type` (the prefix of its name) matches transformers; returns how many frequencies were
// compared bit for bit.
int expect_cases_match(const std::string& type) {
  int cases = 0, exact = 0;
  for (const json& k : reference_cases()) {
    const std::string name = k["name"];
    if (name.rfind(type + "_", 0) != 0) continue;
    SCOPED_TRACE(name);
    ++cases;
    const ModelConfig c = ModelConfig::from_json(k["config"], name);
    EXPECT_EQ(c.rope_scaling.type, type);
    const std::vector<float> got = rope_inv_freq(c, 24);
    const std::vector<double> want = k["inv_freq"];
    const std::vector<int> pow_off = k["pow_not_correctly_rounded"];
    EXPECT_LE(pow_off.size(), 2u);  // torch's pow is off rarely; more would mean a different arithmetic
    EXPECT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
      const float w = float(want[i]);
      if (std::find(pow_off.begin(), pow_off.end(), int(i)) != pow_off.end()) {
        EXPECT_NEAR(got[i], w, 3e-7 * w) << "i = " << i;  // a 1-ulp power through three fp32 roundings
      } else {
        EXPECT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(w))
            << "i = " << i << ": " << got[i] << " vs transformers' " << w;
        ++exact;
      }
    }
    const double attention = k["attention_factor"];
    EXPECT_EQ(rope_attention_factor(c), float(attention));
    if (type == "yarn") {
      EXPECT_EQ(c.rope_scaling.attention_factor, attention);
    }
    // What Strata writes reads back to the same config and the same frequencies.
    const ModelConfig hf = ModelConfig::from_json(c.to_hf_json()), ours = ModelConfig::from_json(c.to_json());
    EXPECT_EQ(hf, c);
    EXPECT_EQ(ours, c);
    EXPECT_EQ(rope_inv_freq(hf, 24), got);
    EXPECT_EQ(rope_attention_factor(hf), rope_attention_factor(c));
  }
  EXPECT_GE(cases, 3) << type;
  return exact;
}

TEST(RopeInvFreq, LinearMatchesTransformersBitForBit) {
  EXPECT_GT(expect_cases_match("linear"), 100);
}

TEST(RopeInvFreq, YarnMatchesTransformersBitForBit) {
  EXPECT_GT(expect_cases_match("yarn"), 200);
}

// A small Llama config.json with `rope` as its rope_scaling.
json with_rope(const json& rope, const std::string& model_type = "llama") {
  return {{"model_type", model_type},       {"vocab_size", 256},        {"hidden_size", 64},
          {"num_hidden_layers", 1},         {"num_attention_heads", 4}, {"intermediate_size", 64},
          {"max_position_embeddings", 256}, {"rope_theta", 10000.0},    {"rope_scaling", rope}};
}

std::string error_of(const json& j) {
  return config_error_of(j);
}

TEST(RopeConfig, LinearAndYarnReadTheSameInTheOlderAndNewerForm) {
  const json yarn = {{"rope_type", "yarn"},   {"factor", 4.0},    {"original_max_position_embeddings", 64},
                     {"beta_fast", 16.0},     {"beta_slow", 2},   {"mscale", 0.707},
                     {"mscale_all_dim", 1.0}, {"truncate", false}};
  for (const json& rope : {json{{"rope_type", "linear"}, {"factor", 2.0}}, yarn}) {
    SCOPED_TRACE(rope.dump());
    const json older = with_rope(rope);
    json newer = older, legacy = older;
    newer.erase("rope_scaling");
    newer.erase("rope_theta");
    newer["rope_parameters"] = rope;
    newer["rope_parameters"]["rope_theta"] = 10000.0;
    legacy["rope_scaling"].erase("rope_type");  // transformers before 4.43 wrote "type"
    legacy["rope_scaling"]["type"] = rope["rope_type"];
    const ModelConfig a = ModelConfig::from_json(older);
    EXPECT_EQ(a.rope_scaling.type, rope["rope_type"]);
    EXPECT_EQ(ModelConfig::from_json(newer), a);
    EXPECT_EQ(ModelConfig::from_json(legacy), a);
  }
}

// The optional keys are written back as read, so that transformers reads the export the same way: factor
// null stays null, and the keys not given stay absent.
TEST(RopeConfig, YarnWritesItsKeysBackAsRead) {
  const ModelConfig full = ModelConfig::from_json(with_rope({{"rope_type", "yarn"},
                                                             {"factor", 4.0},
                                                             {"original_max_position_embeddings", 64},
                                                             {"attention_factor", 1.5},
                                                             {"beta_fast", 16.0},
                                                             {"beta_slow", 2.0},
                                                             {"mscale", 0.707},
                                                             {"mscale_all_dim", 1.0},
                                                             {"truncate", false}}));
  const json written = full.to_hf_json()["rope_scaling"];
  for (const char* k : {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
                        "beta_slow", "mscale", "mscale_all_dim", "truncate"})
    EXPECT_TRUE(written.contains(k)) << k << " missing from " << written.dump();
  EXPECT_EQ(written["truncate"], false);
  EXPECT_EQ(full.rope_scaling.attention_factor, 1.5);

  json bare =
      with_rope({{"rope_type", "yarn"}, {"factor", nullptr}, {"original_max_position_embeddings", 64}});
  const ModelConfig derived = ModelConfig::from_json(bare);
  EXPECT_EQ(derived.rope_scaling.factor, 4.0);  // max_position_embeddings / original_max_position_embeddings
  EXPECT_EQ(derived.rope_scaling.attention_factor, 0.1 * std::log(4.0) + 1.0);
  const json back = derived.to_hf_json()["rope_scaling"];
  EXPECT_TRUE(back.contains("factor") && back["factor"].is_null()) << back.dump();
  for (const char* k : {"attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"})
    EXPECT_FALSE(back.contains(k)) << k << " in " << back.dump();
  EXPECT_EQ(ModelConfig::from_json(derived.to_hf_json()), derived);
}

TEST(RopeConfig, LinearAndYarnRefuseBadValuesByName) {
  const json yarn = {{"rope_type", "yarn"}, {"factor", 4.0}};
  auto yarn_with = [&](const char* key, const json& value) {
    json r = yarn;
    r[key] = value;
    return r;
  };
  const std::pair<json, const char*> cases[] = {
      {{{"rope_type", "linear"}}, "linear rope scaling needs 'factor'"},
      {{{"rope_type", "linear"}, {"factor", 0}}, "linear rope scaling needs 'factor'"},
      {{{"rope_type", "linear"}, {"factor", nullptr}}, "linear rope scaling needs 'factor'"},
      {{{"rope_type", "linear"}, {"factor", 2.0}, {"original_max_position_embeddings", 64}},
       "'original_max_position_embeddings' is not a key of linear rope scaling"},
      {{{"rope_type", "yarn"}}, "yarn rope scaling needs 'factor'"},
      {yarn_with("factor", -1), "'factor' is -1"},
      {yarn_with("beta_fst", 16), "'beta_fst' is not a key of yarn rope scaling"},
      {yarn_with("beta_fast", -1), "'beta_fast' is -1"},
      {yarn_with("beta_slow", 64), "beta_fast 32 is below beta_slow 64"},
      {yarn_with("truncate", "yes"), "'truncate' is \"yes\""},
      {yarn_with("original_max_position_embeddings", 0), "'original_max_position_embeddings' is 0"},
      {yarn_with("attention_factor", 0), "'attention_factor' is 0"},
      {yarn_with("mscale", "1"), "'mscale' is \"1\""},
      {{{"rope_type", "yarn"}, {"factor", 4.0}, {"mscale", -20.0}, {"mscale_all_dim", 1.0}},
       "attention factor from mscale -20"},
      {{{"rope_type", "dynamic"}, {"factor", 2.0}},
       "\"dynamic\" is not implemented; Strata computes \"default\", \"linear\", "
       "\"llama3\", \"yarn\" and \"longrope\""},
  };
  for (const auto& [rope, want] : cases) {
    const std::string m = error_of(with_rope(rope));
    EXPECT_NE(m.find(want), std::string::npos) << rope.dump() << ": " << m;
  }
  // transformers would take the top-level original_max_position_embeddings over the object's.
  json both = with_rope(yarn_with("original_max_position_embeddings", 32));
  both["original_max_position_embeddings"] = 64;
  EXPECT_NE(error_of(both).find("differs from the top-level original_max_position_embeddings 64"),
            std::string::npos)
      << error_of(both);
  // transformers' Phi3Config takes only default and longrope (and reads yarn as longrope).
  const std::string phi3 = error_of(with_rope({{"rope_type", "linear"}, {"factor", 2.0}}, "phi3"));
  EXPECT_NE(phi3.find("\"linear\" in a phi3 config"), std::string::npos) << phi3;
}

}  // namespace
}  // namespace strata::model
