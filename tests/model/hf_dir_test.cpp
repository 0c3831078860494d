// Hugging Face model directories: the config.json forms transformers writes (GQA, head_dim, llama3 rope
// scaling in the older rope_scaling and the newer rope_parameters form), the settings refused by name,
// the llama3 inverse frequencies, and save_pretrained / open_hf_model / WeightsSource round trips,
// sharded and not.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numbers>
#include <vector>

#include "core/error.h"
#include "core/files.h"
#include "kernels/cpu/ops.h"
#include "model/hf_dir.h"
#include "model/layout.h"
#include "model/rope.h"
#include "model/safetensors.h"
#include "model_test_util.h"
#include "tests/model/config_error.h"

namespace strata::model {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// What transformers' LlamaConfig(...).save_pretrained writes for a small GQA model (the keys it writes,
// whether or not they matter here).
json hf_config() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"bos_token_id", 1},
          {"eos_token_id", 2},
          {"head_dim", 16},
          {"hidden_act", "silu"},
          {"hidden_size", 64},
          {"initializer_range", 0.02},
          {"intermediate_size", 96},
          {"max_position_embeddings", 128},
          {"mlp_bias", false},
          {"model_type", "llama"},
          {"num_attention_heads", 4},
          {"num_hidden_layers", 2},
          {"num_key_value_heads", 2},
          {"pretraining_tp", 1},
          {"rms_norm_eps", 1e-06},
          {"rope_scaling", nullptr},
          {"rope_theta", 500000.0},
          {"tie_word_embeddings", false},
          {"torch_dtype", "float32"},
          {"transformers_version", "4.57.1"},
          {"use_cache", true},
          {"vocab_size", 300}};
}

json llama3_scaling() {
  return {{"rope_type", "llama3"},
          {"factor", 8.0},
          {"low_freq_factor", 1.0},
          {"high_freq_factor", 4.0},
          {"original_max_position_embeddings", 64}};
}

std::string error_of(const json& j) {
  return config_error_of(j);
}

TEST(HfConfig, ReadsTransformersKeysWithGqaAndAnExplicitHeadDim) {
  json j = hf_config();
  j["head_dim"] = 32;  // wider than hidden_size / heads: q is 128 wide, k and v 64
  const ModelConfig c = ModelConfig::from_json(j);
  EXPECT_EQ(c.head_dim(), 32);
  EXPECT_EQ(c.q_dim(), 128);
  EXPECT_EQ(c.kv_dim(), 64);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_FLOAT_EQ(c.rope_theta, 500000.0f);
  EXPECT_TRUE(c.rope_scaling.is_default());
  EXPECT_EQ(ModelConfig::from_json(c.to_json()), c) << "our keys round-trip";
  EXPECT_EQ(ModelConfig::from_json(c.to_hf_json()), c) << "the exported config.json reads back";
}

TEST(HfConfig, Llama3ScalingReadsTheSameInTheOlderAndNewerForm) {
  json older = hf_config();
  older["rope_scaling"] = llama3_scaling();
  json newer = hf_config();
  newer.erase("rope_theta");
  newer.erase("rope_scaling");
  newer["rope_parameters"] = llama3_scaling();
  newer["rope_parameters"]["rope_theta"] = 500000.0;
  const ModelConfig a = ModelConfig::from_json(older), b = ModelConfig::from_json(newer);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.rope_scaling.type, "llama3");
  EXPECT_EQ(a.rope_scaling.factor, 8.0);
  EXPECT_EQ(a.rope_scaling.original_max_position_embeddings, 64);
  EXPECT_EQ(ModelConfig::from_json(a.to_hf_json()), a);
  json legacy = older;  // transformers before 4.43 wrote "type"
  legacy["rope_scaling"].erase("rope_type");
  legacy["rope_scaling"]["type"] = "llama3";
  EXPECT_EQ(ModelConfig::from_json(legacy), a);
}

