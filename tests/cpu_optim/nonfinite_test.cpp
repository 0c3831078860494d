// Non-finite gradients are reported wherever they sit: by every update kernel (as its return value) and
// by grad_stats, for each gradient dtype; a finite gradient that the scale pushes to infinity counts too.
#include <bit>
#include <cmath>
#include <limits>

#include "tests/cpu_optim/common.h"

namespace strata::cpu_optim::test {
namespace {

// Sizes whose last elements fall in a partial vector, and one large enough to be split across threads.
constexpr std::size_t kSizes[] = {1, 17, 1000, (std::size_t(1) << 16) + 77};

std::vector<std::size_t> positions(std::size_t n) {
  std::vector<std::size_t> pos = {0, n / 2, n - 1};
  if (n > 40) pos.insert(pos.end(), {n - 17, n / 2 + 31});    // inside a tail, and mid-vector
  if (n > (std::size_t(1) << 16)) pos.push_back(n / 2 + 64);  // near where the second thread starts
  return pos;
}

void put(const TestShard& ts, std::size_t i, float x) {
  if (ts.c.grad == DType::fp32)
    static_cast<float*>(ts.g.get())[i] = x;
  else if (ts.c.grad == DType::bf16)
    static_cast<std::uint16_t*>(ts.g.get())[i] = f32_to_bf16(x);
  else
    static_cast<std::uint16_t*>(ts.g.get())[i] = f32_to_f16(x);
}

struct Param {
  std::string target;
  Opt opt;
};

class NonFinite : public ::testing::TestWithParam<Param> {};

TEST_P(NonFinite, UpdateReportsNaNOrInfAnywhere) {
  STRATA_SKIP_UNLESS_RUNNABLE(GetParam().target);
  Optimizer opt(options_for(GetParam().target));
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY,
                       std::bit_cast<float>(0xff800001u) /* signalling NaN, negative */};
  for (DType gt : {DType::fp32, DType::bf16, DType::fp16}) {
    const Case c{GetParam().opt, gt, DType::fp32, Out::bf16, GetParam().target};
    for (std::size_t n : kSizes) {
      TestShard ts(c, n, true, n);
      ShardStep st;
      ASSERT_TRUE(run_step(opt, c.opt, st, 1, ts.shard(), 1.0f)) << "finite gradients, n = " << n;
      // The same shard serves every probe: only the returned flag matters here, not the values.
      for (std::size_t i : positions(n)) {
        for (float x : bad) {
          put(ts, i, x);
          ShardStep st2;
          EXPECT_FALSE(run_step(opt, c.opt, st2, 1, ts.shard(), 1.0f))
              << dtype_name(gt) << " gradient " << x << " at " << i << " of " << n << " not reported";
          EXPECT_FALSE(st2.finite);
          put(ts, i, 0.5f);
        }
      }
    }
  }
}

TEST_P(NonFinite, UpdateReportsFiniteGradientScaledToInfinity) {
  STRATA_SKIP_UNLESS_RUNNABLE(GetParam().target);
  Optimizer opt(options_for(GetParam().target));
  const Case c{GetParam().opt, DType::fp32, DType::fp32, Out::none, GetParam().target};
  TestShard ts(c, 1000, false, 3);
  put(ts, 500, 1e30f);
  ShardStep st;
  EXPECT_FALSE(run_step(opt, c.opt, st, 1, ts.shard(), 1e10f));
}

TEST_P(NonFinite, GradStatsReportsNaNOrInfAnywhere) {
  STRATA_SKIP_UNLESS_RUNNABLE(GetParam().target);
  if (GetParam().opt != Opt::adamw) GTEST_SKIP() << "grad_stats does not depend on the optimizer";
  Optimizer opt(options_for(GetParam().target));
  for (DType gt : {DType::fp32, DType::bf16, DType::fp16}) {
    const Case c{Opt::adamw, gt, DType::fp32, Out::none, GetParam().target};
    for (std::size_t n : kSizes) {
      TestShard ts(c, n, true, n);
      ASSERT_TRUE(opt.grad_stats(ts.g.get(), gt, n).finite);
      for (std::size_t i : positions(n)) {
        for (float x : {std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY}) {
          put(ts, i, x);
          const GradStats s = opt.grad_stats(ts.g.get(), gt, n);
          EXPECT_FALSE(s.finite) << dtype_name(gt) << " gradient " << x << " at " << i << " of " << n;
          EXPECT_FALSE(std::isfinite(s.sum_sq));
          put(ts, i, 0.5f);
        }
      }
    }
  }
}

std::vector<Param> params() {
  std::vector<Param> out;
  for (const std::string& t : compiled_targets())
    for (Opt o : kAllOpts) out.push_back({t, o});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Targets, NonFinite, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param>& i) {
                           return i.param.target + "_" + opt_name(i.param.opt);
                         });

}  // namespace
}  // namespace strata::cpu_optim::test
