// Gradient accumulation with room on the device (Note [Gradients off the device] in
// zero3/engine_grads.cpp, Note [Reuse across passes] in prefetch/prefetch.h): each chunk is gathered once
// per step and its gradients cross to the host once per step, instead of once per micro-batch, with the
// losses of a run that has no room for either, bit for bit.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine_util.h"

namespace strata::zero3 {
namespace {

using test::make_tokens;
using test::ScratchDir;

constexpr int kAccumulation = 8;
constexpr int kSteps = 3;
constexpr int kSeqLen = 16;

// Four blocks, the embedding and the head: six chunks, every one offloaded to pinned memory.
model::ModelConfig accumulation_model() {
  return test::block_model("accumulation-test", 4);
}

Config accumulation_config(const std::string& nvme_dir, OffloadDevice off) {
  return test::make_config(off, off, nvme_dir,
                           {{"train_micro_batch_size_per_gpu", 1},
                            {"gradient_accumulation_steps", kAccumulation},
                            {"zero_optimization", {{"sub_group_size", 1000000000}}}});
}

struct Counts {
  std::vector<double> losses;
  TransferStats after_first, after_last;  // the engine's transfers after step 1 and after the last
  MemoryPlan plan;
};

// An engine over the accumulation model at device cap `cap`, its data and its model.
struct Training {
  Training(const Config& cfg, const std::string& tokens, std::uint64_t cap)
      : mcfg(accumulation_model()),
        engine(cfg, mcfg, {.backend = "", .device_memory_cap = cap, .seq_len = kSeqLen}),
        file(model::TokenFile::open(tokens)),
        data(file, {.batch_size = 1, .seq_len = kSeqLen, .seed = 3, .vocab_size = mcfg.vocab_size}),
        m(mcfg, engine.model_options()) {
    kernels::cpu::set_blas_threads(1);
  }
  model::ModelConfig mcfg;
  Engine engine;
  model::TokenFile file;
  model::DataLoader data;
  model::LlamaModel m;
};

Counts run(const Config& cfg, const std::string& tokens, std::uint64_t cap) {
  Training t(cfg, tokens, cap);
  Counts c;
  for (int i = 0; i < kSteps; ++i) {
    const StepResult r = t.engine.train_batch(t.m, t.data);
    EXPECT_TRUE(r.applied);
    c.losses.push_back(r.loss);
    if (i == 0) c.after_first = t.engine.transfer_stats();
  }
  c.after_last = t.engine.transfer_stats();
  c.plan = t.engine.plan();
  return c;
}

// The smallest cap the plan accepts: no room for a cache or an accumulator.
std::uint64_t smallest_cap(const Config& cfg) {
  Engine e(cfg, accumulation_model(), {.backend = "", .device_memory_cap = 0, .seq_len = kSeqLen});
  return e.plan().device_need();
}

class GradAccumulation : public ::testing::TestWithParam<OffloadDevice> {};

TEST_P(GradAccumulation, WithRoomGathersAndGradientsCrossOncePerStep) {
  ScratchDir d(std::string("accumulate-") + test::name(GetParam()));
  const Config cfg = accumulation_config(d.path(), GetParam());
  const std::string tokens = make_tokens(d);
  const int chunks = int(accumulation_model().n_layers) + 2;

  const Counts roomy = run(cfg, tokens, 0);
  const Counts tight = run(cfg, tokens, smallest_cap(cfg));
  EXPECT_EQ(roomy.losses, tight.losses) << "the same losses with and without room, bit for bit";

  EXPECT_EQ(roomy.plan.device_accumulators, chunks);
  EXPECT_EQ(tight.plan.device_accumulators, 0);
  // Gradients off the device: once per chunk and step with room, once per chunk and micro-batch without.
  EXPECT_EQ(roomy.after_last.grad_offloads, std::uint64_t(kSteps * chunks));
  EXPECT_EQ(tight.after_last.grad_offloads, std::uint64_t(kSteps * kAccumulation * chunks));
  // Gathers after the first step (which records the order): each chunk once per step with room; at least
  // once per chunk and micro-batch without.
  const std::uint64_t roomy_gathers = roomy.after_last.gathers - roomy.after_first.gathers;
  const std::uint64_t tight_gathers = tight.after_last.gathers - tight.after_first.gathers;
  EXPECT_EQ(roomy_gathers, std::uint64_t((kSteps - 1) * chunks));
  EXPECT_GE(tight_gathers, std::uint64_t(kAccumulation) * roomy_gathers);
}

INSTANTIATE_TEST_SUITE_P(Offload, GradAccumulation,
                         ::testing::Values(OffloadDevice::cpu, OffloadDevice::nvme),
                         [](const auto& info) { return std::string(test::name(info.param)); });

// One micro-batch a step: nothing to accumulate, so no accumulator takes room from the cache.
TEST(GradAccumulation, OneMicroBatchPlansNoAccumulator) {
  ScratchDir d("accumulate-one");
  const Config cfg = test::make_config(OffloadDevice::cpu, OffloadDevice::cpu, d.path(),
                                       {{"gradient_accumulation_steps", 1}});
  Engine e(cfg, accumulation_model(), {.backend = "", .device_memory_cap = 0, .seq_len = kSeqLen});
  EXPECT_EQ(e.plan().device_accumulators, 0);
  EXPECT_EQ(e.plan().device_accumulator_bytes, 0u);
}

// A step taken before the configured micro-batches were all made still sees every gradient: the
// accumulators cross at step(), and the loss and the next step's are those of a run without room.
TEST(GradAccumulation, AnEarlyStepFlushesTheAccumulators) {
  ScratchDir d("accumulate-early");
  const Config cfg = accumulation_config(d.path(), OffloadDevice::cpu);
  const std::string tokens = make_tokens(d);
  auto losses = [&](std::uint64_t cap) {
    Training t(cfg, tokens, cap);
    std::vector<double> l;
    for (int step = 0; step < 2; ++step) {
      for (int i = 0; i < 3; ++i) t.engine.forward_backward(t.m, t.data.next());  // 3 of 8
      const StepResult r = t.engine.step();
      l.push_back(r.loss);
      l.push_back(r.grad_norm);
    }
    return l;
  };
  EXPECT_EQ(losses(0), losses(smallest_cap(cfg)));
}

}  // namespace
}  // namespace strata::zero3
