// How a step weighs its micro-batches (Note [Loss weighting] in zero3/engine_step.cpp), on the stock demo
// config over a token file whose loss mask makes micro-batches count different numbers of targets:
// strata.loss_weighting "tokens" gives the gradients and loss of one big batch of all the rows,
// "micro_batches" the mean of the micro-batches' means, and with equal counts the two are bit-identical.
// The gradients are read through EngineOptions::testing.gradient_hook, per chunk and micro-batch, as the
// model's backward wrote them (scaled by the weighting, loss scale 1 under bf16 and fp32).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>

#include "model/loss_mask.h"
#include "tests/common/demo_config.h"
#include "tests/common/source_dir.h"
#include "tests/zero3/engine_util.h"

namespace strata::zero3::test {
namespace {

constexpr int kSeqLen = 32;
constexpr int kSamples = 8;

// The stock demo config (configs/demo_cpu.json) with these batch sizes and weighting, in bf16 as it ships
// or in fp32.
Config demo_config(int micro, int accumulation, const char* weighting, bool bf16 = true) {
  nlohmann::json doc = strata::test::demo_config_doc();
  doc["train_micro_batch_size_per_gpu"] = micro;
  doc["gradient_accumulation_steps"] = accumulation;
  doc["strata"]["loss_weighting"] = weighting;
  doc["bf16"]["enabled"] = bf16;
  return Config::parse(nlohmann::json::parse(doc.dump()));
}

// A token file of kSamples samples, and its mask: `counts(s)` of sample s's targets count (its first ones).
std::string masked_tokens(const ScratchDir& d, const std::string& name, int (*counts)(int)) {
  const std::string path = d.file(name);
  const std::size_t n = std::size_t(kSamples) * kSeqLen + 1;
  std::vector<std::uint32_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = std::uint32_t((i * 2654435761u >> 5) % 251);
  model::write_token_file(path, t, model::TokenType::u16);
  std::vector<std::uint8_t> mask(n, 0);
  for (int s = 0; s < kSamples; ++s)
    for (int j = 0; j < counts(s); ++j) mask[std::size_t(s) * kSeqLen + 1 + std::size_t(j)] = 1;
  model::write_mask_file(model::mask_path(path), mask);
  return path;
}

struct Step {
  StepResult result;
  // Per chunk, the gradient buffer of each micro-batch in order.
  std::map<int, std::vector<std::vector<float>>> grads;
  std::vector<double> losses;  // of every step
};

// `steps` steps of train_batch over `tokens` in file order (no shuffle), from the demo config's seed.
Step train(const Config& cfg, const std::string& tokens, int steps = 1, int skip_batches = 0) {
  kernels::cpu::set_blas_threads(1);
  const model::ModelConfig mcfg = model::ModelConfig::preset("tiny");
  Step out;
  Engine engine(cfg, mcfg,
                {.backend = "",
                 .device_memory_cap = 0,
                 .seq_len = kSeqLen,
                 .testing = {.gradient_hook = [&out](int c, float* g, std::size_t n) {
                   out.grads[c].emplace_back(g, g + n);
                 }}});
  model::TokenFile file = model::TokenFile::open(tokens);
  model::DataLoader data(file, {.batch_size = engine.micro_batch(),
                                .seq_len = kSeqLen,
                                .seed = 3,
                                .shuffle = false,
                                .vocab_size = mcfg.vocab_size});
  for (int i = 0; i < skip_batches; ++i) data.next();
  model::LlamaModel m(mcfg, engine.model_options());
  for (int i = 0; i < steps; ++i) {
    out.result = engine.train_batch(m, data);
    out.losses.push_back(out.result.loss);
  }
  return out;
}

// Σ over micro-batches of one chunk's gradients.
std::vector<float> summed(const std::vector<std::vector<float>>& parts) {
  std::vector<float> s(parts.at(0).size(), 0.0f);
  for (const auto& p : parts)
    for (std::size_t i = 0; i < s.size(); ++i) s[i] += p[i];
  return s;
}

// Largest |a - b| over largest |b|.
double relative_gap(const std::vector<float>& a, const std::vector<float>& b) {
  double gap = 0, scale = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    gap = std::max(gap, double(std::abs(a[i] - b[i])));
    scale = std::max(scale, double(std::abs(b[i])));
  }
  return scale > 0 ? gap / scale : gap;
}

// Samples 0 and 1 (the first micro-batch of two rows) count 2 targets each; samples 2 and 3 all 32.
int unequal(int s) {
  return s < 2 ? 2 : kSeqLen;
}

// In fp32: under bf16 the activations are rounded to bf16 after each product, and a product of 2 rows and
// one of 4 may sum a row's terms in another fp32 order (OpenBLAS's sgemm picks its kernel by the shape, in
// builds without oneDNN), which moves a rounding by one bf16 ulp and the gradients by up to 1e-3 of their
// largest. The weighting is the same arithmetic on the loss gradient in either dtype.
TEST(LossWeighting, TokensIsOneBigBatchOfAllTheRows) {
  ScratchDir d("weighting-tokens");
  const std::string tokens = masked_tokens(d, "sft.bin", unequal);
  const Step two = train(demo_config(2, 2, "tokens", false), tokens);  // micro-batches of 4 and 64 targets
  const Step big = train(demo_config(4, 1, "tokens", false), tokens);  // the same 4 rows in one micro-batch
  EXPECT_EQ(two.result.counted, 68);
  EXPECT_EQ(big.result.counted, 68);
  EXPECT_EQ(two.result.tokens, 4 * kSeqLen);
  ASSERT_EQ(two.grads.size(), big.grads.size());
  ASSERT_FALSE(two.grads.empty());
  for (const auto& [c, parts] : two.grads) {
    ASSERT_EQ(parts.size(), 2u) << "chunk " << c;
    // fp32 sums of the same terms in another grouping: well within 1e-5 of the largest gradient.
    EXPECT_LT(relative_gap(summed(parts), big.grads.at(c).at(0)), 1e-5) << "chunk " << c;
  }
  EXPECT_NEAR(two.result.loss, big.result.loss, 1e-6 * big.result.loss);
  EXPECT_NEAR(two.result.grad_norm, big.result.grad_norm, 1e-5 * big.result.grad_norm);
}

// Each micro-batch weighs 1/2 whatever it counts: its gradients are exactly half of those it has as a
// step of its own (a power-of-two scale, so bit for bit), and the loss is the mean of the two losses.
TEST(LossWeighting, MicroBatchesIsTheMeanOfTheMeans) {
  ScratchDir d("weighting-micro");
  const std::string tokens = masked_tokens(d, "sft.bin", unequal);
  const Step two = train(demo_config(2, 2, "micro_batches"), tokens);
  ASSERT_FALSE(two.grads.empty());
  const Step first = train(demo_config(2, 1, "tokens"), tokens);
  const Step second = train(demo_config(2, 1, "tokens"), tokens, 1, /*skip_batches=*/1);
  for (const auto& [c, parts] : two.grads) {
    ASSERT_EQ(parts.size(), 2u);
    const std::vector<float>* alone[2] = {&first.grads.at(c).at(0), &second.grads.at(c).at(0)};
    for (int i = 0; i < 2; ++i) {
      std::vector<float> half(alone[i]->size());
      for (std::size_t k = 0; k < half.size(); ++k) half[k] = 0.5f * (*alone[i])[k];
      EXPECT_EQ(parts[std::size_t(i)], half) << "chunk " << c << " micro-batch " << i;
    }
  }
  EXPECT_EQ(two.result.loss, (first.result.loss + second.result.loss) / 2.0);
  EXPECT_EQ(two.result.counted, 68);
  // And it is not the token mean: the first micro-batch's 4 targets weigh as much as the second's 64.
  const Step tok = train(demo_config(2, 2, "tokens"), tokens);
  EXPECT_GT(std::abs(two.result.loss - tok.result.loss), 1e-4 * tok.result.loss);
}

// Equal counts in every micro-batch, with a mask and without: the two weightings give the same gradients
// and losses bit for bit, step after step.
TEST(LossWeighting, EqualCountsMakeBothWeightingsBitIdentical) {
  ScratchDir d("weighting-equal");
  const std::string masked = masked_tokens(d, "sft.bin", [](int s) { return 10 + 6 * (s % 2); });
  const std::string plain = make_tokens(d);
  for (const std::string& tokens : {masked, plain}) {
    const Step a = train(demo_config(2, 2, "tokens"), tokens, 3);
    const Step b = train(demo_config(2, 2, "micro_batches"), tokens, 3);
    // Every chunk: the embedding, each block, the final norm and head.
    ASSERT_EQ(a.grads.size(), std::size_t(model::ModelConfig::preset("tiny").n_layers + 2));
    EXPECT_EQ(a.losses, b.losses) << tokens;
    EXPECT_TRUE(a.grads == b.grads) << tokens;
    EXPECT_EQ(a.result.counted, b.result.counted);
  }
}

// A micro-batch whose targets all miss the mask adds nothing: zero gradients, and the step is the other
// micro-batch alone.
TEST(LossWeighting, AMicroBatchCountingNothingAddsNothing) {
  ScratchDir d("weighting-none");
  const std::string tokens = masked_tokens(d, "sft.bin", [](int s) { return s < 2 ? 0 : 20; });
  const Step two = train(demo_config(2, 2, "tokens"), tokens);
  const Step second = train(demo_config(2, 1, "tokens"), tokens, 1, /*skip_batches=*/1);
  for (const auto& [c, parts] : two.grads) {
    EXPECT_TRUE(std::all_of(parts[0].begin(), parts[0].end(), [](float g) { return g == 0.0f; }))
        << "chunk " << c;
    EXPECT_EQ(parts[1], second.grads.at(c).at(0)) << "chunk " << c;  // N / n = 1: the same factor
  }
  EXPECT_EQ(two.result.loss, second.result.loss);
  EXPECT_EQ(two.result.counted, 40);
}

// Engine::backward's count (the Python binding's num_items_in_batch) below the micro-batch's own is
// refused before anything changes; the forward stays pending and a correct count then goes through.
TEST(LossWeighting, AStepCountBelowTheMicroBatchsIsRefused) {
  ScratchDir d("weighting-refused");
  const std::string tokens = masked_tokens(d, "sft.bin", unequal);
  const model::ModelConfig mcfg = model::ModelConfig::preset("tiny");
  Engine engine(demo_config(2, 1, "tokens"), mcfg,
                {.backend = "", .device_memory_cap = 0, .seq_len = kSeqLen});
  model::TokenFile file = model::TokenFile::open(tokens);
  model::DataLoader data(file, {.batch_size = 2, .seq_len = kSeqLen, .shuffle = false, .vocab_size = 256});
  model::LlamaModel m(mcfg, engine.model_options());
  data.next();
  const model::Batch b = data.next();  // samples 2 and 3: 64 counted targets
  ASSERT_EQ(b.counted, 64);
  engine.forward(m, b.inputs.data(), b.targets.data(), b.rows, b.seq_len);
  try {
    engine.backward(m, 63);
    FAIL() << "a step count below the micro-batch's was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("are 63, fewer than the 64 this micro-batch counts"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(engine.forward_pending());
  engine.backward(m, 64);
  const StepResult r = engine.step();
  EXPECT_TRUE(r.applied);
  EXPECT_EQ(r.counted, 64);
}

}  // namespace
}  // namespace strata::zero3::test
