// Sliding windows (Note [Sliding windows] in model/config.h) as the config reads them and the decoder runs
// them, beyond tests/model/reference_test.cpp (which runs mistral_window, qwen2_window and phi3_window
// against transformers): which layers each family windows and with what window, the keys written back as
// read (to_hf_json, to_json, an export's config.json), what is refused by name, and that a sequence longer
// than the window runs, the window changing the loss only once the sequence is longer than it.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/chunk.h"
#include "model/config.h"
#include "model/hf_dir.h"
#include "model/layout.h"
#include "model/llama.h"
#include "model/safetensors.h"
#include "tests/common/source_dir.h"
#include "tests/model/config_error.h"

namespace strata::model {
namespace {

using json = nlohmann::json;

json config_of(const std::string& dir) {
  std::ifstream in(strata::test::source_path("tests/reference/data/" + dir + "/config.json"));
  return json::parse(in);
}

std::vector<int64_t> windows(const ModelConfig& c) {
  std::vector<int64_t> w;
  for (int64_t l = 0; l < c.n_layers; ++l) w.push_back(c.window_of(l));
  return w;
}

void expect_round_trips(const ModelConfig& c) {
  EXPECT_EQ(ModelConfig::from_json(c.to_hf_json()), c);
  EXPECT_EQ(ModelConfig::from_json(c.to_json()), c);
  EXPECT_EQ(windows(ModelConfig::from_json(c.to_hf_json())), windows(c));
}

TEST(SlidingWindow, MistralAndPhi3WindowEveryLayer) {
  for (const char* dir : {"mistral_window", "phi3_window"}) {
    SCOPED_TRACE(dir);
    const ModelConfig c = ModelConfig::from_json(config_of(dir));
    EXPECT_EQ(c.sliding_window, 16);
    EXPECT_EQ(windows(c), (std::vector<int64_t>{16, 16}));
    EXPECT_EQ(c.to_hf_json()["sliding_window"], 16);
    expect_round_trips(c);
  }
  json none = config_of("mistral_window");
  none["sliding_window"] = nullptr;
  EXPECT_EQ(windows(ModelConfig::from_json(none)), (std::vector<int64_t>{0, 0}));
}

// transformers 5's Qwen2 config.json: use_sliding_window true, max_window_layers 1 and the layer_types it
// derived from them; written back as read.
TEST(SlidingWindow, Qwen2WindowsTheLayersItsConfigNames) {
  const json theirs = config_of("qwen2_window");
  const ModelConfig c = ModelConfig::from_json(theirs);
  EXPECT_TRUE(c.use_sliding_window);
  EXPECT_EQ(c.max_window_layers, 1);
  EXPECT_EQ(windows(c), (std::vector<int64_t>{0, 16}));
  const json ours = c.to_hf_json();
  for (const char* key : {"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"})
    EXPECT_EQ(ours[key], theirs[key]) << key;
  expect_round_trips(c);

  // Without layer_types (transformers 4's configs): the layers from max_window_layers on, and none written.
  json older = theirs;
  older.erase("layer_types");
  const ModelConfig o = ModelConfig::from_json(older);
  EXPECT_EQ(windows(o), (std::vector<int64_t>{0, 16}));
  EXPECT_FALSE(o.to_hf_json().contains("layer_types"));
  expect_round_trips(o);
  older["max_window_layers"] = 0;
  EXPECT_EQ(windows(ModelConfig::from_json(older)), (std::vector<int64_t>{16, 16}));
  older["max_window_layers"] = 28;  // transformers' default: past the last layer, so none
  EXPECT_EQ(windows(ModelConfig::from_json(older)), (std::vector<int64_t>{0, 0}));

  // layer_types, when given, decides over max_window_layers.
  json listed = theirs;
  listed["layer_types"] = {"sliding_attention", "full_attention"};
  const ModelConfig l = ModelConfig::from_json(listed);
  EXPECT_EQ(windows(l), (std::vector<int64_t>{16, 0}));
  expect_round_trips(l);

  // use_sliding_window false drops the window (Qwen2Config sets it to None), whatever the rest says.
  json off = older;
  off["use_sliding_window"] = false;
  off["max_window_layers"] = 0;
  const ModelConfig f = ModelConfig::from_json(off);
  EXPECT_EQ(f.sliding_window, 0);
  EXPECT_EQ(windows(f), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(f.to_hf_json()["sliding_window"], nullptr);
  expect_round_trips(f);
}

TEST(SlidingWindow, Qwen3ReadsTheSameKeys) {
  json j = config_of("qwen3");
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4;
  j["max_window_layers"] = 1;
  j.erase("layer_types");
  const ModelConfig c = ModelConfig::from_json(j);
  EXPECT_EQ(windows(c), (std::vector<int64_t>{0, 4}));
  expect_round_trips(c);
}

TEST(SlidingWindow, WhatTransformersCannotRunOrDoesNotReadIsRefusedByName) {
  const json qwen2 = config_of("qwen2_window");
  const auto refused = [](const json& j, const std::string& says) {
    const std::string m = config_error_of(j);
    EXPECT_NE(m.find(says), std::string::npos) << m;
  };
  json j = qwen2;
  j.erase("sliding_window");  // transformers would guess 4096
  refused(j, "'sliding_window' is not given");
  j = qwen2;
  j["layer_types"] = {"full_attention"};
  refused(j, "'layer_types'");
  j = qwen2;
  j["layer_types"] = {"full_attention", "chunked_attention"};
  refused(j, "'layer_types'");
  j = qwen2;
  j["use_sliding_window"] = false;  // sliding_attention layers and no window: no mask to build
  refused(j, "'layer_types'");
  j = qwen2;
  j["max_window_layers"] = -1;
  refused(j, "'max_window_layers'");
  json mistral = config_of("mistral_window");
  mistral["layer_types"] = {"full_attention", "sliding_attention"};  // MistralForCausalLM does not read it
  refused(mistral, "'layer_types'");
  mistral.erase("layer_types");
  mistral["use_sliding_window"] = true;
  refused(mistral, "'use_sliding_window'");
  mistral["use_sliding_window"] = false;
  mistral["layer_types"] = {"full_attention", "full_attention"};
  EXPECT_EQ(config_error_of(mistral), "(accepted)");
  // A config built in code is held to the same.
  ModelConfig c = ModelConfig::from_json(config_of("qwen2"));
  c.sliding_window = 8;  // use_sliding_window false
  EXPECT_THROW(c.validate(), ConfigError);
  c.use_sliding_window = true;
  EXPECT_NO_THROW(c.validate());
  c.sliding_layers = {true};
  EXPECT_THROW(c.validate(), ConfigError);
}

TEST(SlidingWindow, AnExportWritesTheWindowsBack) {
  const std::string dir = strata::test::source_path("tests/reference/data/qwen2_window");
  const HfModel hf = open_hf_model(dir);
  InMemoryChunks ch{ModelLayout(hf.config)};
  load_weights(hf.weights, ch);
  const std::string out = ::testing::TempDir() + "/sliding_window_export";
  std::filesystem::remove_all(out);
  save_pretrained(out, ch, DType::fp32, {.source_dir = dir});
  const json written = json::parse(std::ifstream(out + "/config.json")), theirs = config_of("qwen2_window");
  for (const char* key : {"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"})
    EXPECT_EQ(written[key], theirs[key]) << key;
}

// A sequence longer than the window runs (the window was once refused there). Up to the window's length the
// loss is plain causal attention's, bit for bit; past it the window changes it.
TEST(SlidingWindow, ASequenceLongerThanTheWindowRunsAndTheWindowActsPastIt) {
  const ModelConfig windowed = ModelConfig::from_json(config_of("mistral_window"));
  ModelConfig causal = windowed;
  causal.sliding_window = 0;
  std::vector<int32_t> in(64), tgt(64);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = int32_t(i * 7 % 128), tgt[i] = int32_t(i * 13 % 128);
  const auto loss = [&](const ModelConfig& c, int T) {
    InMemoryChunks ch{ModelLayout(c)};
    ch.init(5);  // the same weights for both configs: the window is no part of the shapes
    LlamaModel m(c);
    return m.forward(ch, in.data(), tgt.data(), 1, T);
  };
  EXPECT_EQ(loss(windowed, 16), loss(causal, 16));
  const float w = loss(windowed, 64), full = loss(causal, 64);
  EXPECT_TRUE(std::isfinite(w));
  EXPECT_NE(w, full);
}

}  // namespace
}  // namespace strata::model
