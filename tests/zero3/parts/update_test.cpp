// Updater alone (zero3/engine_update.h): the CPU optimizer's route — master, states and working params in
// pinned memory — against cpu_optim's AdamW applied directly, with a FakeRoom for the chunk cache.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <vector>

#include "tests/zero3/parts/env_fixture.h"
#include "zero3/engine_update.h"

namespace strata::zero3 {
namespace {

using test::ChunkState;

struct UpdaterRig {
  UpdaterRig() { updater.open(); }
  ~UpdaterRig() { env.sync(); }

  // Gradients for chunk c's fp32 shard (as the gradient path leaves them), from `seed`.
  void set_grads(int c, std::uint32_t seed) const {
    const ChunkSlot& s = env.slots[std::size_t(c)];
    const std::vector<float> g = test::test_values(s.shard.numel, seed, 1e-2f);
    std::memcpy(s.grad, g.data(), g.size() * sizeof(float));
  }
  ChunkState state(int c) const { return test::state_of(env, env.slots[std::size_t(c)]); }
  // What cpu_optim's AdamW makes of chunk c now, with its shard's gradients.
  ChunkState reference(int c, double lr, float factor, std::int64_t step_no) const {
    return test::adamw_reference(env, state(c), env.slots[std::size_t(c)].grad, lr, factor, step_no);
  }

  test::PartsEnv env;
  test::FakeRoom room{env};
  Updater updater{env, room};
};

constexpr double kLr = 1e-3;

TEST(PartsUpdater, UpdateIsCpuOptimsAdamWBitForBit) {
  UpdaterRig r;
  EXPECT_EQ(r.env.working_dtype, DType::bf16);
  const float factor = 0.5f;  // 1 / loss scale, times a clipping coefficient
  for (std::int64_t step = 1; step <= 2; ++step) {
    std::vector<ChunkState> want;
    for (const ChunkSlot& s : r.env.slots) {
      r.set_grads(s.id, std::uint32_t(10 * step + s.id));
      want.push_back(r.reference(s.id, kLr, factor, step));
    }
    r.updater.update({0, 1, 2, 3}, kLr, factor, step);
    // Master and states in place, the new bf16 working params at their pinned home.
    for (const ChunkSlot& s : r.env.slots)
      EXPECT_TRUE(test::same_state(r.state(s.id), want[std::size_t(s.id)])) << s.name << ", step " << step;
  }
  // Params at home: nothing asked of the room, nothing written through.
  EXPECT_TRUE(r.room.allocs.empty());
  EXPECT_TRUE(r.room.written.empty());
}

TEST(PartsUpdater, UpdateAdvancesTheShardStepsOfItsChunksOnly) {
  UpdaterRig r;
  for (const ChunkSlot& s : r.env.slots) r.set_grads(s.id, 20 + std::uint32_t(s.id));
  const ChunkState before1 = r.state(1), before3 = r.state(3);
  r.updater.update({0, 2}, kLr, 1.0f, 1);
  for (const int c : {0, 2}) {
    EXPECT_EQ(r.updater.shard_step(c).step, 1) << "chunk " << c;
    EXPECT_TRUE(r.updater.shard_step(c).finite) << "chunk " << c;
  }
  EXPECT_EQ(r.updater.shard_step(1).step, 0);
  EXPECT_EQ(r.updater.shard_step(3).step, 0);
  EXPECT_TRUE(test::same_state(r.state(1), before1));
  EXPECT_TRUE(test::same_state(r.state(3), before3));
  r.updater.update({0, 1, 2, 3}, kLr, 1.0f, 2);
  for (const ChunkSlot& s : r.env.slots) EXPECT_EQ(r.updater.shard_step(s.id).step, 2) << s.name;
}

TEST(PartsUpdater, AShardStepRecordsNonFiniteGradients) {
  UpdaterRig r;
  for (const ChunkSlot& s : r.env.slots) r.set_grads(s.id, 30 + std::uint32_t(s.id));
  r.env.slots[1].grad[5] = std::numeric_limits<float>::infinity();
  r.updater.update({0, 1}, kLr, 1.0f, 1);
  EXPECT_TRUE(r.updater.shard_step(0).finite);
  EXPECT_FALSE(r.updater.shard_step(1).finite);
}

TEST(PartsUpdater, StatsCountTheCpuOptimizersUpdates) {
  UpdaterRig r;
  for (const ChunkSlot& s : r.env.slots) r.set_grads(s.id, 40 + std::uint32_t(s.id));
  r.updater.update({0, 1, 2, 3}, kLr, 1.0f, 1);
  EXPECT_EQ(r.updater.stats().cpu_optimizer, 4u);
  r.updater.update({3}, kLr, 1.0f, 2);
  EXPECT_EQ(r.updater.stats().cpu_optimizer, 5u);
  EXPECT_EQ(r.updater.stats().device_optimizer, 0u);
  EXPECT_EQ(r.updater.stats().model_cpus, 0u);
}

TEST(PartsUpdater, StepShardOnASampleLeavesEveryChunkAlone) {
  UpdaterRig r;
  std::vector<ChunkState> before;
  for (const ChunkSlot& s : r.env.slots) {
    r.set_grads(s.id, 50 + std::uint32_t(s.id));
    before.push_back(r.state(s.id));
  }
  // The offload ratio's timed sample: a shard of its own, with its own bookkeeping.
  const std::size_t n = 1000;
  ChunkState sample{.master = test::test_values(n, 51),
                    .exp_avg = std::vector<float>(n, 0.0f),
                    .exp_avg_sq = std::vector<float>(n, 0.0f),
                    .params = std::vector<std::byte>(n * 2)};
  const std::vector<float> g = test::test_values(n, 52, 1e-2f);
  const ChunkState want = test::adamw_reference(r.env, sample, g.data(), kLr, 1.0f, 1);
  cpu_optim::ShardStep st;
  r.updater.step_shard(st, n, g.data(), sample.master.data(), sample.exp_avg.data(), sample.exp_avg_sq.data(),
                       sample.params.data(), kLr, 1.0f, 1);
  EXPECT_EQ(st.step, 1);
  EXPECT_TRUE(test::same_state(sample, want));
  for (const ChunkSlot& s : r.env.slots) {
    EXPECT_EQ(r.updater.shard_step(s.id).step, 0) << s.name;
    EXPECT_TRUE(test::same_state(r.state(s.id), before[std::size_t(s.id)])) << s.name;
  }
  EXPECT_EQ(r.updater.stats().cpu_optimizer, 0u);
}

}  // namespace
}  // namespace strata::zero3
