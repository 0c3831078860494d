// The loss in row chunks (Note [The loss in row chunks] in model/llama.cpp): with the logits held a chunk of
// rows at a time, the loss and every gradient are the whole-logits ones within an fp32 rounding, the same
// bits whatever the threads, masked targets (-1) count nothing, and the planned activations stop growing
// with the vocabulary.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/device.h"
#include "kernels/cpu/ops.h"
#include "kernels/ops.h"
#include "model/chunk.h"
#include "model/llama.h"
#include "tests/model/grad_compare.h"

namespace strata::model {
namespace {

constexpr int B = 2, T = 32;

// The tiny preset, one forward and backward over B x T tokens, the logits held `rows` rows at a time
// (0: whole). Targets: random, with every fifth and a run of 20 longer than a chunk ignored (-1).
GradResult run(int rows, int threads = 2) {
  const ModelConfig cfg = ModelConfig::preset("tiny");
  LlamaModel::set_loss_chunk_elements(rows > 0 ? std::size_t(rows) * std::size_t(cfg.vocab_size)
                                               : std::size_t(1) << 40);
  kernels::cpu::set_blas_threads(threads);
  InMemoryChunks chunks{ModelLayout(cfg)};
  chunks.init(3);
  chunks.zero_grads();
  std::vector<std::int32_t> in(std::size_t(B) * T), tgt(in.size());
  std::mt19937 rng(7);
  for (std::size_t i = 0; i < in.size(); ++i) {
    in[i] = std::int32_t(rng() % std::uint32_t(cfg.vocab_size));
    tgt[i] = i % 5 == 4 || (i >= 30 && i < 50) ? -1 : std::int32_t(rng() % std::uint32_t(cfg.vocab_size));
  }
  LlamaModel m(cfg, {.checkpoint_activations = true});
  GradResult r;
  r.loss = m.forward(chunks, in.data(), tgt.data(), B, T);
  m.backward(chunks);
  const std::size_t n = chunks.layout().total_padded_numel();
  r.grads.assign(chunks.all_grads(), chunks.all_grads() + n);
  LlamaModel::set_loss_chunk_elements(0);
  kernels::cpu::set_blas_threads(2);
  return r;
}

TEST(ChunkedLoss, LossAndGradientsAreTheWholeLogitsOnesWithinRounding) {
  const GradResult whole = run(0);
  const ModelLayout layout(ModelConfig::preset("tiny"));
  for (int rows : {7, 13}) {  // 10 and 5 chunks, the last a partial one
    const GradResult chunked = run(rows);
    EXPECT_NEAR(chunked.loss, whole.loss, 1e-6 * whole.loss) << rows << " rows";
    for (const ChunkLayout& c : layout.chunks()) EXPECT_LT(grad_rel(chunked, whole, c), 1e-6) << c.name;
  }
}

TEST(ChunkedLoss, AChunkedRunIsTheSameBitsWhateverTheThreads) {
  const GradResult two = run(7, 2), one = run(7, 1), again = run(7, 2);
  EXPECT_EQ(two.loss, one.loss);
  EXPECT_EQ(std::memcmp(two.grads.data(), one.grads.data(), two.grads.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(two.grads.data(), again.grads.data(), two.grads.size() * sizeof(float)), 0);
}

// At 32768 tokens the planned activations of a 125m-shaped model are the same within 1% for a vocabulary
// of 32000 and of 152064: one chunk of logits, not N x V.
TEST(ChunkedLoss, PlannedActivationsDoNotGrowWithTheVocabulary) {
  std::unique_ptr<Device> dev = open_device({.backend = "host", .ordinal = 0, .memory_cap = 0});
  std::unique_ptr<Stream> s = dev->create_stream("plan");
  std::unique_ptr<kernels::Ops> ops = kernels::make_ops(*dev, *s, {.matmul = DType::bf16});
  ModelConfig small = ModelConfig::preset("125m");
  small.max_seq_len = 32768;
  ModelConfig large = small;
  large.vocab_size = 152064;
  const double a = double(LlamaModel::activation_bytes(small, 1, 32768, true, *ops));
  const double b = double(LlamaModel::activation_bytes(large, 1, 32768, true, *ops));
  EXPECT_LT(std::fabs(b - a) / a, 0.01) << a << " vs " << b << " bytes";
}

}  // namespace
}  // namespace strata::model
