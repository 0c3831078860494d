// Activation checkpointing gives bit-identical gradients; gradients scale and accumulate exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "model/chunk.h"
#include "model/llama.h"
#include "model_test_util.h"

namespace strata::model {
namespace {

struct Case {
  const char* preset;
  bool tied;
  int B, T;
};

class CheckpointingTest : public ::testing::TestWithParam<Case> {
 protected:
  ModelConfig cfg() const {
    ModelConfig c = ModelConfig::preset(GetParam().preset);
    c.tie_embeddings = GetParam().tied;
    return c;
  }
  std::vector<int32_t> tokens(uint32_t seed) const {
    std::vector<int32_t> t(size_t(GetParam().B) * GetParam().T);
    std::mt19937 rng(seed);
    for (int32_t& x : t) x = int32_t(rng() % cfg().vocab_size);
    return t;
  }
};

// Three AdamW steps each way: gradients after every step and the parameters at the end agree bit for bit.
TEST_P(CheckpointingTest, GradientsAreBitIdenticalWithAndWithout) {
  const int B = GetParam().B, T = GetParam().T;
  InMemoryChunks plain{ModelLayout(cfg())}, ckpt{ModelLayout(cfg())};
  plain.init(9);
  ckpt.init(9);
  LlamaModel m_plain(cfg(), {.checkpoint_activations = false});
  LlamaModel m_ckpt(cfg(), {.checkpoint_activations = true});
  testing::AdamW o_plain(plain, 1e-3f), o_ckpt(ckpt, 1e-3f);
  const size_t n = plain.layout().total_padded_numel();
  for (int step = 0; step < 3; ++step) {
    std::vector<int32_t> in = tokens(100 + step), tgt = tokens(200 + step);
    float l_plain = testing::train_step(m_plain, plain, o_plain, in, tgt, B, T);
    float l_ckpt = testing::train_step(m_ckpt, ckpt, o_ckpt, in, tgt, B, T);
    EXPECT_EQ(l_plain, l_ckpt) << "step " << step;
    ASSERT_EQ(std::memcmp(plain.all_grads(), ckpt.all_grads(), n * sizeof(float)), 0)
        << "gradients differ at step " << step;
  }
  EXPECT_EQ(std::memcmp(plain.all_params(), ckpt.all_params(), n * sizeof(float)), 0);
  EXPECT_LT(m_ckpt.activation_bytes(), m_plain.activation_bytes());
}

// Backward adds into the provider's buffers: two backward passes give twice the gradient (to fp32
// rounding: the ops add into the buffer inside their sums, so g + g is not rounded as 2g), and grad_scale 4
// (a power of two, which every op carries through without rounding) gives exactly four times it.
TEST_P(CheckpointingTest, GradientsAccumulateAndScaleExactly) {
  const int B = GetParam().B, T = GetParam().T;
  InMemoryChunks ch{ModelLayout(cfg())};
  ch.init(4);
  LlamaModel model(cfg(), {.checkpoint_activations = true});
  std::vector<int32_t> in = tokens(1), tgt = tokens(2);
  const size_t n = ch.layout().total_padded_numel();

  ch.zero_grads();
  model.forward(ch, in.data(), tgt.data(), B, T);
  model.backward(ch);
  std::vector<float> once(ch.all_grads(), ch.all_grads() + n);

  model.forward(ch, in.data(), tgt.data(), B, T);
  model.backward(ch);
  float gmax = 0;
  for (size_t i = 0; i < n; ++i) gmax = std::max(gmax, std::fabs(once[i]));
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(ch.all_grads()[i], 2.0f * once[i], 1e-6f * gmax) << i;

  ch.zero_grads();
  model.forward(ch, in.data(), tgt.data(), B, T);
  model.backward(ch, 4.0f);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(ch.all_grads()[i], 4.0f * once[i]) << i;
}

INSTANTIATE_TEST_SUITE_P(Presets, CheckpointingTest,
                         ::testing::Values(Case{"tiny", false, 2, 16}, Case{"tiny", true, 3, 7},
                                           Case{"10m", false, 1, 32}),
                         [](const auto& info) {
                           return std::string("p") + info.param.preset +
                                  (info.param.tied ? "_tied" : "_untied");
                         });

}  // namespace
}  // namespace strata::model
