// Model config: presets, parameter counts, JSON parsing and its errors.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config.h"
#include "model_test_util.h"
#include "tests/common/source_dir.h"

namespace strata::model {
namespace {

using json = nlohmann::json;

std::string error_of(const json& j) {
  try {
    ModelConfig::from_json(j, "test.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ModelConfig, Llama2PresetsHaveMetasParameterCounts) {
  EXPECT_EQ(ModelConfig::preset("llama2-7b").num_parameters(), 6738415616);
  EXPECT_EQ(ModelConfig::preset("llama2-13b").num_parameters(), 13015864320);
}

TEST(ModelConfig, EveryPresetIsValidAndNearItsNominalSize) {
  const std::pair<const char*, double> nominal[] = {
      {"10m", 10e6}, {"125m", 125e6},       {"350m", 350e6},       {"1b", 1.1e9},
      {"3b", 3.0e9}, {"llama2-7b", 6.74e9}, {"llama2-13b", 13.0e9}};
  for (const auto& [name, n] : nominal) {
    ModelConfig c = ModelConfig::preset(name);
    EXPECT_NO_THROW(c.validate(name));
    double got = double(c.num_parameters());
    EXPECT_GT(got, 0.9 * n) << name;
    EXPECT_LT(got, 1.15 * n) << name;
    std::printf("  preset %-11s %15lld parameters\n", name, (long long)c.num_parameters());
  }
  EXPECT_LT(ModelConfig::preset("tiny").num_parameters(), 100000);
}

TEST(ModelConfig, UnknownPresetListsTheKnownOnes) {
  try {
    ModelConfig::preset("llama9");
    FAIL() << "no throw";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("tiny, 10m, 125m"), std::string::npos) << e.what();
  }
}

TEST(ModelConfig, JsonRoundTripsEveryPreset) {
  for (const std::string& name : ModelConfig::preset_names()) {
    ModelConfig c = ModelConfig::preset(name);
    EXPECT_EQ(ModelConfig::from_json(c.to_json()), c) << name;
  }
}

TEST(ModelConfig, PresetFilesMatchTheBuiltInPresets) {
  for (const std::string& name : ModelConfig::preset_names()) {
    std::string path = strata::test::source_path("configs/models/" + name + ".json");
    EXPECT_EQ(ModelConfig::from_file(path), ModelConfig::preset(name)) << path;
  }
}

// docs/model.md's preset table ends each row with the parameter count, digits grouped by commas.
TEST(ModelConfig, DocsTableStatesEveryPresetsParameterCount) {
  std::ifstream in(strata::test::source_path("docs/model.md"));
  ASSERT_TRUE(in.good());
  std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const std::string& name : ModelConfig::preset_names()) {
    std::string digits = std::to_string(ModelConfig::preset(name).num_parameters()), grouped;
    for (size_t i = 0; i < digits.size(); ++i) {
      if (i > 0 && (digits.size() - i) % 3 == 0) grouped += ',';
      grouped += digits[i];
    }
    size_t row = doc.find("\n| " + name + " |");
    ASSERT_NE(row, std::string::npos) << name << " has no row in docs/model.md";
    std::string line = doc.substr(row + 1, doc.find('\n', row + 1) - row - 1);
    EXPECT_NE(line.find("| " + grouped + " |"), std::string::npos) << line << " should state " << grouped;
  }
}

TEST(ModelConfig, ReadsHuggingFaceConfigJson) {
  json hf = {{"architectures", {"LlamaForCausalLM"}},
             {"model_type", "llama"},
             {"hidden_size", 4096},
             {"intermediate_size", 11008},
             {"num_hidden_layers", 32},
             {"num_attention_heads", 32},
             {"num_key_value_heads", 32},
             {"max_position_embeddings", 4096},
             {"rms_norm_eps", 1e-5},
             {"rope_theta", 10000.0},
             {"tie_word_embeddings", false},
             {"vocab_size", 32000},
             {"torch_dtype", "float16"}};
  ModelConfig c = ModelConfig::from_json(hf);
  EXPECT_EQ(c.num_parameters(), ModelConfig::preset("llama2-7b").num_parameters());
  EXPECT_EQ(c.head_dim(), 128);
}

TEST(ModelConfig, FromFileReadsOurKeys) {
  test::ScratchDir dir("model");
  std::string path = dir.file("tiny_config.json");
  json j = ModelConfig::preset("tiny").to_json();
  j["name"] = "mine";
  std::ofstream(path) << j.dump(2);
  ModelConfig c = ModelConfig::from_file(path);
  EXPECT_EQ(c.name, "mine");
  EXPECT_EQ(c.d_model, ModelConfig::preset("tiny").d_model);
}

// A number beyond a double's range is JSON nlohmann refuses with out_of_range.406, not parse_error; it is
// still a ConfigError naming the file (found by fuzz/safetensors_fuzz, which reads the model config a
// safetensors file carries).
TEST(ModelConfig, FromFileRefusesANumberTooLargeForADouble) {
  test::ScratchDir dir("model");
  std::string path = dir.file("huge_number.json");
  std::ofstream(path) << R"({"vocab_size": 1e999})";
  try {
    ModelConfig::from_file(path);
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ": not valid JSON"), std::string::npos) << e.what();
  }
}

TEST(ModelConfig, DefaultsKvHeadsToHeads) {
  json j = ModelConfig::preset("tiny").to_json();
  j.erase("n_kv_heads");
  EXPECT_EQ(ModelConfig::from_json(j).n_kv_heads, j["n_heads"].get<int64_t>());
}

TEST(ModelConfig, UnknownKeyNamesTheNearestKnownKey) {
  json j = ModelConfig::preset("tiny").to_json();
  j["n_layer"] = 3;
  std::string m = error_of(j);
  EXPECT_NE(m.find("unknown key 'n_layer'"), std::string::npos) << m;
  EXPECT_NE(m.find("did you mean 'n_layers'"), std::string::npos) << m;
}

TEST(ModelConfig, InconsistentShapesAreRejectedNamingTheField) {
  json j = ModelConfig::preset("tiny").to_json();
  j["n_kv_heads"] = 3;
  EXPECT_NE(error_of(j).find("n_kv_heads 3 does not divide n_heads 4"), std::string::npos) << error_of(j);
  j = ModelConfig::preset("tiny").to_json();
  j["d_model"] = 30;
  EXPECT_NE(error_of(j).find("d_model 30 is not a multiple of n_heads 4"), std::string::npos) << error_of(j);
  j = ModelConfig::preset("tiny").to_json();
  j["d_model"] = 12;  // head_dim 3
  EXPECT_NE(error_of(j).find("is odd"), std::string::npos) << error_of(j);
  j = ModelConfig::preset("tiny").to_json();
  j.erase("ffn_dim");
  EXPECT_NE(error_of(j).find("missing required key 'ffn_dim' (or 'intermediate_size')"), std::string::npos);
  j = ModelConfig::preset("tiny").to_json();
  j["vocab_size"] = "256";
  EXPECT_NE(error_of(j).find("'vocab_size' is \"256\"; it must be an integer"), std::string::npos);
  j = ModelConfig::preset("tiny").to_json();
  j["hidden_size"] = 32;
  EXPECT_NE(error_of(j).find("both 'd_model' and its Hugging Face alias 'hidden_size'"), std::string::npos);
}

}  // namespace
}  // namespace strata::model
