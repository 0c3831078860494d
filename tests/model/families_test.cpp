// The model families (Note [Model families] in model/config.h) beyond what tests/model/reference_test.cpp
// checks against transformers: config.json as transformers 5 writes it read back and written again as the
// same class, what each family lays out and initialises, the settings no family computes refused by name,
// and an export of every family read back to the same weights and the same loss. Sliding windows:
// sliding_window_test.cpp.
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
#include "model_test_util.h"
#include "tests/common/source_dir.h"
#include "tests/model/config_error.h"

namespace strata::model {
namespace {

using json = nlohmann::json;

const std::vector<std::string> kFamilyDirs = {"mistral", "qwen2", "qwen3", "phi3", "gemma"};

json config_of(const std::string& family) {
  std::ifstream in(strata::test::source_path("tests/reference/data/" + family + "/config.json"));
  return json::parse(in);
}

std::string error_of(const json& j) {
  return config_error_of(j);
}

ModelConfig small(const std::string& family) {
  ModelConfig c = ModelConfig::preset("tiny");
  c.family = family;
  if (family == "gemma") c.tie_embeddings = true;
  return c;
}

class Families : public ::testing::TestWithParam<std::string> {};

TEST_P(Families, TransformersConfigReadsAndWritesBackAsTheSameClass) {
  const json theirs = config_of(GetParam());
  const ModelConfig c = ModelConfig::from_json(theirs, GetParam());
  EXPECT_EQ(c.family, GetParam());
  const json ours = c.to_hf_json();
  EXPECT_EQ(ours["architectures"], theirs["architectures"]);
  EXPECT_EQ(ours["model_type"], theirs["model_type"]);
  EXPECT_EQ(ModelConfig::from_json(ours), c);
  EXPECT_EQ(ModelConfig::from_json(c.to_json()), c);
  // Every tensor transformers saved is one the layout stores, and the counts agree.
  const SafetensorsReader w(
      strata::test::source_path("tests/reference/data/" + GetParam() + "/model.safetensors"));
  const ModelLayout layout(c);
  std::size_t stored = 0, numel = 0;
  for (const ChunkLayout& ch : layout.chunks()) stored += ch.stored.size();
  for (const SafetensorsEntry& e : w.entries()) {
    const TensorSpec* t = layout.find_hf(e.name);
    ASSERT_NE(t, nullptr) << e.name;
    EXPECT_EQ(t->shape, e.shape) << e.name;
    numel += t->numel;
  }
  EXPECT_EQ(stored, w.entries().size());
  EXPECT_EQ(numel, std::size_t(c.num_parameters()));
}

TEST_P(Families, ExportReadsBackToTheSameWeightsAndLoss) {
  const std::string dir = strata::test::source_path("tests/reference/data/" + GetParam());
  const HfModel hf = open_hf_model(dir);
  InMemoryChunks src{ModelLayout(hf.config)};
  load_weights(hf.weights, src);
  const std::string out = ::testing::TempDir() + "/family_export_" + GetParam();
  std::filesystem::remove_all(out);
  save_pretrained(out, src, DType::fp32, {.source_dir = dir});
  const json written = json::parse(std::ifstream(out + "/config.json"));
  EXPECT_EQ(written["architectures"], config_of(GetParam())["architectures"]);
  const HfModel back = open_hf_model(out);
  json got = back.config.to_json(), want = hf.config.to_json();
  got.erase("name"), want.erase("name");  // the directory's name
  EXPECT_EQ(got, want);
  InMemoryChunks dst{ModelLayout(hf.config)};
  load_weights(back.weights, dst);
  for (const ChunkLayout& c : src.layout().chunks())
    for (std::size_t i = 0; i < c.padded_numel; ++i)
      ASSERT_EQ(src.params(c.id)[i], dst.params(c.id)[i]) << c.name << " element " << i;
  std::vector<int32_t> in(48), tgt(48);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = int32_t(i * 7 % 256), tgt[i] = int32_t(i * 13 % 256);
  LlamaModel a(hf.config), b(hf.config);
  EXPECT_EQ(a.forward(src, in.data(), tgt.data(), 2, 24), b.forward(dst, in.data(), tgt.data(), 2, 24));
}

TEST_P(Families, FreshWeightsStartAsTransformersInitialisesNormsAndBiases) {
  ModelConfig c = small(GetParam());
  InMemoryChunks ch{ModelLayout(c)};
  ch.init(7);
  const ChunkLayout& b = ch.layout().chunk(ch.layout().block_chunk(0));
  const float norm_one = GetParam() == "gemma" ? 0.0f : 1.0f;  // Gemma scales by 1 + w
  EXPECT_EQ(ch.params(b.id)[b.at(kAttnNorm).offset], norm_one);
  if (b.has(kBq)) {
    EXPECT_EQ(ch.params(b.id)[b.at(kBq).offset], 0.0f);
  }
  if (b.has(kQNorm)) {
    EXPECT_EQ(ch.params(b.id)[b.at(kQNorm).offset], 1.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(Transformers5, Families, ::testing::ValuesIn(kFamilyDirs),
                         [](const auto& info) { return info.param; });

TEST(Families, WhatEachFamilyAddsToABlock) {
  const ModelConfig qwen2 = small("qwen2"), qwen3 = small("qwen3"), llama = small("llama");
  const ModelLayout l2(qwen2), l3(qwen3);
  const ChunkLayout& b2 = l2.chunk(1);
  EXPECT_TRUE(b2.has(kBq) && b2.has(kBk) && b2.has(kBv));
  EXPECT_FALSE(b2.has(kBo) || b2.has(kQNorm));
  const ChunkLayout& b3 = l3.chunk(1);
  EXPECT_TRUE(b3.has(kQNorm) && b3.has(kKNorm));
  EXPECT_EQ(b3.at(kQNorm).shape, (std::vector<int64_t>{qwen3.head_dim()}));
  EXPECT_FALSE(b3.has(kBq));
  ModelConfig biased = qwen3;
  biased.attention_bias = true;
  EXPECT_TRUE(ModelLayout(biased).chunk(1).has(kBo));
  EXPECT_EQ(qwen2.num_parameters(),
            llama.num_parameters() + llama.n_layers * (llama.q_dim() + 2 * llama.kv_dim()));
  EXPECT_EQ(qwen3.num_parameters(), llama.num_parameters() + llama.n_layers * 2 * llama.head_dim());
}

TEST(Families, PhiThreeStoresItsProjectionsFusedOverContiguousParts) {
  const ModelConfig c = small("phi3");
  const ModelLayout layout(c);
  const ChunkLayout& b = layout.chunk(1);
  const TensorSpec* qkv = layout.find_hf("model.layers.0.self_attn.qkv_proj.weight");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->shape, (std::vector<int64_t>{c.q_dim() + 2 * c.kv_dim(), c.d_model}));
  EXPECT_EQ(qkv->offset, b.at(kWq).offset);
  EXPECT_EQ(b.at(kWk).offset, b.at(kWq).offset + b.at(kWq).numel);
  EXPECT_EQ(b.at(kWv).offset, b.at(kWk).offset + b.at(kWk).numel);
  const TensorSpec* gate_up = layout.find_hf("model.layers.0.mlp.gate_up_proj.weight");
  ASSERT_NE(gate_up, nullptr);
  EXPECT_EQ(gate_up->shape, (std::vector<int64_t>{2 * c.ffn_dim, c.d_model}));
  EXPECT_EQ(b.at(kWUp).offset, b.at(kWGate).offset + b.at(kWGate).numel);
  EXPECT_EQ(layout.find_hf("model.layers.0.self_attn.q_proj.weight"), nullptr);
}

// Phi-3's longrope as its 128k checkpoints write it (top-level original_max_position_embeddings, the older
// "su" name), written back and read again to the same config; the attention factor is transformers' default.
TEST(Families, PhiThreeLongropeReadsAsTransformersDoes) {
  json j = config_of("phi3");
  j.erase("rope_parameters");
  j["max_position_embeddings"] = 64;
  j["original_max_position_embeddings"] = 16;
  const std::vector<double> s = {1, 1, 1, 1, 2, 2, 2, 2}, l = {1, 2, 3, 4, 5, 6, 7, 8};
  j["rope_scaling"] = {{"type", "su"}, {"short_factor", s}, {"long_factor", l}};
  const ModelConfig c = ModelConfig::from_json(j);
  EXPECT_EQ(c.rope_scaling.type, "longrope");
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 16);
  EXPECT_DOUBLE_EQ(c.rope_scaling.attention_factor, std::sqrt(1 + std::log(4.0) / std::log(16.0)));
  EXPECT_EQ(ModelConfig::from_json(c.to_hf_json()), c);
  EXPECT_EQ(ModelConfig::from_json(c.to_json()), c);
  j["rope_scaling"]["long_factor"] = {1.0};
  EXPECT_NE(error_of(j).find("long_factor holds 1 factors"), std::string::npos) << error_of(j);
}

TEST(Families, SettingsNoFamilyComputesAreRefusedByName) {
  const std::pair<const char*, std::pair<const char*, json>> cases[] = {
      {"phi3", {"rope_scaling", {{"type", "longrope"}, {"short_factor", {1.0}}, {"long_factor", {1.0}}}}},
      {"mistral", {"rope_scaling", {{"type", "dynamic"}, {"factor", 4.0}}}},
      {"phi3", {"partial_rotary_factor", 0.75}},
      {"phi3", {"embd_pdrop", 0.1}},
      {"mistral", {"use_sliding_window", true}},
      {"qwen3", {"layer_types", {"sliding_attention", "full_attention"}}},  // and no window
      {"gemma", {"hidden_activation", "relu"}},
      {"gemma", {"final_logit_softcapping", 30.0}},
      {"gemma", {"use_bidirectional_attention", true}},
      {"mistral", {"num_local_experts", 8}},
  };
  for (const auto& [family, kv] : cases) {
    json j = config_of(family);
    if (std::string(kv.first) == "rope_scaling") j.erase("rope_parameters");  // one of the two forms
    j[kv.first] = kv.second;
    const std::string m = error_of(j);
    const std::string want =
        std::string(kv.first) == "rope_scaling" ? "longrope" : std::string("'") + kv.first + "'";
    EXPECT_NE(m.find(want), std::string::npos) << family << " " << kv.first << ": " << m;
  }
  json gemma = config_of("gemma");
  gemma["hidden_act"] = "gelu";  // older Gemma configs: transformers reads it as the tanh approximation
  gemma["hidden_activation"] = "gelu_pytorch_tanh";
  EXPECT_EQ(error_of(gemma), "(accepted)");
}

}  // namespace
}  // namespace strata::model
