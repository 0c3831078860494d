// Step bookkeeping per shard (ShardStep): a repeated step number changes nothing, steps only go forward,
// sub-groups stepped one at a time equal the whole shard stepped at once, and changed betas take effect
// in the bias corrections at once.
#include <cmath>
#include <cstring>

#include "tests/cpu_optim/fp32_model.h"

namespace strata::cpu_optim::test {
namespace {

std::string best_target() {
  return supported_targets().front();
}

TEST(ShardStep, RepeatingAStepNumberChangesNothing) {
  Optimizer opt(options_for(best_target()));
  const Case c{Opt::adamw, DType::fp32, DType::fp32, Out::bf16, best_target()};
  TestShard ts(c, 5000, false, 1);
  ShardStep st;
  ASSERT_TRUE(run_step(opt, c.opt, st, 1, ts.shard(), 1.0f));
  TestShard before(c, 5000, false, 0, /*fill=*/false);
  before.copy_from(ts);
  ts.fill_grads(99);  // new gradients: a real second update would change everything
  before.copy_grads_from(ts);
  EXPECT_TRUE(run_step(opt, c.opt, st, 1, ts.shard(), 1.0f));
  std::string where;
  EXPECT_TRUE(same_bytes(ts, before, &where)) << "a repeated step modified " << where;
  EXPECT_EQ(st.step, 1);
}

TEST(ShardStep, RepeatingANonFiniteStepReturnsItsRecordedFlag) {
  Optimizer opt(options_for(best_target()));
  const Case c{Opt::lion, DType::fp32, DType::fp32, Out::none, best_target()};
  TestShard ts(c, 100, false, 1);
  static_cast<float*>(ts.g.get())[7] = INFINITY;
  ShardStep st;
  ASSERT_FALSE(run_step(opt, c.opt, st, 4, ts.shard(), 1.0f));
  static_cast<float*>(ts.g.get())[7] = 1.0f;
  EXPECT_FALSE(run_step(opt, c.opt, st, 4, ts.shard(), 1.0f));
  EXPECT_TRUE(run_step(opt, c.opt, st, 5, ts.shard(), 1.0f));
}

TEST(ShardStep, AStepNumberBehindTheShardIsRefusedAndChangesNothing) {
  Optimizer opt(options_for(best_target()));
  const Case c{Opt::adamw, DType::fp32, DType::fp32, Out::none, best_target()};
  TestShard ts(c, 100, false, 1);
  ShardStep st;
  run_step(opt, c.opt, st, 3, ts.shard(), 1.0f);
  TestShard before(c, 100, false, 0, /*fill=*/false);
  before.copy_from(ts);
  EXPECT_THROW(run_step(opt, c.opt, st, 2, ts.shard(), 1.0f), ConfigError);
  std::string where;
  EXPECT_TRUE(same_bytes(ts, before, &where)) << where;
  EXPECT_EQ(st.step, 3);
  EXPECT_THROW(run_step(opt, c.opt, st, 0, ts.shard(), 1.0f), Error);
}

TEST(ShardStep, SubGroupsSteppedOneAtATimeEqualTheWholeShard) {
  Optimizer opt(options_for(best_target()));
  constexpr std::size_t kN = 300000, kCut[] = {0, 70001, 200003, kN};
  for (Opt o : kAllOpts) {
    const Case c{o, DType::bf16, DType::fp32, Out::bf16, best_target()};
    TestShard whole(c, kN, false, 5), parts(c, kN, false, 0, /*fill=*/false);
    parts.copy_from(whole);
    ShardStep whole_step, part_step[3];
    for (int step = 1; step <= 4; ++step) {
      whole.fill_grads(std::uint64_t(step));
      parts.copy_grads_from(whole);
      run_step(opt, o, whole_step, step, whole.shard(), kGradScale);
      // Sub-group k is stepped early, then a sweep over all sub-groups repeats it.
      for (int k = 0; k < 3; ++k) {
        Shard s = parts.shard();
        const std::size_t b = kCut[k], sb = dtype_bytes(c.state);
        s.params += b;
        s.grads = static_cast<const std::uint16_t*>(s.grads) + b;
        if (s.exp_avg) s.exp_avg = static_cast<char*>(s.exp_avg) + b * sb;
        if (s.exp_avg_sq) s.exp_avg_sq = static_cast<char*>(s.exp_avg_sq) + b * sb;
        s.out = static_cast<std::uint16_t*>(s.out) + b;
        s.n = kCut[k + 1] - b;
        run_step(opt, o, part_step[k], step, s, kGradScale);
        if (k == 2) {
          for (int j = 0; j < 3; ++j) run_step(opt, o, part_step[j], step, s, kGradScale);
        }
      }
    }
    std::string where;
    EXPECT_TRUE(same_bytes(parts, whole, &where)) << opt_name(o) << ": sub-groups differ at " << where;
  }
}

TEST(ShardStep, ChangedBetasTakeEffectInTheBiasCorrectionsAtOnce) {
  Optimizer opt(options_for(best_target()));
  const Case c{Opt::adamw, DType::fp32, DType::fp32, Out::none, best_target()};
  TestShard ts(c, 4096, false, 8), model(c, 4096, false, 0, /*fill=*/false);
  model.copy_from(ts);
  ShardStep st;
  AdamParams hp = adam_params(c.opt);
  for (int step = 1; step <= 8; ++step) {
    if (step == 5) {
      hp.beta1 = 0.8f;
      hp.beta2 = 0.95f;
    }
    ts.fill_grads(std::uint64_t(step));
    model.copy_grads_from(ts);
    opt.adam(st, hp, step, ts.shard(), kGradScale);
    model_adam(model, hp, step, kGradScale);  // bias corrections 1 - beta^step with this step's betas
    std::string where;
    ASSERT_TRUE(same_bytes(ts, model, &where)) << "step " << step << ": " << where;
  }
}

}  // namespace
}  // namespace strata::cpu_optim::test
