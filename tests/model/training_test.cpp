// The model learns: the tiny preset overfits one batch; tiny and 10m train on byte-level text with
// falling loss, through the token file, the byte tokenizer and the data loader.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "model/data_loader.h"
#include "model/llama.h"
#include "model/token_file.h"
#include "model/tokenizer.h"
#include "model_test_util.h"

namespace strata::model {
namespace {

// One fixed batch (B 4, T 32, random tokens over the full 256-token vocabulary), AdamW lr 1e-2: the loss
// starts near ln 256 = 5.55 and must fall below 0.05 within 60 steps.
TEST(Training, TinyOverfitsOneBatch) {
  ModelConfig cfg = ModelConfig::preset("tiny");
  InMemoryChunks ch{ModelLayout(cfg)};
  ch.init(1);
  LlamaModel model(cfg, {.checkpoint_activations = true});
  testing::AdamW opt(ch, 1e-2f);
  const int B = 4, T = 32;
  std::mt19937 rng(5);
  std::vector<int32_t> in(B * T), tgt(B * T);
  for (int i = 0; i < B * T; ++i) in[i] = int32_t(rng() % 256), tgt[i] = int32_t(rng() % 256);
  float first = 0, loss = 0;
  int steps = 0;
  for (; steps < 60; ++steps) {
    loss = testing::train_step(model, ch, opt, in, tgt, B, T);
    if (steps == 0) first = loss;
    if (loss < 0.05f) break;
  }
  std::printf("  tiny overfit: loss %.3f -> %.4f in %d steps\n", first, loss, steps + 1);
  EXPECT_NEAR(first, std::log(256.0f), 0.1f);
  EXPECT_LT(loss, 0.05f);
}

struct TrainCase {
  const char* preset;
  int B, T, steps;
  float lr;
  float drop;  // the mean loss of the last 3 steps is at least this much below the first 3 steps'
};

class TrainOnTextTest : public ::testing::TestWithParam<TrainCase> {};

TEST_P(TrainOnTextTest, LossFallsOnByteLevelText) {
  const TrainCase& tc = GetParam();
  ModelConfig cfg = ModelConfig::preset(tc.preset);
  test::ScratchDir dir("model");
  const std::string bin = dir.file("grammar.bin");
  const std::string txt = bin + ".txt";
  {
    std::FILE* f = std::fopen(txt.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::string text = testing::grammar_text(64 * 1024, 17);
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
  ByteTokenizer::text_file_to_tokens(txt, bin);
  TokenFile file = TokenFile::open(bin);
  DataLoader loader(file, {.batch_size = tc.B, .seq_len = tc.T, .seed = 3, .vocab_size = cfg.vocab_size});

  InMemoryChunks ch{ModelLayout(cfg)};
  ch.init(2);
  LlamaModel model(cfg, {.checkpoint_activations = true});
  testing::AdamW opt(ch, tc.lr);
  std::vector<float> losses;
  for (int s = 0; s < tc.steps; ++s) {
    Batch b = loader.next();
    losses.push_back(testing::train_step(model, ch, opt, b.inputs, b.targets, b.rows, b.seq_len));
  }
  float head = (losses[0] + losses[1] + losses[2]) / 3, tail = 0;
  for (int i = tc.steps - 3; i < tc.steps; ++i) tail += losses[size_t(i)] / 3;
  std::printf("  %s: %d steps of %dx%d tokens, loss %.3f -> %.3f\n", tc.preset, tc.steps, tc.B, tc.T, head,
              tail);
  EXPECT_LT(tail, head - tc.drop);
}

INSTANTIATE_TEST_SUITE_P(Presets, TrainOnTextTest,
                         ::testing::Values(TrainCase{"tiny", 8, 64, 40, 1e-2f, 2.0f},
                                           TrainCase{"10m", 4, 64, 12, 1e-3f, 1.5f}),
                         [](const auto& info) { return std::string("p") + info.param.preset; });

}  // namespace
}  // namespace strata::model
