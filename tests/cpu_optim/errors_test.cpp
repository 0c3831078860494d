// Bad arguments are refused before anything is modified: null or misaligned buffers, dtypes a buffer
// cannot have, betas out of range, a negative thread count.
#include "tests/cpu_optim/fp32_model.h"

namespace strata::cpu_optim::test {
namespace {

std::string best_target() {
  return supported_targets().front();
}

class Errors : public ::testing::Test {
 protected:
  Optimizer opt{options_for(best_target())};
  Case c{Opt::adamw, DType::fp32, DType::fp32, Out::bf16, best_target()};
  TestShard ts{c, 64, false, 1};
  ShardStep st;

  // Runs `call`, expects it to throw E, and checks that neither the shard nor the step state changed.
  template <class E, class F>
  void expect_refused(F call) {
    TestShard before(c, 64, false, 0, /*fill=*/false);
    before.copy_from(ts);
    EXPECT_THROW(call(), E);
    std::string where;
    EXPECT_TRUE(same_bytes(ts, before, &where)) << "modified " << where;
    EXPECT_EQ(st.step, 0);
  }
};

TEST_F(Errors, NullRequiredBufferIsRefused) {
  for (int which = 0; which < 4; ++which) {
    Shard s = ts.shard();
    if (which == 0) s.params = nullptr;
    if (which == 1) s.grads = nullptr;
    if (which == 2) s.exp_avg = nullptr;
    if (which == 3) s.exp_avg_sq = nullptr;
    expect_refused<Error>([&] { opt.adam(st, AdamParams{}, 1, s); });
  }
  Shard s = ts.shard();
  s.exp_avg = nullptr;
  expect_refused<Error>([&] { opt.lion(st, LionParams{}, 1, s); });
}

TEST_F(Errors, BuffersAnOptimizerDoesNotUseMayBeNull) {
  Shard s = ts.shard();
  s.exp_avg = nullptr;
  EXPECT_TRUE(opt.adagrad(st, AdagradParams{}, 1, s));
  ShardStep st2;
  s = ts.shard();
  s.exp_avg_sq = nullptr;
  EXPECT_TRUE(opt.lion(st2, LionParams{}, 1, s));
}

TEST_F(Errors, UnsupportedDtypesAreRefused) {
  Shard s = ts.shard();
  s.state_dtype = DType::fp16;
  expect_refused<Error>([&] { opt.adam(st, AdamParams{}, 1, s); });
  s = ts.shard();
  s.out_dtype = DType::fp32;
  expect_refused<Error>([&] { opt.adam(st, AdamParams{}, 1, s); });
  s = ts.shard();
  s.grad_dtype = DType::i32;
  expect_refused<Error>([&] { opt.adam(st, AdamParams{}, 1, s); });
  EXPECT_THROW(opt.grad_stats(s.grads, DType::i32, s.n), Error);
}

TEST_F(Errors, MisalignedElementPointerIsRefused) {
  Shard s = ts.shard();
  s.params = reinterpret_cast<float*>(reinterpret_cast<char*>(s.params) + 2);
  s.n = 10;
  expect_refused<Error>([&] { opt.adam(st, AdamParams{}, 1, s); });
}

TEST_F(Errors, BetasOutOfRangeRaiseConfigError) {
  for (float b : {-0.1f, 1.0f, 1.5f}) {
    AdamParams hp;
    hp.beta2 = b;
    expect_refused<ConfigError>([&] { opt.adam(st, hp, 1, ts.shard()); });
  }
  LionParams lp;
  lp.beta1 = 1.1f;
  expect_refused<ConfigError>([&] { opt.lion(st, lp, 1, ts.shard()); });
}

TEST_F(Errors, NegativeThreadCountRaisesConfigError) {
  Options o = options_for(best_target(), -1);
  EXPECT_THROW(Optimizer{o}, ConfigError);
}

TEST_F(Errors, EmptyShardIsAcceptedAndCounted) {
  Shard s;
  EXPECT_TRUE(opt.adam(st, AdamParams{}, 1, s));
  EXPECT_EQ(st.step, 1);
  EXPECT_TRUE(opt.grad_stats(nullptr, DType::fp32, 0).finite);
}

}  // namespace
}  // namespace strata::cpu_optim::test
