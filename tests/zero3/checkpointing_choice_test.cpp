// Activation checkpointing by choice (Note [Checkpointing by choice] in zero3/engine_plan.cpp): "auto" keeps
// every activation when that fits the device and checkpoints when it does not, an explicit choice stands,
// the plan shows both sizes, and the losses are the same bit for bit either way.
#include <gtest/gtest.h>

#include <fstream>

#include "tests/common/demo_config.h"
#include "tests/common/source_dir.h"
#include "tests/zero3/engine_util.h"

namespace strata::zero3::test {
namespace {

// The stock demo config (what users run) with strata.checkpoint_activations set to `mode`.
Config demo_config(const nlohmann::json& mode) {
  nlohmann::json doc = strata::test::demo_config_doc();
  doc["strata"]["checkpoint_activations"] = mode;
  return Config::parse(nlohmann::json::parse(doc.dump()));
}

const model::ModelConfig kModel = block_model("blocks", 3);
constexpr int kSeq = 64;

EngineOptions at_cap(std::uint64_t cap) {
  return {.backend = "host", .device_memory_cap = cap, .seq_len = kSeq};
}

// The smallest device the plan accepts with checkpointing on, and the extra bytes keeping every
// activation takes.
struct Room {
  std::uint64_t need_on = 0, extra_off = 0;
};
Room room() {
  Engine e(demo_config(true), kModel, at_cap(0));
  const MemoryPlan& p = e.plan();
  EXPECT_TRUE(p.checkpoint_activations);
  EXPECT_EQ(p.device_activations, p.device_activations_checkpointed);
  EXPECT_GT(p.device_activations_all, p.device_activations_checkpointed);
  return {p.device_need(), p.device_activations_all - p.device_activations_checkpointed};
}

TEST(CheckpointingChoice, AutoKeepsEveryActivationWhenTheyFit) {
  Engine e(demo_config("auto"), kModel, at_cap(0));  // the config's 64 MiB cap: room to spare
  EXPECT_FALSE(e.plan().checkpoint_activations);
  EXPECT_EQ(e.plan().device_activations, e.plan().device_activations_all);
  EXPECT_FALSE(e.model_options().checkpoint_activations);
}

TEST(CheckpointingChoice, AutoCheckpointsWhenTheActivationsWouldNotFit) {
  const Room r = room();
  const std::uint64_t cap = r.need_on + r.extra_off / 2;  // fits with checkpointing only
  Engine e(demo_config("auto"), kModel, at_cap(cap));
  EXPECT_TRUE(e.plan().checkpoint_activations);
  EXPECT_TRUE(e.model_options().checkpoint_activations);
  EXPECT_LE(e.plan().device_need(), cap);
}

TEST(CheckpointingChoice, AnExplicitOffThatDoesNotFitSaysWhatToTurnOn) {
  const Room r = room();
  try {
    Engine e(demo_config(false), kModel, at_cap(r.need_on + r.extra_off / 2));
    FAIL() << "the plan without checkpointing was accepted";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("strata.checkpoint_activations"), std::string::npos) << e.what();
  }
}

TEST(CheckpointingChoice, EngineOptionsOverrideTheConfig) {
  EngineOptions o = at_cap(0);
  o.checkpoint_activations = true;
  Engine e(demo_config(false), kModel, o);
  EXPECT_TRUE(e.plan().checkpoint_activations);
}

TEST(CheckpointingChoice, OnAndOffTrainTheSameLossesBitForBit) {
  ScratchDir d("checkpointing-choice");
  const std::string tokens = make_tokens(d);
  const test::Run on = train(demo_config(true), kModel, tokens, 3, kSeq, at_cap(0));
  const test::Run off = train(demo_config(false), kModel, tokens, 3, kSeq, at_cap(0));
  EXPECT_EQ(on.losses, off.losses);
}

// How long a sequence fits (MemoryPlan.longest_seq_len, longest_sequence in zero3/placement.h): an engine
// planned for that many tokens a row fits the same cap, one planned for one more is refused.
TEST(LongestSequence, IsTheLongestRowAnEngineAcceptsAtTheCap) {
  model::ModelConfig m = kModel;
  m.max_seq_len = 1024;
  Engine probe(demo_config(true), m, at_cap(0));
  const std::uint64_t cap = probe.plan().device_need() + (std::uint64_t(1) << 20);  // room for more rows
  Engine e(demo_config(true), m, at_cap(cap));
  const std::int64_t longest = e.plan().longest_seq_len;
  ASSERT_GT(longest, kSeq);
  ASSERT_LT(longest, 1024);
  EXPECT_EQ(e.plan().activation_bytes_per_token,
            e.plan().device_activations / std::uint64_t(e.micro_batch() * kSeq));
  EXPECT_NO_THROW(
      Engine(demo_config(true), m, {.backend = "host", .device_memory_cap = cap, .seq_len = int(longest)}));
  EXPECT_THROW(Engine(demo_config(true), m,
                      {.backend = "host", .device_memory_cap = cap, .seq_len = int(longest) + 1}),
               Error);
}

}  // namespace
}  // namespace strata::zero3::test
