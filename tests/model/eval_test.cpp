// Evaluation (model/eval.h): the loss is the token-weighted mean over every whole sequence and nothing
// else, batching and max_batches change only what they should, and bad input is refused naming it. Loading
// the model from each kind of path is tested end to end with the strata binary (eval_cli_test.sh).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/eval.h"
#include "model/loss_mask.h"
#include "model/token_file.h"
#include "model_test_util.h"

namespace strata::model {
namespace {

constexpr int T = 16;

std::vector<uint32_t> random_tokens(size_t n, uint32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint32_t> t(n);
  for (uint32_t& v : t) v = rng() % vocab;
  return t;
}

class Eval : public ::testing::Test {
 protected:
  Eval()
      : cfg(ModelConfig::preset("tiny")),
        chunks(ModelLayout(cfg)),
        model(cfg, {.checkpoint_activations = true}) {
    chunks.init(7);
  }

  // A token file of these tokens (flat uint16, no header) in the scratch directory.
  TokenFile file(const std::string& name, const std::vector<uint32_t>& tokens) {
    const std::string path = dir.file(name);
    write_token_file(path, tokens, TokenType::u16, /*llmc_header=*/false);
    return TokenFile::open(path);
  }

  // Σ over sequences [0, S) of the loss LlamaModel::forward gives that sequence alone, × T tokens, / S·T:
  // evaluate's definition written out one sequence at a time.
  double hand_mean(const std::vector<uint32_t>& tokens, int S) {
    std::vector<int32_t> in(T), tgt(T);
    double sum = 0;
    for (int s = 0; s < S; ++s) {
      for (int i = 0; i < T; ++i) {
        in[size_t(i)] = int32_t(tokens[size_t(s * T + i)]);
        tgt[size_t(i)] = int32_t(tokens[size_t(s * T + i + 1)]);
      }
      sum += double(model.forward(chunks, in.data(), tgt.data(), 1, T)) * T;
    }
    return sum / (double(S) * T);
  }

