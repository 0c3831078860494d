// Results do not depend on the thread count: every update kernel and grad_stats give the same bits with
// 1, 2, 3 and 5 threads (different splits of the shard, each range with its own head and tail).
#include <cstring>

#include "tests/cpu_optim/fp32_model.h"

namespace strata::cpu_optim::test {
namespace {

constexpr std::size_t kN = (std::size_t(1) << 20) + 3;
constexpr int kThreadCounts[] = {1, 2, 3, 5};

class ThreadCount : public ::testing::TestWithParam<std::string> {};

TEST_P(ThreadCount, UpdatesAreBitIdentical) {
  STRATA_SKIP_UNLESS_RUNNABLE(GetParam());
  const Case cases[] = {{Opt::adamw, DType::fp32, DType::fp32, Out::bf16, GetParam()},
                        {Opt::adam_l2, DType::bf16, DType::bf16, Out::f16, GetParam()},
                        {Opt::adagrad_l2, DType::fp16, DType::fp32, Out::none, GetParam()},
                        {Opt::lion_wd, DType::fp32, DType::bf16, Out::bf16, GetParam()}};
  for (const Case& c : cases) {
    const TestShard initial(c, kN, true, 11);
    std::unique_ptr<TestShard> first;
    for (int threads : kThreadCounts) {
      Optimizer opt(options_for(GetParam(), threads));
      auto ts = std::make_unique<TestShard>(c, kN, true, 0, /*fill=*/false);
      ts->copy_from(initial);
      ShardStep st;
      for (int step = 1; step <= 3; ++step) run_step(opt, c.opt, st, step, ts->shard(), kGradScale);
      if (!first) {
        first = std::move(ts);
        continue;
      }
      std::string where;
      EXPECT_TRUE(same_bytes(*ts, *first, &where))
          << case_name(c) << ": " << threads << " threads differ from 1 thread at " << where;
    }
  }
}

TEST_P(ThreadCount, GradStatsAreBitIdentical) {
  STRATA_SKIP_UNLESS_RUNNABLE(GetParam());
  for (DType gt : {DType::fp32, DType::bf16, DType::fp16}) {
    const TestShard ts({Opt::adamw, gt, DType::fp32, Out::none, GetParam()}, kN, true, 12);
    double first = 0;
    for (int threads : kThreadCounts) {
      Optimizer opt(options_for(GetParam(), threads));
      const double s = opt.grad_stats(ts.g.get(), gt, kN, kGradScale).sum_sq;
      if (threads == kThreadCounts[0]) first = s;
      EXPECT_EQ(std::memcmp(&s, &first, sizeof s), 0) << dtype_name(gt) << ", " << threads << " threads";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, ThreadCount, ::testing::ValuesIn(compiled_targets()));

}  // namespace
}  // namespace strata::cpu_optim::test
