// The chunk interface: initialisation, the in-memory provider's protocol checks, and the order in which
// the model acquires, releases and hands back chunks.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "model/chunk.h"
#include "model/llama.h"

namespace strata::model {
namespace {

using Op = InMemoryChunks::Op;
using Call = InMemoryChunks::Call;

TEST(InitChunk, ValuesDependOnlyOnSeedChunkTensorAndIndex) {
  ModelConfig cfg = ModelConfig::preset("tiny");
  ModelLayout a(cfg, {1, 1}), b(cfg, {64, 1024});
  for (int c = 0; c < a.num_chunks(); ++c) {
    std::vector<float> da(a.chunk(c).padded_numel), db(b.chunk(c).padded_numel);
    init_chunk(a, c, 7, da.data());
    init_chunk(b, c, 7, db.data());
    for (size_t t = 0; t < a.chunk(c).tensors.size(); ++t) {
      const TensorSpec& ta = a.chunk(c).tensors[t];
      const TensorSpec& tb = b.chunk(c).tensors[t];
      for (size_t i = 0; i < ta.numel; ++i)
        ASSERT_EQ(da[ta.offset + i], db[tb.offset + i]) << ta.hf_name << "[" << i << "]";
    }
  }
}

TEST(InitChunk, NormsAreOneMatricesHaveTheirScaleAndPaddingIsZero) {
  ModelConfig cfg = ModelConfig::preset("tiny");
  ModelLayout layout(cfg, {16, 256});
  for (const ChunkLayout& c : layout.chunks()) {
    std::vector<float> d(c.padded_numel, 123.0f);
    init_chunk(layout, c.id, 3, d.data());
    std::vector<bool> inside(c.padded_numel, false);
    for (size_t t = 0; t < c.tensors.size(); ++t) {
      const TensorSpec& s = c.tensors[t];
      double sum = 0, sq = 0;
      for (size_t i = 0; i < s.numel; ++i) {
        inside[s.offset + i] = true;
        sum += d[s.offset + i];
        sq += double(d[s.offset + i]) * d[s.offset + i];
      }
      if (s.shape.size() == 1) {
        EXPECT_EQ(sum, double(s.numel)) << s.hf_name;
        continue;
      }
      bool resid = c.kind == ChunkKind::block && (int(t) == kWo || int(t) == kWDown);
      double want = resid ? 0.02 / std::sqrt(2.0 * cfg.n_layers) : 0.02;
      double mean = sum / double(s.numel), sd = std::sqrt(sq / double(s.numel) - mean * mean);
      EXPECT_NEAR(sd, want, 0.1 * want) << s.hf_name;
      EXPECT_NEAR(mean, 0.0, 5 * want / std::sqrt(double(s.numel))) << s.hf_name;
    }
    for (size_t i = 0; i < c.padded_numel; ++i)
      if (!inside[i]) {
        ASSERT_EQ(d[i], 0.0f) << c.name << " padding element " << i;
      }
  }
}

TEST(InMemoryChunks, MisuseOfTheProtocolThrowsNamingTheChunk) {
  InMemoryChunks ch{ModelLayout(ModelConfig::preset("tiny"))};
  ch.acquire(1);
  EXPECT_THROW(ch.acquire(1), Error);
  ch.release(1);
  EXPECT_THROW(ch.release(1), Error);
  EXPECT_THROW(ch.release_grads(2), Error);
  ch.acquire_grads(2);
  try {
    ch.acquire_grads(2);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("block.1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ch.acquire(99), Error);
}

// Evaluation and export only read parameters: the gradients are not allocated until first taken, and then
// start at zero.
TEST(InMemoryChunks, GradientsAreMadeOnFirstUse) {
  InMemoryChunks ch{ModelLayout(ModelConfig::preset("tiny"))};
  ch.init(3);
  const std::size_t params = ch.layout().total_padded_numel() * sizeof(float);
  std::vector<float> out(ch.layout().chunk(1).padded_numel);
  ch.read_params(1, out.data());
  ch.zero_grads();
  EXPECT_EQ(ch.host_bytes(), params);
  const float* g = ch.acquire_grads(2);
  EXPECT_EQ(ch.host_bytes(), 2 * params);
  for (std::size_t i = 0; i < ch.layout().chunk(2).padded_numel; ++i) ASSERT_EQ(g[i], 0.0f) << i;
  ch.release_grads(2);
}

// The sequence of provider calls one forward + backward makes.
std::vector<Call> expected_calls(const ModelConfig& cfg) {
  const int L = int(cfg.n_layers), E = 0, H = L + 1;
  std::vector<Call> c;
  auto pair = [&](int id) {
    c.push_back({Op::acquire, id});
    c.push_back({Op::release, id});
  };
  pair(E);
  for (int l = 0; l < L; ++l) pair(1 + l);
  c.push_back({Op::acquire, H});
  if (cfg.tie_embeddings) pair(E);
  c.push_back({Op::release, H});
  // backward
  c.push_back({Op::acquire, H});
  c.push_back({Op::acquire_grads, H});
  if (cfg.tie_embeddings) {
    c.push_back({Op::acquire, E});
    c.push_back({Op::acquire_grads, E});
    c.push_back({Op::release_grads, E});
    c.push_back({Op::release, E});
  }
  c.push_back({Op::release_grads, H});
  c.push_back({Op::release, H});
  for (int l = L - 1; l >= 0; --l) {
    c.push_back({Op::acquire, 1 + l});
    c.push_back({Op::acquire_grads, 1 + l});
    c.push_back({Op::release_grads, 1 + l});
    c.push_back({Op::release, 1 + l});
  }
  c.push_back({Op::acquire_grads, E});
  c.push_back({Op::release_grads, E});
  return c;
}

class ChunkOrderTest : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(ChunkOrderTest, ForwardThenBackwardFollowsTheDocumentedOrder) {
  auto [tied, ckpt] = GetParam();
  ModelConfig cfg = ModelConfig::preset("tiny");
  cfg.tie_embeddings = tied;
  InMemoryChunks ch{ModelLayout(cfg)};
  ch.init(1);
  LlamaModel model(cfg, {.checkpoint_activations = ckpt});
  const int B = 2, T = 8;
  std::vector<int32_t> in(B * T), tgt(B * T);
  for (int i = 0; i < B * T; ++i) in[i] = i % 256, tgt[i] = (i + 1) % 256;
  model.forward(ch, in.data(), tgt.data(), B, T);
  model.backward(ch);
  std::vector<Call> want = expected_calls(cfg);
  const std::vector<Call>& got = ch.calls();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(int(got[i].op), int(want[i].op)) << "call " << i;
    EXPECT_EQ(got[i].id, want[i].id) << "call " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(TiedAndCheckpointing, ChunkOrderTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()), [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "tied" : "untied") +
                                  (std::get<1>(info.param) ? "_checkpointed" : "_stored");
                         });

}  // namespace
}  // namespace strata::model