  test::ScratchDir dir{"eval"};
  ModelConfig cfg;
  InMemoryChunks chunks;
  LlamaModel model;
};

TEST_F(Eval, IsTheTokenWeightedMeanOfWholeSequencesIgnoringTheTail) {
  // 5 whole sequences (5·T + 1 tokens: the last target is token 5·T) and a tail of T - 1 more tokens.
  std::vector<uint32_t> tokens = random_tokens(5 * T + 1 + (T - 1), uint32_t(cfg.vocab_size), 1);
  const EvalResult r = evaluate(model, chunks, file("a.bin", tokens), T, /*batch_size=*/1, 0);
  EXPECT_EQ(r.sequences, 5);
  EXPECT_EQ(r.tokens, 5 * T);
  // Batch size 1 runs exactly the forwards of the hand computation and sums them in the same order.
  EXPECT_EQ(r.loss, hand_mean(tokens, 5));
  EXPECT_DOUBLE_EQ(r.ppl, std::exp(r.loss));
  // Other tail tokens: the same result, bit for bit (nothing past token 5·T is read).
  for (size_t i = 5 * T + 1; i < tokens.size(); ++i) tokens[i] = (tokens[i] + 1) % uint32_t(cfg.vocab_size);
  EXPECT_EQ(evaluate(model, chunks, file("b.bin", tokens), T, 1, 0).loss, r.loss);
}

// Each batch's mean comes back from LlamaModel::forward rounded once to fp32 (the CPU cross-entropy sums
// its rows in double), so batch sizes may differ by about 2^-24 relative: 1e-6 holds with room, 1e-12
// would not. The batches of 3 here are 3, 3 and a last partial batch of 1.
TEST_F(Eval, BatchSizeChangesTheLossOnlyByFp32Rounding) {
  const std::vector<uint32_t> tokens = random_tokens(7 * T + 1 + 5, uint32_t(cfg.vocab_size), 2);
  const TokenFile f = file("a.bin", tokens);
  const EvalResult one = evaluate(model, chunks, f, T, 1, 0), three = evaluate(model, chunks, f, T, 3, 0);
  EXPECT_EQ(three.sequences, 7);
  EXPECT_EQ(three.tokens, one.tokens);
  EXPECT_NEAR(three.loss, one.loss, 1e-6 * one.loss);
}

TEST_F(Eval, MaxBatchesLimitsTheSequencesEvaluated) {
  const std::vector<uint32_t> tokens = random_tokens(7 * T + 1, uint32_t(cfg.vocab_size), 3);
  const TokenFile f = file("a.bin", tokens);
  const EvalResult two = evaluate(model, chunks, f, T, /*batch_size=*/2, /*max_batches=*/2);
  EXPECT_EQ(two.sequences, 4);
  EXPECT_EQ(two.tokens, 4 * T);
  EXPECT_NEAR(two.loss, hand_mean(tokens, 4), 1e-6 * two.loss);
  // More batches than the file holds: every sequence, no error.
  EXPECT_EQ(evaluate(model, chunks, f, T, 2, 100).tokens, 7 * T);
}

TEST_F(Eval, OneSequenceNeedsSeqLenPlusOneTokens) {
  const std::vector<uint32_t> tokens = random_tokens(T + 1, uint32_t(cfg.vocab_size), 4);
  EXPECT_EQ(evaluate(model, chunks, file("enough.bin", tokens), T, 1, 0).tokens, T);
  const TokenFile short_file = file("short.bin", std::vector<uint32_t>(tokens.begin(), tokens.end() - 1));
  try {
    evaluate(model, chunks, short_file, T, 1, 0);
    FAIL() << "a file of T tokens was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(short_file.path()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("holds 16 tokens; one sequence of 16 tokens needs 17"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(Eval, RefusesATokenOutsideTheVocabulary) {
  std::vector<uint32_t> tokens = random_tokens(3 * T + 1, uint32_t(cfg.vocab_size), 5);
  tokens[20] = uint32_t(cfg.vocab_size);
  const TokenFile f = file("a.bin", tokens);
  try {
    evaluate(model, chunks, f, T, 1, 0);
    FAIL() << "token " << cfg.vocab_size << " was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(f.path() + ": token 20 is 256, outside model 'tiny''s vocabulary"),
              std::string::npos)
        << e.what();
  }
}

// Over a token file with a loss mask: the loss is the mean over the counted targets, token by token — each
// token's loss taken alone (a forward whose only counted target is that one) — not the mean of the
// sequences' means; `counted` is the mask's ones among the evaluated targets; the sequences are the same.
TEST_F(Eval, MaskedFileIsThePerTokenMeanOverCountedTargets) {
  constexpr int S = 3;
  const std::vector<uint32_t> tokens = random_tokens(S * T + 1 + 4, uint32_t(cfg.vocab_size), 8);
  const TokenFile plain = file("sft.bin", tokens);
  // Sequence 0 counts 1 target, sequence 1 all 16, sequence 2 every other one: far from equal.
  std::vector<uint8_t> mask(tokens.size(), 0);
  mask[5] = 1;
  for (int i = T + 1; i <= 2 * T; ++i) mask[size_t(i)] = 1;
  for (int i = 2 * T + 1; i <= 3 * T; i += 2) mask[size_t(i)] = 1;
  mask[3 * T + 2] = 1;  // in the tail: not evaluated
  write_mask_file(mask_path(plain.path()), mask);
  const TokenFile masked = TokenFile::open(plain.path());
  ASSERT_NE(masked.mask(), nullptr);

  const EvalResult r = evaluate(model, chunks, masked, T, /*batch_size=*/2, 0);
  EXPECT_EQ(r.sequences, S);
  EXPECT_EQ(r.tokens, S * T);
  EXPECT_EQ(r.counted, 1 + T + T / 2);

  std::vector<int32_t> in(T), tgt(T);
  double sum = 0, mean_of_means = 0;
  for (int s = 0; s < S; ++s) {
    for (int i = 0; i < T; ++i) in[size_t(i)] = int32_t(tokens[size_t(s * T + i)]);
    double seq_sum = 0;
    int seq_counted = 0;
    for (int j = 0; j < T; ++j) {
      const size_t at = size_t(s * T + 1 + j);
      if (!mask[at]) continue;
      std::fill(tgt.begin(), tgt.end(), kIgnoreTarget);
      tgt[size_t(j)] = int32_t(tokens[at]);
      const double loss = model.forward(chunks, in.data(), tgt.data(), 1, T);
      sum += loss;
      seq_sum += loss;
      ++seq_counted;
    }
    mean_of_means += seq_sum / seq_counted / S;
  }
  const double per_token = sum / double(r.counted);
  EXPECT_NEAR(r.loss, per_token, 1e-6 * per_token);
  EXPECT_GT(std::abs(r.loss - mean_of_means), 1e-3 * per_token)
      << "the mask should weigh sequences unequally";
  EXPECT_DOUBLE_EQ(r.ppl, std::exp(r.loss));
  // Without the mask the same file gives the unmasked result, all targets counted.
  std::filesystem::remove(mask_path(plain.path()));
  const TokenFile again = TokenFile::open(plain.path());
  const EvalResult u = evaluate(model, chunks, again, T, 2, 0);
  EXPECT_EQ(u.counted, u.tokens);
  EXPECT_EQ(u.loss, evaluate(model, chunks, plain, T, 2, 0).loss);
}

// A mask that counts none of the evaluated targets leaves no loss to take: refused before any forward.
TEST_F(Eval, RefusesAMaskCountingNoEvaluatedTarget) {
  const std::vector<uint32_t> tokens = random_tokens(4 * T + 1, uint32_t(cfg.vocab_size), 9);
  const TokenFile plain = file("none.bin", tokens);
  std::vector<uint8_t> mask(tokens.size(), 0);
  mask[3 * T + 1] = 1;  // sequence 3 only
  write_mask_file(mask_path(plain.path()), mask);
  const TokenFile masked = TokenFile::open(plain.path());
  EXPECT_EQ(evaluate(model, chunks, masked, T, 1, 0).counted, 1);
  try {
    evaluate(model, chunks, masked, T, /*batch_size=*/1, /*max_batches=*/3);
    FAIL() << "a mask counting nothing evaluated was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(masked.mask()->path() + " counts none of the 48 targets"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(Eval, RefusesASeqLenAboveTheModelsMaximum) {
  const TokenFile f = file("a.bin", random_tokens(1000, uint32_t(cfg.vocab_size), 6));
  EXPECT_THROW(evaluate(model, chunks, f, int(cfg.max_seq_len) + 1, 1, 0), ConfigError);
}

}  // namespace
}  // namespace strata::model
