// The MLP in tiles (Note [The MLP in tiles] in model/llama.cpp): with checkpointing and the MLP run over row
// tiles, the loss and every gradient are the untiled ones within an fp32 rounding — for SwiGLU, GeGLU
// (Gemma) and fused gate_up (Phi-3), with LoRA adapters on every linear layer — the same bits whatever the
// threads, and the planned activations shrink by the intermediates' rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/device.h"
#include "kernels/cpu/ops.h"
#include "kernels/ops.h"
#include "model/chunk.h"
#include "model/llama.h"
#include "model/lora.h"
#include "tests/common/source_dir.h"
#include "tests/model/grad_compare.h"

namespace strata::model {
namespace {

constexpr int B = 2, T = 32;

ModelConfig family(const std::string& name, bool lora) {
  ModelConfig c = ModelConfig::from_file(test::source_path("configs/models/" + name + ".json"));
  if (lora) c.lora = resolve_lora(c, {.modules = {"all-linear"}}, {.r = 4, .alpha = 8}, "test");
  return c;
}

// One checkpointed forward and backward, the MLP `rows` rows at a time (0: untiled).
GradResult run(const ModelConfig& cfg, int rows, int threads = 2) {
  LlamaModel::set_mlp_tile_elements(rows > 0 ? std::size_t(rows) * std::size_t(cfg.ffn_dim)
                                             : std::size_t(1) << 40);
  kernels::cpu::set_blas_threads(threads);
  InMemoryChunks chunks{ModelLayout(cfg)};
  chunks.init(3);
  if (cfg.lora.active())  // B away from zero, so that the adapters' products matter
    for (const ChunkLayout& c : chunks.layout().chunks())
      if (c.kind == ChunkKind::adapter)
        for (std::size_t i = 0; i < c.padded_numel; ++i) chunks.params(c.id)[i] += 0.01f * float(i % 7);
  chunks.zero_grads();
  std::vector<std::int32_t> in(std::size_t(B) * T), tgt(in.size());
  std::mt19937 rng(7);
  for (std::size_t i = 0; i < in.size(); ++i) {
    in[i] = std::int32_t(rng() % std::uint32_t(cfg.vocab_size));
    tgt[i] = std::int32_t(rng() % std::uint32_t(cfg.vocab_size));
  }
  LlamaModel m(cfg, {.checkpoint_activations = true});
  GradResult r;
  r.loss = m.forward(chunks, in.data(), tgt.data(), B, T);
  m.backward(chunks);
  r.grads.assign(chunks.all_grads(), chunks.all_grads() + chunks.layout().total_padded_numel());
  LlamaModel::set_mlp_tile_elements(0);
  kernels::cpu::set_blas_threads(2);
  return r;
}

struct Case {
  std::string family;
  bool lora;
};
class MlpTiles : public ::testing::TestWithParam<Case> {};

TEST_P(MlpTiles, LossAndGradientsAreTheUntiledOnesWithinRounding) {
  const ModelConfig cfg = family(GetParam().family, GetParam().lora);
  const GradResult whole = run(cfg, 0), tiled = run(cfg, 9);  // 8 tiles, the last a partial one
  EXPECT_NEAR(tiled.loss, whole.loss, 1e-6 * whole.loss);
  const ModelLayout layout(cfg);
  for (const ChunkLayout& c : layout.chunks()) EXPECT_LT(grad_rel(tiled, whole, c), 1e-5) << c.name;
}

INSTANTIATE_TEST_SUITE_P(Families, MlpTiles,
                         ::testing::Values(Case{"tiny", false}, Case{"tiny", true}, Case{"tiny-gemma", true},
                                           Case{"tiny-phi3", true}),
                         [](const auto& i) {
                           std::string n = i.param.family + (i.param.lora ? "_lora" : "");
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// The tiles are cut by the shape alone, never by the thread count: a tiled run is the same bits run after
// run, and at another thread count within what OpenBLAS's own blocking changes (Note [OpenBLAS determinism]
// in kernels/cpu/linear.cpp: its fp32 products differ in the last bits between 1 and 2 threads on some CPUs).
TEST(MlpTilesRun, IsTheSameBitsRunToRunAndWithinRoundingAtAnotherThreadCount) {
  const ModelConfig cfg = family("tiny", true);
  const GradResult two = run(cfg, 9, 2), again = run(cfg, 9, 2), one = run(cfg, 9, 1);
  EXPECT_EQ(two.loss, again.loss);
  EXPECT_EQ(std::memcmp(two.grads.data(), again.grads.data(), two.grads.size() * sizeof(float)), 0);
  EXPECT_NEAR(one.loss, two.loss, 1e-6 * two.loss);
  const ModelLayout layout(cfg);
  for (const ChunkLayout& c : layout.chunks()) EXPECT_LT(grad_rel(one, two, c), 1e-5) << c.name;
}

// At 32768 tokens a 125m-shaped model's planned activations lose the intermediates' untiled rows; LoRA
// dropout and no checkpointing leave the MLP whole.
TEST(MlpTilesPlan, TheIntermediatesAreHeldATileAtATime) {
  std::unique_ptr<Device> dev = open_device({.backend = "host", .ordinal = 0, .memory_cap = 0});
  std::unique_ptr<Stream> s = dev->create_stream("plan");
  std::unique_ptr<kernels::Ops> ops = kernels::make_ops(*dev, *s, {.matmul = DType::bf16});
  ModelConfig cfg = ModelConfig::preset("125m");
  cfg.max_seq_len = 32768;
  const std::size_t N = 32768, F = std::size_t(cfg.ffn_dim);
  const std::size_t M = LlamaModel::mlp_rows(cfg, N, true);
  EXPECT_LT(M, N);
  EXPECT_EQ(LlamaModel::mlp_rows(cfg, N, false), N);
  LlamaModel::set_mlp_tile_elements(std::size_t(1) << 40);
  const std::size_t whole = LlamaModel::activation_bytes(cfg, 1, int(N), true, *ops);
  LlamaModel::set_mlp_tile_elements(0);
  const std::size_t tiled = LlamaModel::activation_bytes(cfg, 1, int(N), true, *ops);
  // gate, up and h: three (N - M) x F bf16 intermediates fewer at least (the backward's dh too where the
  // MLP's phase was the larger of the backward scratch's two).
  EXPECT_GE(whole - tiled, 3 * (N - M) * F * 2);
  ModelConfig dropping = cfg;
  dropping.lora =
      resolve_lora(cfg, {.modules = {"all-linear"}}, {.r = 4, .alpha = 8, .dropout = 0.1}, "test");
  EXPECT_EQ(LlamaModel::mlp_rows(dropping, N, true), N);
}

}  // namespace
}  // namespace strata::model
