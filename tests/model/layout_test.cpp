// Chunk layout: every tensor placed once, aligned, inside its padded chunk, under its Hugging Face name.
#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "model/layout.h"

namespace strata::model {
namespace {

struct LayoutCase {
  const char* preset;
  bool tied;
  LayoutOptions opts;
};

class LayoutTest : public ::testing::TestWithParam<LayoutCase> {
 protected:
  ModelConfig cfg() const {
    ModelConfig c = ModelConfig::preset(GetParam().preset);
    c.tie_embeddings = GetParam().tied;
    return c;
  }
};

TEST_P(LayoutTest, TensorsAreAlignedDisjointAndInsideTheirPaddedChunk) {
  ModelLayout layout(cfg(), GetParam().opts);
  const LayoutOptions& o = GetParam().opts;
  size_t flat = 0;
  for (const ChunkLayout& c : layout.chunks()) {
    EXPECT_EQ(c.flat_offset, flat) << c.name;
    EXPECT_EQ(c.padded_numel % o.chunk_multiple, 0u) << c.name;
    size_t end = 0, sum = 0;
    for (const TensorSpec& t : c.tensors) {
      EXPECT_EQ(t.offset % o.tensor_align, 0u) << t.hf_name;
      EXPECT_GE(t.offset, end) << t.hf_name << " overlaps the tensor before it";
      end = t.offset + t.numel;
      sum += t.numel;
    }
    EXPECT_LE(end, c.padded_numel) << c.name;
    EXPECT_EQ(sum, c.numel) << c.name;
    flat += c.padded_numel;
  }
  EXPECT_EQ(flat, layout.total_padded_numel());
  EXPECT_EQ(layout.total_numel(), size_t(cfg().num_parameters()));
}

TEST_P(LayoutTest, ChunksFollowForwardOrderWithHuggingFaceNames) {
  ModelLayout layout(cfg(), GetParam().opts);
  const int L = int(cfg().n_layers);
  ASSERT_EQ(layout.num_chunks(), L + 2);
  EXPECT_EQ(layout.chunk(0).kind, ChunkKind::embedding);
  EXPECT_EQ(layout.chunk(0).tensors[kTokEmbeddings].hf_name, "model.embed_tokens.weight");
  for (int l = 0; l < L; ++l) {
    const ChunkLayout& b = layout.chunk(layout.block_chunk(l));
    EXPECT_EQ(b.kind, ChunkKind::block);
    EXPECT_EQ(b.layer, l);
    ASSERT_EQ(b.tensors.size(), size_t(kWDown) + 1);  // a Llama block: none of the families' extras
    EXPECT_FALSE(b.has(kBq) || b.has(kBo) || b.has(kQNorm));
    const std::string p = "model.layers." + std::to_string(l) + ".";
    EXPECT_EQ(b.tensors[kWq].hf_name, p + "self_attn.q_proj.weight");
    EXPECT_EQ(b.tensors[kWk].hf_name, p + "self_attn.k_proj.weight");
    EXPECT_EQ(b.tensors[kWv].hf_name, p + "self_attn.v_proj.weight");
    EXPECT_EQ(b.tensors[kWo].hf_name, p + "self_attn.o_proj.weight");
    EXPECT_EQ(b.tensors[kWGate].hf_name, p + "mlp.gate_proj.weight");
    EXPECT_EQ(b.tensors[kWUp].hf_name, p + "mlp.up_proj.weight");
    EXPECT_EQ(b.tensors[kWDown].hf_name, p + "mlp.down_proj.weight");
    EXPECT_EQ(b.tensors[kAttnNorm].hf_name, p + "input_layernorm.weight");
    EXPECT_EQ(b.tensors[kFfnNorm].hf_name, p + "post_attention_layernorm.weight");
    EXPECT_EQ(b.tensors[kWk].shape, (std::vector<int64_t>{cfg().kv_dim(), cfg().d_model}));
    EXPECT_EQ(b.tensors[kWDown].shape, (std::vector<int64_t>{cfg().d_model, cfg().ffn_dim}));
  }
  const ChunkLayout& h = layout.chunk(layout.head_chunk());
  EXPECT_EQ(h.kind, ChunkKind::head);
  EXPECT_EQ(h.tensors[kFinalNorm].hf_name, "model.norm.weight");
  if (GetParam().tied) {
    EXPECT_EQ(h.tensors.size(), 1u);
    EXPECT_EQ(layout.find_hf("lm_head.weight"), nullptr);
  } else {
    ASSERT_EQ(h.tensors.size(), 2u);
    EXPECT_EQ(h.tensors[kLmHead].hf_name, "lm_head.weight");
  }
}

TEST_P(LayoutTest, FindHfReturnsTheTensorAndItsChunk) {
  ModelLayout layout(cfg(), GetParam().opts);
  std::set<std::string> names;
  for (const ChunkLayout& c : layout.chunks())
    for (const TensorSpec& t : c.stored) {
      EXPECT_TRUE(names.insert(t.hf_name).second) << t.hf_name << " appears twice";
      int chunk = -1;
      EXPECT_EQ(layout.find_hf(t.hf_name, &chunk), &t);
      EXPECT_EQ(chunk, c.id);
    }
  EXPECT_EQ(layout.find_hf("model.layers.999.mlp.up_proj.weight"), nullptr);
}

INSTANTIATE_TEST_SUITE_P(
    Presets, LayoutTest,
    ::testing::Values(LayoutCase{"tiny", false, {}}, LayoutCase{"tiny", true, {1, 1}},
                      LayoutCase{"tiny", false, {32, 4 * 512}}, LayoutCase{"llama2-7b", false, {16, 8 * 256}},
                      LayoutCase{"1b", true, {64, 64}}),
    [](const auto& info) {
      return std::string(info.param.preset == std::string("llama2-7b") ? "llama2_7b" : info.param.preset) +
             (info.param.tied ? "_tied" : "") + "_align" + std::to_string(info.param.opts.tensor_align) +
             "_mult" + std::to_string(info.param.opts.chunk_multiple);
    });

TEST(ChunkLayout, UnknownTensorNameListsTheChunksTensors) {
  ModelLayout layout(ModelConfig::preset("tiny"));
  try {
    layout.chunk(1).tensor("wqq");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attn_norm, wq, wk"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata::model
