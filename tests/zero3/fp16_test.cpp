// fp16 with dynamic loss scaling: an overflowing step is skipped (nothing changes) and the scale drops;
// clean steps apply. The host backend computes in fp32, so the overflow is injected into one chunk's
// gradients the way a model would hand them back.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "engine_util.h"

namespace strata::zero3 {
namespace {

using test::make_config;
using test::make_tokens;
using test::ScratchDir;

class Fp16 : public ::testing::TestWithParam<OffloadDevice> {};

TEST_P(Fp16, OverflowSkipsTheStepAndLowersTheScale) {
  ScratchDir d("fp16");
  Config cfg = make_config(OffloadDevice::cpu, GetParam(), d.path(),
                           {{"bf16", {{"enabled", false}}},
                            {"fp16", {{"enabled", true}, {"initial_scale_power", 12}, {"hysteresis", 1}}}});
  const model::ModelConfig mcfg = model::ModelConfig::preset("tiny");
  Engine engine(cfg, mcfg, {.backend = "", .device_memory_cap = 0, .seq_len = 32});
  model::TokenFile file = model::TokenFile::open(make_tokens(d));
  model::DataLoader data(file, {.batch_size = 2, .seq_len = 32, .seed = 3, .vocab_size = 256});
  model::LlamaModel m(mcfg, engine.model_options());
  EXPECT_EQ(engine.loss_scale(), 4096.0);
  StepResult ok = engine.train_batch(m, data);
  EXPECT_TRUE(ok.applied);
  EXPECT_EQ(ok.loss_scale, 4096.0);

  const std::vector<float> before = engine.master_params(1);
  engine.forward_backward(m, data.next());
  engine.begin_pass();  // one more contribution to block 0's gradients, with an inf in it
  float* g = engine.acquire_grads(1);
  engine.ops().stream().synchronize();  // the buffer is zeroed on the compute stream; write after that
  g[5] = std::numeric_limits<float>::infinity();
  engine.release_grads(1);
  engine.end_pass();
  StepResult bad = engine.step();
  EXPECT_FALSE(bad.applied);
  EXPECT_EQ(engine.skipped_steps(), 1);
  EXPECT_EQ(engine.loss_scale(), 2048.0);
  EXPECT_EQ(engine.master_params(1), before);  // the skipped step changed nothing

  StepResult next = engine.train_batch(m, data);  // the gradients were cleared: this one applies
  EXPECT_TRUE(next.applied);
  EXPECT_EQ(next.loss_scale, 2048.0);
  EXPECT_NE(engine.master_params(1), before);
  EXPECT_TRUE(std::isfinite(next.loss));
}

INSTANTIATE_TEST_SUITE_P(OptimizerHomes, Fp16,
                         ::testing::Values(OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme),
                         [](const auto& info) { return std::string(test::name(info.param)); });

}  // namespace
}  // namespace strata::zero3
