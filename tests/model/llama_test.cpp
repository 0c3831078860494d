// LlamaModel's own contract: which calls it accepts in which order, and the inputs it refuses. (What it
// computes is checked in gradcheck_test, backend_test and training_test; its use of the chunk provider in
// chunk_test; here, that it hands back what it holds when the provider fails, and refuses a provider for
// another config.)
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

// A provider whose n-th acquire fails: the model must release what it holds before the error escapes.
class FailingChunks final : public ChunkProvider {
 public:
  explicit FailingChunks(InMemoryChunks& inner, int fail_at) : inner_(inner), fail_at_(fail_at) {}
  const ModelLayout& layout() const override { return inner_.layout(); }
  ChunkView acquire(int id) override {
    if (++acquires_ == fail_at_) throw IoError("prefetch of chunk failed");
    return inner_.acquire(id);
  }
  void release(int id) override { inner_.release(id); }
  float* acquire_grads(int id) override { return inner_.acquire_grads(id); }
  void release_grads(int id) override { inner_.release_grads(id); }

 private:
  InMemoryChunks& inner_;
  int fail_at_;
  int acquires_ = 0;
};

TEST(LlamaModel, AFailedAcquireLeavesNoChunkHeld) {
  ModelConfig cfg = ModelConfig::preset("tiny");
  cfg.tie_embeddings = true;
  InMemoryChunks ch{ModelLayout(cfg)};
  ch.init(1);
  // Acquires: embedding, L blocks, head, then the embedding again for the tied head: fail that one, while
  // the head is held.
  FailingChunks failing(ch, /*fail_at=*/int(cfg.n_layers) + 3);
  LlamaModel model(cfg);
  std::vector<int32_t> in(8, 1), tgt(8, 2);
  EXPECT_THROW(model.forward(failing, in.data(), tgt.data(), 1, 8), IoError);
  // Every acquire that succeeded was released: the provider's log balances for every chunk.
  std::vector<int> held(size_t(ch.layout().num_chunks()), 0), grads_held(held.size(), 0);
  for (const InMemoryChunks::Call& c : ch.calls()) {
    if (c.op == InMemoryChunks::Op::acquire) ++held[size_t(c.id)];
    if (c.op == InMemoryChunks::Op::release) --held[size_t(c.id)];
    if (c.op == InMemoryChunks::Op::acquire_grads) ++grads_held[size_t(c.id)];
    if (c.op == InMemoryChunks::Op::release_grads) --grads_held[size_t(c.id)];
  }
  EXPECT_FALSE(ch.calls().empty());
  EXPECT_EQ(held, std::vector<int>(held.size(), 0));
  EXPECT_EQ(grads_held, std::vector<int>(held.size(), 0));
}

TEST(LlamaModel, RejectsAProviderForAnotherConfig) {
  InMemoryChunks ch{ModelLayout(ModelConfig::preset("tiny"))};
  ModelConfig other = ModelConfig::preset("tiny");
  other.ffn_dim = 96;
  LlamaModel model(other);
  std::vector<int32_t> in(8, 1);
  EXPECT_THROW(model.forward(ch, in.data(), nullptr, 1, 8), Error);
}

}  // namespace
}  // namespace strata::model
