// LoRA adapters (model/lora.h, Note [LoRA as PEFT computes it]) checked against the algebra they stand for:
// an adapted model equals its base with every adapted weight merged, W' = W + s B A, and the adapters'
// gradients are the merged weight's taken through that product: dA = s B^T dW', dB = s dW' A^T. For one
// model of each family (the reference directories' shapes, tests/reference/data), all in fp32 on the CPU ops.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/chunk.h"
#include "model/config.h"
#include "model/layout.h"
#include "model/llama.h"
#include "model/lora.h"
#include "tests/common/source_dir.h"

namespace strata::model {
namespace {

ModelConfig family_config(const std::string& name) {
  return ModelConfig::from_file(test::source_path("tests/reference/data/" + name + "/config.json"));
}

std::vector<int32_t> tokens(const ModelConfig& c, std::size_t n, uint32_t seed) {
  std::vector<int32_t> t(n);
  std::mt19937 rng(seed);
  for (int32_t& x : t) x = int32_t(rng() % c.vocab_size);
  return t;
}

ModelConfig with_lora(ModelConfig c, LoraTargets t, LoraShape s = {.r = 4, .alpha = 8}) {
  c.lora = resolve_lora(c, t, s, "test");
  return c;
}

// Every adapter tensor (A and B) drawn N(0, 0.1): B nonzero, so A's gradient is too.
void randomize_adapters(InMemoryChunks& ch, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.1f);
  for (const ChunkLayout& c : ch.layout().chunks()) {
    if (c.kind != ChunkKind::adapter) continue;
    for (const TensorSpec& t : c.tensors)
      for (std::size_t i = 0; i < t.numel; ++i) ch.params(c.id)[t.offset + i] = nd(rng);
  }
}

// The adapted chunks' parameters merged into a base model (fp32, the sum taken in double): W' = W + s B A.
void merge_into(const InMemoryChunks& lora, InMemoryChunks& base) {
  const ModelConfig& cfg = lora.layout().config();
  const ModelLayout& ll = lora.layout();
  for (const ChunkLayout& c : base.layout().chunks()) {
    // The base chunks of both layouts hold the same tensors by name; lm_head may sit in a chunk of its own.
    for (const TensorSpec& t : c.stored) {
      int id = -1;
      const TensorSpec* src = ll.find_hf(t.hf_name, &id);
      ASSERT_NE(src, nullptr) << t.hf_name;
      std::memcpy(base.params(c.id) + t.offset, lora.params(id) + src->offset, t.numel * sizeof(float));
    }
  }
  const float s = cfg.lora.scale();
  const int64_t R = cfg.lora.r;
  for (int l = 0; l < int(cfg.n_layers); ++l) {
    const int ad = ll.adapter_chunk(l);
    if (ad < 0) continue;
    const ChunkLayout& ac = ll.chunk(ad);
    for (int proj : {kWq, kWk, kWv, kWo, kWGate, kWUp, kWDown}) {
      int64_t row = 0;
      const int site = lora_site_of_projection(cfg, proj, &row);
      if (!ac.has(lora_a_index(site))) continue;
      const TensorSpec& w = base.layout().chunk(base.layout().block_chunk(l)).at(proj);
      const int64_t OC = w.shape[0], IC = w.shape[1];
      const float* A = lora.params(ad) + ac.at(lora_a_index(site)).offset;
      const float* B = lora.params(ad) + ac.at(lora_b_index(site)).offset + row * R;
      float* W = base.params(base.layout().block_chunk(l)) + w.offset;
      for (int64_t o = 0; o < OC; ++o)
        for (int64_t i = 0; i < IC; ++i) {
          double acc = 0;
          for (int64_t k = 0; k < R; ++k) acc += double(B[o * R + k]) * double(A[k * IC + i]);
          W[o * IC + i] = float(double(W[o * IC + i]) + double(s) * acc);
        }
    }
  }
}

double norm(const float* x, std::size_t n) {
  double s = 0;
  for (std::size_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
  return std::sqrt(s);
}

struct Case {
  std::string family;  // a tests/reference/data directory
  LoraTargets targets;
  LoraShape shape;
  std::string name;
  friend void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }
};

class LoraMerged : public ::testing::TestWithParam<Case> {};

TEST_P(LoraMerged, LossAndAdapterGradientsAreTheMergedModelsThroughTheProduct) {
  const ModelConfig base_cfg = family_config(GetParam().family);
  const ModelConfig cfg = with_lora(base_cfg, GetParam().targets, GetParam().shape);
  const int B = 2, T = 12;
  InMemoryChunks lora{ModelLayout(cfg)}, merged{ModelLayout(base_cfg)};
  lora.init(5);
  randomize_adapters(lora, 6);
  for (int id : lora.layout().frozen_chunks()) lora.freeze(id);
  merge_into(lora, merged);
  lora.zero_grads();
  merged.zero_grads();
  const std::vector<int32_t> in = tokens(cfg, std::size_t(B) * T, 1),
                             tgt = tokens(cfg, std::size_t(B) * T, 2);
  LlamaModel ml(cfg, {.checkpoint_activations = true}), mm(base_cfg, {.checkpoint_activations = false});
  const float l_lora = ml.forward(lora, in.data(), tgt.data(), B, T);
  const float l_merged = mm.forward(merged, in.data(), tgt.data(), B, T);
  EXPECT_NEAR(l_lora, l_merged, 2e-6 * std::abs(l_merged));
  ml.backward(lora);
  mm.backward(merged);

  const ModelLayout& ll = lora.layout();
  const float s = cfg.lora.scale();
  const int64_t R = cfg.lora.r;
  int checked = 0;
  for (int l = 0; l < int(cfg.n_layers); ++l) {
    const int ad = ll.adapter_chunk(l);
    if (ad < 0) continue;
    const ChunkLayout& ac = ll.chunk(ad);
    for (int site : lora_sites_of(cfg)) {
      if (!ac.has(lora_a_index(site))) continue;
      const int64_t IC = lora_site_in(cfg, site), OUT = lora_site_out(cfg, site);
      // dW' of the site: the merged projections' gradients stacked as the site's rows.
      std::vector<double> dW(std::size_t(OUT * IC));
      for (int proj : {kWq, kWk, kWv, kWo, kWGate, kWUp, kWDown}) {
        int64_t row = 0;
        if (lora_site_of_projection(cfg, proj, &row) != site) continue;
        const TensorSpec& w = merged.layout().chunk(merged.layout().block_chunk(l)).at(proj);
        const float* g = merged.grads(merged.layout().block_chunk(l)) + w.offset;
        for (std::size_t i = 0; i < w.numel; ++i) dW[std::size_t(row * IC) + i] = g[i];
      }
      const float* A = lora.params(ad) + ac.at(lora_a_index(site)).offset;
      const float* Bm = lora.params(ad) + ac.at(lora_b_index(site)).offset;
      const float* dA = lora.grads(ad) + ac.at(lora_a_index(site)).offset;
      const float* dB = lora.grads(ad) + ac.at(lora_b_index(site)).offset;
      std::vector<float> wantA(std::size_t(R * IC)), wantB(std::size_t(OUT * R));
      for (int64_t k = 0; k < R; ++k)
        for (int64_t i = 0; i < IC; ++i) {
          double acc = 0;
          for (int64_t o = 0; o < OUT; ++o) acc += double(Bm[o * R + k]) * dW[std::size_t(o * IC + i)];
          wantA[std::size_t(k * IC + i)] = float(s * acc);
        }
      for (int64_t o = 0; o < OUT; ++o)
        for (int64_t k = 0; k < R; ++k) {
          double acc = 0;
          for (int64_t i = 0; i < IC; ++i) acc += dW[std::size_t(o * IC + i)] * double(A[k * IC + i]);
          wantB[std::size_t(o * R + k)] = float(s * acc);
        }
      for (auto [got, want, what] : {std::tuple{dA, &wantA, "lora_A"}, std::tuple{dB, &wantB, "lora_B"}}) {
        const double ref = norm(want->data(), want->size());
        ASSERT_GT(ref, 0.0) << lora_module_path(l, site) << " " << what;
        double err = 0;
        for (std::size_t i = 0; i < want->size(); ++i)
          err = std::max(err, std::abs(double(got[i]) - double((*want)[i])));
        EXPECT_LT(err, 1e-4 * ref) << lora_module_path(l, site) << " " << what;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Families, LoraMerged,
    ::testing::Values(
        Case{"gqa_head_dim_untied", {.modules = {"all-linear"}}, {.r = 4, .alpha = 8}, "llama_all_linear"},
        Case{"qwen2",
             {.modules = {"q_proj", "v_proj", "down_proj"}},
             {.r = 4, .alpha = 16, .rslora = true},
             "qwen2_rslora"},
        Case{"qwen3", {.modules = {"all-linear"}}, {.r = 2, .alpha = 4}, "qwen3_all_linear"},
        Case{"phi3", {.modules = {"all-linear"}}, {.r = 4, .alpha = 8}, "phi3_fused"},
        Case{"gemma", {.modules = {"o_proj", "gate_proj"}}, {.r = 4, .alpha = 8}, "gemma_some"},
        Case{"mistral",
             {.modules = {"model.layers.1.self_attn.k_proj", "up_proj"}},
             {.r = 3, .alpha = 6},
             "mistral_paths"}),
    [](const auto& info) { return info.param.name; });

// PEFT's B starts at zero: the adapted model computes its base's loss exactly, and the saved lm_head's
// gradient is the full model's bit for bit.
TEST(Lora, UntrainedAdaptersLeaveTheBaseBitForBit) {
  const ModelConfig base_cfg = family_config("gqa_head_dim_untied");
  const ModelConfig cfg =
      with_lora(base_cfg, {.modules = {"all-linear"}, .modules_to_save = {"lm_head"}}, {.r = 4, .alpha = 8});
  const int B = 2, T = 12;
  InMemoryChunks lora{ModelLayout(cfg)}, base{ModelLayout(base_cfg)};
  lora.init(7);
  base.init(7);  // the base chunks' ids and seeds are the same in both layouts, except lm_head's
  const ModelLayout& ll = lora.layout();
  const TensorSpec& lm_base = base.layout().chunk(base.layout().head_chunk()).at(kLmHead);
  std::memcpy(lora.params(ll.lm_head_chunk()) + ll.chunk(ll.lm_head_chunk()).at(kLmHead).offset,
              base.params(base.layout().head_chunk()) + lm_base.offset, lm_base.numel * sizeof(float));
  for (int id : ll.frozen_chunks()) lora.freeze(id);
  lora.zero_grads();
  base.zero_grads();
  const std::vector<int32_t> in = tokens(cfg, std::size_t(B) * T, 3),
                             tgt = tokens(cfg, std::size_t(B) * T, 4);
  LlamaModel ml(cfg), mb(base_cfg);
  EXPECT_EQ(ml.forward(lora, in.data(), tgt.data(), B, T), mb.forward(base, in.data(), tgt.data(), B, T));
  ml.backward(lora);
  mb.backward(base);
  const float* g_lora = lora.grads(ll.lm_head_chunk()) + ll.chunk(ll.lm_head_chunk()).at(kLmHead).offset;
  const float* g_base = base.grads(base.layout().head_chunk()) + lm_base.offset;
  EXPECT_EQ(std::memcmp(g_lora, g_base, lm_base.numel * sizeof(float)), 0);
}

// With activation checkpointing the block (and its adapters) is recomputed: the same bits either way.
TEST(Lora, CheckpointingGivesTheSameGradientsBitForBit) {
  const ModelConfig cfg = with_lora(family_config("phi3"), {.modules = {"all-linear"}});
  InMemoryChunks a{ModelLayout(cfg)}, b{ModelLayout(cfg)};
  for (InMemoryChunks* c : {&a, &b}) {
    c->init(9);
    randomize_adapters(*c, 10);
    for (int id : c->layout().frozen_chunks()) c->freeze(id);
    c->zero_grads();
  }
  const std::vector<int32_t> in = tokens(cfg, 24, 5), tgt = tokens(cfg, 24, 6);
  LlamaModel ma(cfg, {.checkpoint_activations = true}), mb(cfg, {.checkpoint_activations = false});
  EXPECT_EQ(ma.forward(a, in.data(), tgt.data(), 2, 12), mb.forward(b, in.data(), tgt.data(), 2, 12));
  ma.backward(a);
  mb.backward(b);
  EXPECT_EQ(std::memcmp(a.all_grads(), b.all_grads(), a.layout().total_padded_numel() * sizeof(float)), 0);
}

TEST(Lora, LayoutAddsOneAdapterChunkPerAdaptedBlockAfterTheBase) {
  const ModelConfig base_cfg = family_config("mistral");
  const ModelConfig cfg = with_lora(base_cfg, {.modules = {"model.layers.1.self_attn.k_proj"}}, {.r = 8});
  const ModelLayout base(base_cfg), l(cfg);
  ASSERT_EQ(l.num_chunks(), base.num_chunks() + 1);
  EXPECT_EQ(l.adapter_chunk(0), -1);
  const ChunkLayout& c = l.chunk(l.adapter_chunk(1));
  EXPECT_EQ(c.id, base.num_chunks());
  ASSERT_EQ(c.stored.size(), 2u);
  EXPECT_EQ(c.stored[0].hf_name, "model.layers.1.self_attn.k_proj.lora_A.weight");
  EXPECT_EQ(c.stored[1].shape, (std::vector<int64_t>{base_cfg.kv_dim(), 8}));
  EXPECT_EQ(l.total_numel(), base.total_numel() + size_t(8 * (base_cfg.d_model + base_cfg.kv_dim())));
  EXPECT_EQ(l.frozen_chunks().size(), size_t(base.num_chunks()));
}

TEST(Lora, RefusesATargetTheFamilyDoesNotHaveNamingItsModules) {
  const ModelConfig cfg = family_config("phi3");
  try {
    resolve_lora(cfg, {.modules = {"q_proj"}}, {}, "strata.lora");
    FAIL() << "q_proj accepted for a fused family";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("qkv_proj"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("\"q_proj\""), std::string::npos) << e.what();
  }
}

TEST(Lora, RefusesRankBelowOneAndDropoutOutsideTheUnitInterval) {
  const ModelConfig cfg = family_config("mistral");
  EXPECT_THROW(resolve_lora(cfg, {.modules = {"all-linear"}}, {.r = 0}, "x"), ConfigError);
  EXPECT_THROW(resolve_lora(cfg, {.modules = {"all-linear"}}, {.r = 4, .dropout = 1.0}, "x"), ConfigError);
}

TEST(Lora, RefusesASavedModuleWithTiedEmbeddings) {
  const ModelConfig cfg = family_config("qwen2");  // tied
  ASSERT_TRUE(cfg.tie_embeddings);
  EXPECT_THROW(resolve_lora(cfg, {.modules = {"all-linear"}, .modules_to_save = {"lm_head"}}, {}, "x"),
               ConfigError);
}

TEST(Lora, ConfigJsonRoundTripsTheAdapters) {
  const ModelConfig cfg =
      with_lora(family_config("gemma"), {.modules = {"model.layers.0.mlp.down_proj", "q_proj"}}, {.r = 2});
  const ModelConfig back = ModelConfig::from_json(cfg.to_json(), "round trip");
  EXPECT_EQ(back, cfg);
  EXPECT_EQ(back.lora.sites, cfg.lora.sites);
  EXPECT_FALSE(cfg.to_hf_json().contains("lora"));
}

}  // namespace
}  // namespace strata::model
