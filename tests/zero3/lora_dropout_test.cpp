// LoRA dropout in the engine (Note [Dropout keys in the engine] in zero3/engine_step.cpp): each training
// forward's masks come from the run's position (seed, step, micro-step, rank), so with lora_dropout > 0 the
// oracles every route keeps still hold bit for bit — the same losses at every placement, with the
// optimizer overlapped or not, and across a checkpoint — while the losses are not those without dropout,
// and an evaluation through the engine draws no mask.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "model/eval.h"
#include "tests/zero3/engine_util.h"

namespace strata::zero3 {
namespace {

using test::make_config;

model::ModelConfig dropout_model(double p) {
  model::ModelConfig m = test::block_model("lora-dropout", 2);
  m.lora = model::resolve_lora(m, {.modules = {"all-linear"}}, {.r = 4, .alpha = 8, .dropout = p}, "test");
  return m;
}

constexpr int kSteps = 4;
const EngineOptions kOpts{.backend = "host", .seq_len = 32};

class LoraDropoutPlacements : public ::testing::TestWithParam<std::tuple<OffloadDevice, OffloadDevice>> {};

// Every placement draws the same masks: its losses are the pinned run's bit for bit — and not those of the
// same run without dropout (the masks are drawn).
TEST_P(LoraDropoutPlacements, LossesEqualThePinnedRunsAndDifferFromNoDropout) {
  test::ScratchDir dir("lora-dropout");
  const std::string tokens = test::make_tokens(dir);
  const auto [param, optim] = GetParam();
  const Config pinned = make_config(OffloadDevice::cpu, OffloadDevice::cpu, dir.path());
  const test::Run here =
      test::train(make_config(param, optim, dir.path()), dropout_model(0.1), tokens, kSteps, 32, kOpts);
  const test::Run there = test::train(pinned, dropout_model(0.1), tokens, kSteps, 32, kOpts);
  EXPECT_EQ(here.losses, there.losses);
  const test::Run plain = test::train(pinned, dropout_model(0), tokens, kSteps, 32, kOpts);
  // Step 1's B is PEFT's zero: the adapters, dropped out or not, add nothing yet.
  EXPECT_EQ(here.losses.front(), plain.losses.front());
  EXPECT_NE(here.losses.back(), plain.losses.back());
}

INSTANTIATE_TEST_SUITE_P(Placements, LoraDropoutPlacements,
                         ::testing::Values(std::tuple{OffloadDevice::none, OffloadDevice::none},
                                           std::tuple{OffloadDevice::nvme, OffloadDevice::nvme}),
                         [](const auto& i) {
                           return test::placement_name(std::get<0>(i.param), std::get<1>(i.param), false);
                         });

TEST(LoraDropoutOverlap, LossesEqualThoseWithoutTheOverlap) {
  test::ScratchDir dir("lora-dropout-overlap");
  const std::string tokens = test::make_tokens(dir);
  Config on = make_config(OffloadDevice::cpu, OffloadDevice::cpu, dir.path()), off = on;
  on.strata.overlap_optimizer = StrataConfig::Overlap::on;
  off.strata.overlap_optimizer = StrataConfig::Overlap::off;
  EXPECT_EQ(test::train(on, dropout_model(0.1), tokens, kSteps, 32, kOpts).losses,
            test::train(off, dropout_model(0.1), tokens, kSteps, 32, kOpts).losses);
}

// Two steps, a checkpoint, two more in another placement: the resumed forwards draw the masks of the
// uninterrupted run's, so the four losses are its bit for bit.
TEST(LoraDropoutResume, TwoStepsSavedAndTwoMoreAreFourStepsBitForBit) {
  test::ScratchDir dir("lora-dropout-resume");
  const model::ModelConfig mcfg = dropout_model(0.1);
  const std::string tokens = test::make_tokens(dir);
  const Config pinned = make_config(OffloadDevice::cpu, OffloadDevice::cpu, dir.path());
  const Config nvme = make_config(OffloadDevice::nvme, OffloadDevice::nvme, dir.path());
  const std::vector<double> whole = test::train(pinned, mcfg, tokens, kSteps, 32, kOpts).losses;
  EXPECT_EQ(test::resumed_losses(pinned, nvme, mcfg, tokens, dir.file("ckpt"), kOpts, 2, 2), whole);
}

// PyTorch's eval mode: the in-training evaluation (model::evaluate through the engine, as `strata train`'s
// eval and `strata eval` run it) computes the adapters without dropout — the loss of the same parameters
// with lora_dropout 0, bit for bit — while a training forward of the same batch drops out.
TEST(LoraDropoutEval, AnEvaluationThroughTheEngineDrawsNoMask) {
  test::ScratchDir dir("lora-dropout-eval");
  const std::string tokens = test::make_tokens(dir);
  const Config cfg = make_config(OffloadDevice::cpu, OffloadDevice::cpu, dir.path());
  EngineOptions opts = kOpts;
  // Every parameter drawn N(0, 0.05), B included: the adapters change the output from the start.
  opts.init_params = [](const model::ChunkLayout& c, float* out) {
    std::mt19937 rng(std::uint32_t(c.id) + 1);
    std::normal_distribution<float> nd(0.0f, 0.05f);
    for (const model::TensorSpec& t : c.tensors)
      for (std::size_t i = 0; i < t.numel; ++i) out[t.offset + i] = nd(rng);
  };
  kernels::cpu::set_blas_threads(1);
  const model::TokenFile file = model::TokenFile::open(tokens);
  auto eval_and_train_loss = [&](double p) {
    const model::ModelConfig mcfg = dropout_model(p);
    Engine e(cfg, mcfg, opts);
    model::LlamaModel m(mcfg, e.model_options());
    const double eval = model::evaluate(m, e, file, 32, int(e.micro_batch()), 2).loss;
    model::DataLoader data(file,
                           {.batch_size = e.micro_batch(), .seq_len = 32, .seed = 3, .vocab_size = 256});
    const model::Batch b = data.next();
    const float train = e.forward(m, b.inputs.data(), b.targets.data(), b.rows, b.seq_len);
    e.abandon_forward();
    return std::pair{eval, train};
  };
  const auto [eval_dropout, train_dropout] = eval_and_train_loss(0.1);
  const auto [eval_plain, train_plain] = eval_and_train_loss(0);
  EXPECT_EQ(eval_dropout, eval_plain);
  EXPECT_NE(train_dropout, train_plain);
}

}  // namespace
}  // namespace strata::zero3
