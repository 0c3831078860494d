// OptimizerOverlap alone (zero3/engine_overlap.h), driving a real Updater over a FakeRoom: updates at a
// chunk's final hand-off on the worker, rollback, the step's assumption, deferral. Every chunk's route is
// overlapped and deferred, as plan_overlap marks them with room for every rollback copy.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tests/zero3/parts/env_fixture.h"
#include "zero3/engine_overlap.h"
#include "zero3/engine_update.h"

namespace strata::zero3 {
namespace {

using test::ChunkState;

constexpr double kLr = 1e-3;
constexpr float kFactor = 0.5f;  // 1 / loss scale

struct OverlapRig {
  OverlapRig() : env({.overlap = true}) {
    updater.open();
    overlap.open();
  }
  ~OverlapRig() {
    overlap.stop();
    env.sync();
  }

  // Chunk c's final gradients in its fp32 shard (the gradient path's hand-offs are done), from `seed`.
  void set_grads(int c, std::uint32_t seed) const {
    const std::vector<float> g = test::test_values(slot(c).shard.numel, seed, 1e-2f);
    std::memcpy(slot(c).grad, g.data(), g.size() * sizeof(float));
  }
  const ChunkSlot& slot(int c) const { return env.slots[std::size_t(c)]; }
  ChunkState state(int c) const { return test::state_of(env, slot(c)); }
  ChunkState reference(int c, std::int64_t step_no) const {
    return test::adamw_reference(env, state(c), slot(c).grad, kLr, kFactor, step_no);
  }
  // The step's last backward, assuming the step applies unclipped at kLr and kFactor.
  void begin_last_backward(std::int64_t step_no) {
    overlap.begin_backward({.ends_step = true, .lr = kLr, .unclipped_factor = kFactor, .step_no = step_no});
  }
  // The gradient path's hand-off of chunk c (on the gradient stream).
  void hand_off(int c, int seen, int expected) {
    overlap.handed_off(slot(c), *env.grad_stream, seen, expected);
  }

  test::PartsEnv env;
  test::FakeRoom room{env};
  Updater updater{env, room};
  OptimizerOverlap overlap{env, updater};
};

TEST(PartsOverlap, AFinalHandOffUpdatesTheChunkOnTheWorker) {
  OverlapRig r;
  ASSERT_TRUE(r.overlap.on());
  r.set_grads(3, 1);
  const ChunkState want = r.reference(3, 1);
  r.begin_last_backward(1);
  r.hand_off(3, 1, 1);  // its only hand-off, as in the last backward
  r.overlap.wait();
  EXPECT_TRUE(r.overlap.done(3));
  EXPECT_FALSE(r.overlap.done(2));  // no hand-off yet
  EXPECT_TRUE(test::same_state(r.state(3), want));
  EXPECT_EQ(r.updater.shard_step(3).step, 1);
  // Its gradient statistics, taken on the way, for step()'s norm.
  const ShardNorm* st = r.overlap.early_stats(3);
  ASSERT_NE(st, nullptr);
  EXPECT_EQ(st->sum_sq, r.env.opt->grad_stats(r.slot(3).grad, DType::fp32, r.slot(3).shard.numel).sum_sq);
  EXPECT_TRUE(st->finite);
}

TEST(PartsOverlap, OnlyTheLastHandOffOfTheStepsLastBackwardUpdates) {
  OverlapRig r;
  r.set_grads(2, 2);
  const ChunkState before = r.state(2);
  // A backward that does not end the step's accumulation.
  r.overlap.begin_backward({.ends_step = false, .lr = kLr, .unclipped_factor = kFactor, .step_no = 1});
  r.hand_off(2, 1, 1);
  r.overlap.wait();
  r.overlap.end_backward(BackwardEnd::completed);
  EXPECT_FALSE(r.overlap.done(2));
  // The step's last backward: the first ever (no count to compare with), then not yet the last hand-off.
  r.begin_last_backward(1);
  r.hand_off(2, 1, 0);
  r.hand_off(2, 1, 2);
  r.overlap.wait();
  EXPECT_FALSE(r.overlap.done(2));
  EXPECT_TRUE(test::same_state(r.state(2), before));
  r.hand_off(2, 2, 2);
  r.overlap.wait();
  EXPECT_TRUE(r.overlap.done(2));
  EXPECT_EQ(r.overlap.stats().updates, 0u);  // counted when kept or undone
}

TEST(PartsOverlap, UndoAsRollbackPutsTheChunkBackExactly) {
  OverlapRig r;
  r.set_grads(1, 3);
  const ChunkState before = r.state(1);
  const cpu_optim::ShardStep step_before = r.updater.shard_step(1);
  r.begin_last_backward(1);
  r.hand_off(1, 1, 1);
  r.overlap.wait();
  ASSERT_TRUE(r.overlap.done(1));
  ASSERT_FALSE(test::same_state(r.state(1), before));  // updated
  r.overlap.undo(UndoAs::rollback);                    // step() found the clipping fired
  EXPECT_TRUE(test::same_state(r.state(1), before));
  EXPECT_EQ(r.updater.shard_step(1).step, step_before.step);
  EXPECT_EQ(r.updater.shard_step(1).finite, step_before.finite);
  EXPECT_FALSE(r.overlap.done(1));
  EXPECT_EQ(r.overlap.stats().rollbacks, 1u);
  EXPECT_EQ(r.overlap.stats().cancelled, 0u);
  EXPECT_EQ(r.overlap.stats().updates, 1u);
}

TEST(PartsOverlap, AssumedHoldsOnlyForTheBackwardsRateFactorAndStep) {
  OverlapRig r;
  r.begin_last_backward(4);
  EXPECT_TRUE(r.overlap.assumed(kFactor, kLr, 4));
  EXPECT_FALSE(r.overlap.assumed(kFactor, 2 * kLr, 4));  // the schedule gave another rate
  EXPECT_FALSE(r.overlap.assumed(kFactor / 2, kLr, 4));  // clipping fired
  EXPECT_FALSE(r.overlap.assumed(kFactor, kLr, 5));
}

TEST(PartsOverlap, ADeferredUpdateIsMadeByTheTimeSettleReturns) {
  OverlapRig r;
  r.set_grads(0, 4);
  r.set_grads(1, 5);
  const ChunkState want0 = r.reference(0, 1), want1 = r.reference(1, 1);
  r.overlap.defer({0, 1}, kLr, kFactor, 1);  // step() left them to the worker
  r.overlap.settle(0);                       // the next forward's gather of chunk 0
  EXPECT_TRUE(test::same_state(r.state(0), want0));
  EXPECT_EQ(r.updater.shard_step(0).step, 1);
  r.overlap.settle(1);
  EXPECT_TRUE(test::same_state(r.state(1), want1));
  EXPECT_EQ(r.updater.shard_step(1).step, 1);
  EXPECT_EQ(r.overlap.stats().deferred, 2u);
  EXPECT_FALSE(r.overlap.done(0));  // not an update made during backward: nothing to keep or undo
}

}  // namespace
}  // namespace strata::zero3
