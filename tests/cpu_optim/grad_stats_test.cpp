// grad_stats: the squared norm of the scaled gradients is accurate (against a long double sum), and the
// same bits on every SIMD target.
#include <cmath>
#include <cstring>

#include "tests/cpu_optim/common.h"

namespace strata::cpu_optim::test {
namespace {

// Around the vector widths, around the fixed block of 8192, and large.
constexpr std::size_t kSizes[] = {0,  1,    15,   16,   17,   31,
                                  33, 1000, 8191, 8192, 8193, (std::size_t(1) << 20) + 3};

class GradStatsTarget : public ::testing::TestWithParam<std::string> {};

TEST_P(GradStatsTarget, SumOfSquaresMatchesLongDoubleSum) {
  STRATA_SKIP_UNLESS_RUNNABLE(GetParam());
  Optimizer opt(options_for(GetParam()));
  for (DType gt : {DType::fp32, DType::bf16, DType::fp16}) {
    for (std::size_t n : kSizes) {
      const TestShard ts({Opt::adamw, gt, DType::fp32, Out::none, GetParam()}, n, true, n + 3);
      const GradStats s = opt.grad_stats(ts.g.get(), gt, n, kGradScale);
      const long double want = reference::sum_sq(ts.g.get(), gt, n, kGradScale);
      EXPECT_TRUE(s.finite);
      EXPECT_LE(std::fabs((long double)s.sum_sq - want), 1e-13L * want) << dtype_name(gt) << " n = " << n;
    }
  }
}

TEST_P(GradStatsTarget, SumOfSquaresIsTheSameBitsOnEveryTarget) {
  STRATA_SKIP_UNLESS_RUNNABLE(GetParam());
  const std::string first = supported_targets().back();  // the portable fallback
  Optimizer opt(options_for(GetParam())), base(options_for(first));
  for (DType gt : {DType::fp32, DType::bf16, DType::fp16}) {
    for (std::size_t n : kSizes) {
      const TestShard ts({Opt::adamw, gt, DType::fp32, Out::none, GetParam()}, n, false, n + 5);
      const double a = opt.grad_stats(ts.g.get(), gt, n, kGradScale).sum_sq;
      const double b = base.grad_stats(ts.g.get(), gt, n, kGradScale).sum_sq;
      EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0) << GetParam() << " vs " << first << ", " << dtype_name(gt)
                                                  << " n = " << n << ": " << a << " vs " << b;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, GradStatsTarget, ::testing::ValuesIn(compiled_targets()));

}  // namespace
}  // namespace strata::cpu_optim::test