TEST(HfConfig, SettingsThisDecoderDoesNotComputeAreRefusedByName) {
  const std::pair<const char*, json> cases[] = {
      {"mlp_bias", true},
      {"hidden_act", "gelu"},
      {"attention_dropout", 0.1},
      {"sliding_window", 4096},  // Llama has none
      {"num_local_experts", 8},
      {"model_type", "falcon"},
      {"partial_rotary_factor", 0.5},
      {"architectures", {"MistralForCausalLM"}},
      {"use_sliding_window", true},
      {"layer_types", {"full_attention", "sliding_attention"}},
      {"resid_pdrop", 0.1},
      {"final_logit_softcapping", 30.0},
      {"hidden_activation", "gelu"},
  };
  for (const auto& [key, value] : cases) {
    json j = hf_config();
    j[key] = value;
    const std::string m = error_of(j);
    EXPECT_NE(m.find(std::string("'") + key + "'"), std::string::npos) << key << ": " << m;
  }
  json dynamic = hf_config();
  dynamic["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 4.0}};
  EXPECT_NE(error_of(dynamic).find("rope_type \"dynamic\" is not implemented"), std::string::npos)
      << error_of(dynamic);
  json partial = hf_config();
  partial["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  EXPECT_NE(error_of(partial).find("low_freq_factor"), std::string::npos) << error_of(partial);
  json both = hf_config();
  both["rope_scaling"] = llama3_scaling();
  both["rope_parameters"] = llama3_scaling();
  EXPECT_NE(error_of(both).find("keep one"), std::string::npos) << error_of(both);
}

TEST(HfConfig, ThePlainLlamaValuesOfThoseKeysAreAccepted) {
  json j = hf_config();
  j["sliding_window"] = nullptr;
  j["use_sliding_window"] = false;
  j["dtype"] = "bfloat16";
  EXPECT_EQ(error_of(j), "(accepted)");
}

// Llama 3.1's frequency scaling, against the formula evaluated in double: high frequencies unchanged,
// low ones divided by the factor, the band between interpolated.
TEST(RopeInvFreq, Llama3ScalesLowFrequenciesAndKeepsHighOnes) {
  ModelConfig c = ModelConfig::preset("tiny");
  c.explicit_head_dim = 128;
  c.rope_theta = 500000.0f;
  c.rope_scaling.type = "llama3";
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 8192;
  const std::vector<float> f = rope_inv_freq(c, 64);
  ModelConfig plain = c;
  plain.rope_scaling = {};
  const std::vector<float> base = rope_inv_freq(plain, 64);
  ASSERT_EQ(f.size(), 64u);
  int low = 0, high = 0, medium = 0;
  for (std::size_t i = 0; i < f.size(); ++i) {
    const double inv = base[i], wavelen = 2 * std::numbers::pi / inv;
    double want;
    if (wavelen < 8192.0 / 4.0) {
      want = inv, ++high;
    } else if (wavelen > 8192.0 / 1.0) {
      want = inv / 8.0, ++low;
    } else {
      const double a = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      want = (1 - a) * inv / 8.0 + a * inv, ++medium;
    }
    EXPECT_NEAR(f[i], want, 1e-6 * want) << "i = " << i;
  }
  EXPECT_GT(low, 0);
  EXPECT_GT(high, 0);
  EXPECT_GT(medium, 0);
}

// A model directory written by save_pretrained is one transformers' layout: config.json, the weights,
// generation_config.json, the source's tokenizer files; it reads back bit for bit (fp32), through one file
// or through an index over shards.
class SavePretrained : public ::testing::TestWithParam<std::uint64_t> {};

TEST_P(SavePretrained, WritesADirectoryThatReadsBackBitForBit) {
  test::ScratchDir dir("hf");
  const std::string src = dir.file("src"), out = dir.file("out");
  fs::create_directories(src);
  json cfg = hf_config();
  std::ofstream(src + "/config.json") << cfg.dump(2);
  std::ofstream(src + "/tokenizer.json") << R"({"model": {"type": "BPE"}})";
  const ModelConfig mc = ModelConfig::from_json(cfg);
  InMemoryChunks ch{ModelLayout(mc)};
  ch.init(5);
  save_pretrained(out, ch, DType::fp32, {.max_shard_bytes = GetParam(), .source_dir = src});

  const bool sharded = GetParam() > 0;
  EXPECT_EQ(fs::exists(out + "/model.safetensors.index.json"), sharded);
  EXPECT_EQ(fs::exists(out + "/model.safetensors"), !sharded);
  EXPECT_TRUE(fs::exists(out + "/generation_config.json"));
  EXPECT_TRUE(fs::exists(out + "/tokenizer.json"));
  json written = json::parse(std::ifstream(out + "/config.json"));
  EXPECT_EQ(written["torch_dtype"], "float32");
  EXPECT_EQ(written["bos_token_id"], 1);
  EXPECT_EQ(written["num_key_value_heads"], 2);

  const HfModel m = open_hf_model(out);
  EXPECT_EQ(m.config.name, "out") << "a directory's model is named after it";
  ModelConfig named = mc;
  named.name = "out";
  EXPECT_EQ(m.config.to_json(), named.to_json());
  InMemoryChunks back{ModelLayout(m.config)};
  load_weights(m.weights, back);
  const std::size_t n = ch.layout().total_padded_numel();
  EXPECT_EQ(0, std::memcmp(back.all_params(), ch.all_params(), n * sizeof(float)));
  // Chunks read in any order give the same bytes.
  WeightsSource w(m.weights, back.layout());
  std::vector<float> buf(back.layout().chunk(1).padded_numel);
  w.read_chunk(1, buf.data());
  EXPECT_EQ(0, std::memcmp(buf.data(), ch.params(1), buf.size() * sizeof(float)));
  EXPECT_TRUE(w.unused().empty());
}

// 0: one file; 20 KB: several shards for the tiny model (each block's tensors are a few KB).
INSTANTIATE_TEST_SUITE_P(Sharding, SavePretrained, ::testing::Values(0u, 20000u));

// An export over an earlier one with another shard count leaves only its own weights: the earlier shards
// (and the single file, or the index) are gone, other files stay, and the directory reads back bit for bit.
TEST(HfDir, ReExportRemovesTheEarlierShards) {
  test::ScratchDir dir("hf");
  const std::string out = dir.file("out");
  const ModelConfig mc = ModelConfig::from_json(hf_config());
  InMemoryChunks ch{ModelLayout(mc)};
  ch.init(5);
  auto shards = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(out))
      if (e.path().extension() == ".safetensors") names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  save_pretrained(out, ch, DType::fp32, {.max_shard_bytes = 10000, .source_dir = ""});
  const std::size_t many = shards().size();
  ASSERT_GT(many, 3u);
  std::ofstream(out + "/model-00001-of-00001.safetensors.bak") << "kept";  // not a shard name
  std::ofstream(out + "/notes.txt") << "kept";
  save_pretrained(out, ch, DType::fp32, {.max_shard_bytes = 40000, .source_dir = ""});
  const std::vector<std::string> fewer = shards();
  ASSERT_GT(fewer.size(), 1u);
  ASSERT_LT(fewer.size(), many);
  const std::string of = "-of-" + std::string(5 - std::to_string(fewer.size()).size(), '0') +
                         std::to_string(fewer.size()) + ".safetensors";
  for (const std::string& name : fewer) EXPECT_TRUE(name.ends_with(of)) << name;
  EXPECT_TRUE(fs::exists(out + "/model-00001-of-00001.safetensors.bak"));
  EXPECT_TRUE(fs::exists(out + "/notes.txt"));
  save_pretrained(out, ch, DType::fp32, {});
  EXPECT_EQ(shards(), std::vector<std::string>{"model.safetensors"});
  EXPECT_FALSE(fs::exists(out + "/model.safetensors.index.json"));
  InMemoryChunks back{ModelLayout(open_hf_model(out).config)};
  load_weights(open_hf_model(out).weights, back);
  EXPECT_EQ(
      0, std::memcmp(back.all_params(), ch.all_params(), ch.layout().total_padded_numel() * sizeof(float)));
}

TEST(HfDir, AMissingTensorIsNamedWhenTheSourceOpens) {
  test::ScratchDir dir("hf");
  ModelConfig mc = ModelConfig::from_json(hf_config());
  InMemoryChunks ch{ModelLayout(mc)};
  ch.init(1);
  save_weights(dir.file("w.safetensors"), ch, DType::bf16);
  ModelConfig more_layers = mc;
  more_layers.n_layers = 3;
  try {
    WeightsSource w(dir.file("w.safetensors"), ModelLayout(more_layers));
    FAIL() << "a missing block was not noticed";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.2."), std::string::npos) << e.what();
  }
}

TEST(HfDir, ADirectoryWithoutWeightsOrConfigIsRefusedSayingWhatWasLookedFor) {
  test::ScratchDir dir("hf");
  try {
    open_hf_model(dir.path());
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no config.json"), std::string::npos) << e.what();
  }
  std::ofstream(dir.file("config.json")) << hf_config().dump();
  try {
    open_hf_model(dir.path());
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no model.safetensors"), std::string::npos) << e.what();
  }
}

// A message for a user: no check text ("file.cpp:204: `fd_ >= 0` failed") in it.
void expect_no_check_text(const std::string& m) {
  EXPECT_EQ(m.find("` failed"), std::string::npos) << m;
  EXPECT_EQ(m.find(".cpp:"), std::string::npos) << m;
}

// Where an export goes is checked before anything is loaded, and the refusal names what the user typed
// (`strata export`'s OUT_DIR here; `--export` is strata train's). The parent being a regular file makes
// the directory impossible to create even for root, so these cases hold under any user.
TEST(HfDir, AnOutputDirThatCannotBeMadeIsRefusedNamingWhatTheUserTyped) {
  test::ScratchDir dir("hf");
  std::ofstream(dir.file("file")) << "a regular file";
  const std::string under_file = dir.file("file/out");
  try {
    check_output_dir(under_file, "OUT_DIR");
    FAIL() << "made a directory under a regular file";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("OUT_DIR " + under_file + ": cannot create the directory", 0), 0u) << m;
    EXPECT_NE(m.find("choose a writable location"), std::string::npos) << m;
    EXPECT_EQ(m.find("--export"), std::string::npos) << m;
    expect_no_check_text(m);
  }
  try {
    check_output_dir(dir.file("file"), "OUT_DIR");
    FAIL() << "took a regular file for a directory";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("OUT_DIR " + dir.file("file") + " is a file", 0), 0u) << e.what();
  }
  EXPECT_NO_THROW(check_output_dir(dir.file("new/nested"), "OUT_DIR"));
  EXPECT_TRUE(fs::is_directory(dir.file("new/nested")));
  // save_pretrained, called without the check, names no option either.
  InMemoryChunks ch{ModelLayout(ModelConfig::from_json(hf_config()))};
  ch.init(1);
  try {
    save_pretrained(under_file, ch, DType::bf16);
    FAIL() << "exported under a regular file";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("model directory " + under_file + ": cannot create the directory", 0), 0u) << m;
    EXPECT_EQ(m.find("--export"), std::string::npos) << m;
    expect_no_check_text(m);
  }
}

