// Frozen chunks (ChunkProvider::trains false, Note [Chunk protocol]): backward takes no gradient buffer for
// them and computes no gradient of their parameters, and everything else it computes is unchanged — the
// trained chunks' gradients are bit for bit those of a backward where every chunk trains.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/chunk.h"
#include "model/llama.h"

namespace strata::model {
namespace {

struct Frozen {
  const char* preset;
  bool tied;
  std::vector<int> chunks;  // frozen; -1 stands for the head chunk
  std::string name;
};

class FrozenTest : public ::testing::TestWithParam<Frozen> {};

std::vector<int32_t> tokens(const ModelConfig& c, std::size_t n, uint32_t seed) {
  std::vector<int32_t> t(n);
  std::mt19937 rng(seed);
  for (int32_t& x : t) x = int32_t(rng() % c.vocab_size);
  return t;
}

TEST_P(FrozenTest, TrainedChunksGetTheGradientsOfAFullBackwardAndFrozenOnesNone) {
  ModelConfig cfg = ModelConfig::preset(GetParam().preset);
  cfg.tie_embeddings = GetParam().tied;  // as the preset is, or tied for the plain one
  const int B = 2, T = 16;
  InMemoryChunks all{ModelLayout(cfg)}, some{ModelLayout(cfg)};
  all.init(3);
  some.init(3);
  std::vector<bool> frozen(std::size_t(some.layout().num_chunks()), false);
  for (int c : GetParam().chunks) {
    const int id = c < 0 ? some.layout().head_chunk() : c;
    some.freeze(id);
    frozen[std::size_t(id)] = true;
  }
  for (InMemoryChunks* p : {&all, &some}) {
    p->zero_grads();
    std::memset(p->all_grads(), 0x7f, p->layout().total_padded_numel() * sizeof(float));  // poison
    for (int c = 0; c < p->layout().num_chunks(); ++c)
      if (p->trains(c)) std::memset(p->grads(c), 0, p->layout().chunk(c).padded_numel * sizeof(float));
  }
  const std::vector<int32_t> in = tokens(cfg, std::size_t(B) * T, 1),
                             tgt = tokens(cfg, std::size_t(B) * T, 2);
  LlamaModel m_all(cfg, {.checkpoint_activations = true}), m_some(cfg, {.checkpoint_activations = true});
  const float l_all = m_all.forward(all, in.data(), tgt.data(), B, T);
  const float l_some = m_some.forward(some, in.data(), tgt.data(), B, T);
  EXPECT_EQ(l_all, l_some);
  m_all.backward(all);
  some.clear_calls();
  m_some.backward(some);

  for (const InMemoryChunks::Call& call : some.calls())
    if (call.op == InMemoryChunks::Op::acquire_grads) {
      EXPECT_FALSE(frozen[std::size_t(call.id)]) << "gradients of frozen chunk " << call.id << " taken";
    }
  for (int c = 0; c < some.layout().num_chunks(); ++c) {
    const std::size_t bytes = some.layout().chunk(c).padded_numel * sizeof(float);
    if (frozen[std::size_t(c)]) {
      std::vector<unsigned char> poison(bytes, 0x7f);
      EXPECT_EQ(std::memcmp(some.grads(c), poison.data(), bytes), 0) << "frozen chunk " << c << " written";
    } else {
      EXPECT_EQ(std::memcmp(some.grads(c), all.grads(c), bytes), 0)
          << "chunk " << some.layout().chunk(c).name << "'s gradients differ from the full backward's";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Chunks, FrozenTest,
                         // tiny: chunks 0 (embedding), 1 and 2 (blocks), 3 (head).
                         ::testing::Values(Frozen{"tiny", false, {1, 2}, "both_blocks"},
                                           Frozen{"tiny", false, {0, 1, -1}, "all_but_the_last_block"},
                                           Frozen{"tiny", true, {0}, "tied_embedding"},
                                           Frozen{"tiny", true, {-1}, "tied_head"},
                                           Frozen{"tiny-qwen2", true, {1}, "qwen2_block_with_biases"},
                                           Frozen{"tiny-qwen3", false, {2}, "qwen3_block_with_qk_norm"},
                                           Frozen{"tiny-gemma", true, {0, 2}, "gemma_embedding_and_block"}),
                         [](const ::testing::TestParamInfo<Frozen>& i) { return i.param.name; });

// Acquiring a frozen chunk's gradients is a protocol error of the provider's.
TEST(Frozen, TheInMemoryProviderRefusesAFrozenChunksGradients) {
  InMemoryChunks c{ModelLayout(ModelConfig::preset("tiny"))};
  c.freeze(1);
  EXPECT_FALSE(c.trains(1));
  EXPECT_TRUE(c.trains(0));
  EXPECT_THROW(c.acquire_grads(1), Error);
}

}  // namespace
}  // namespace strata::model
