// LlamaModel's own contract: which calls it accepts in which order, and the inputs it refuses. (What it
// computes is checked in gradcheck_test, backend_test and training_test; its use of the chunk provider in
// chunk_test.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "model/chunk.h"
#include "model/llama.h"

namespace strata::model {
namespace {

// backward() consumes the logits of the forward before it, which must have had targets: without such a
// forward, or a second time after one, it throws. The refused calls leave nothing behind: the backward
// that is accepted gives the gradients of a model that never saw them, and the one refused after it adds
// nothing to them.
TEST(LlamaModel, BackwardNeedsAForwardWithTargetsEachTime) {
  const ModelConfig cfg = ModelConfig::preset("tiny");
  const std::vector<int32_t> in(8, 1), tgt(8, 2);
  InMemoryChunks want{ModelLayout(cfg)};
  want.init(1);
  want.zero_grads();
  LlamaModel fresh(cfg);
  const float want_loss = fresh.forward(want, in.data(), tgt.data(), 1, 8);
  fresh.backward(want);
  const std::size_t n = want.layout().total_padded_numel();
  const std::vector<float> want_grads(want.all_grads(), want.all_grads() + n);
  ASSERT_TRUE(std::any_of(want_grads.begin(), want_grads.end(), [](float g) { return g != 0.0f; }));

  InMemoryChunks ch{ModelLayout(cfg)};
  ch.init(1);
  ch.zero_grads();
  LlamaModel model(cfg);
  EXPECT_THROW(model.backward(ch), Error);
  model.forward(ch, in.data(), nullptr, 1, 8);
  EXPECT_THROW(model.backward(ch), Error);
  EXPECT_EQ(model.forward(ch, in.data(), tgt.data(), 1, 8), want_loss);
  model.backward(ch);
  EXPECT_EQ(std::memcmp(ch.all_grads(), want_grads.data(), n * sizeof(float)), 0);
  EXPECT_THROW(model.backward(ch), Error);  // the logits were consumed
  EXPECT_EQ(std::memcmp(ch.all_grads(), want_grads.data(), n * sizeof(float)), 0);
}

TEST(LlamaModel, RejectsSequencesLongerThanMaxSeqLen) {
  ModelConfig cfg = ModelConfig::preset("tiny");
  InMemoryChunks ch{ModelLayout(cfg)};
  LlamaModel model(cfg);
  std::vector<int32_t> in(size_t(cfg.max_seq_len) + 1, 1);
  EXPECT_THROW(model.forward(ch, in.data(), nullptr, 1, int(cfg.max_seq_len) + 1), ConfigError);
}

}  // namespace
}  // namespace strata::model