TEST(HfDir, AReadOnlyOutputDirIsRefusedNamingWhatTheUserTyped) {
  test::ScratchDir dir("hf");
  const std::string ro = dir.file("read-only");
  fs::create_directories(ro);
  ASSERT_EQ(::chmod(ro.c_str(), 0555), 0);
  if (probe_writable(ro) == 0) {
    ::chmod(ro.c_str(), 0755);
    GTEST_SKIP() << "a read-only directory is writable here (root, or CAP_DAC_OVERRIDE); "
                    "AnOutputDirThatCannotBeMadeIsRefusedNamingWhatTheUserTyped covers the refusal";
  }
  for (const std::string& out : {ro, ro + "/sub"}) {
    try {
      check_output_dir(out, "OUT_DIR");
      FAIL() << out << " was taken as writable";
    } catch (const ConfigError& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.rfind("OUT_DIR " + out + ": ", 0), 0u) << m;
      EXPECT_NE(m.find("ermission denied"), std::string::npos) << m;
      expect_no_check_text(m);
    }
  }
  ::chmod(ro.c_str(), 0755);
}

// A sharded model directory with a shard gone (an interrupted download): opening it names the shard,
// the index and what to do.
TEST(HfDir, AMissingShardIsNamedWhenTheDirectoryOpens) {
  test::ScratchDir dir("hf");
  const std::string out = dir.file("model");
  InMemoryChunks ch{ModelLayout(ModelConfig::from_json(hf_config()))};
  ch.init(2);
  save_pretrained(out, ch, DType::bf16, {.max_shard_bytes = 20000, .source_dir = ""});
  const HfModel m = open_hf_model(out);
  ASSERT_TRUE(m.weights.ends_with("model.safetensors.index.json")) << m.weights;
  std::string gone;  // the second shard
  for (const fs::directory_entry& e : fs::directory_iterator(out))
    if (e.path().filename().string().starts_with("model-00002-of-")) gone = e.path().string();
  ASSERT_TRUE(fs::remove(gone)) << "no second shard in " << out;
  try {
    WeightsSource w(m.weights, ModelLayout(m.config));
    FAIL() << "a missing shard was not noticed";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(gone), std::string::npos) << msg;
    EXPECT_NE(msg.find(m.weights), std::string::npos) << msg;
    EXPECT_NE(msg.find("download the model again"), std::string::npos) << msg;
    expect_no_check_text(msg);
  }
}

}  // namespace
}  // namespace strata::model
