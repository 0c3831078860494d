// Bit-exact properties of every kernel on every SIMD target: the results equal the documented scalar
// fp32 formula (which makes them identical across targets), and the low-precision output is exactly the
// new fp32 params rounded to nearest even.
#include <iterator>
#include <vector>

#include "tests/cpu_optim/fp32_model.h"

namespace strata::cpu_optim::test {
namespace {

// Around the vector widths (ten steps, aligned and not), plus one size that several threads split, with
// heads and tails in every range (three steps, misaligned).
constexpr std::size_t kSizes[] = {0, 1, 15, 16, 17, 1000};
constexpr std::size_t kThreaded = (std::size_t(1) << 16) + 1003;

class Exactness : public ::testing::TestWithParam<Case> {};

TEST_P(Exactness, ResultsEqualTheFp32FormulaBitForBit) {
  const Case& c = GetParam();
  STRATA_SKIP_UNLESS_RUNNABLE(c.target);
  Optimizer opt(options_for(c.target));
  std::vector<std::size_t> sizes(std::begin(kSizes), std::end(kSizes));
  sizes.push_back(kThreaded);
  for (std::size_t n : sizes) {
    for (bool misaligned : {false, true}) {
      for (Out out : kAllOuts) {
        if (n == kThreaded && !misaligned) continue;
        const Case co = with_out(c, out);
        TestShard ts(co, n, misaligned, 77 + n);
        TestShard model(co, n, !misaligned, 0, /*fill=*/false);
        model.copy_from(ts);
        ShardStep st;
        for (int step = 1; step <= (n == kThreaded ? 3 : kSteps); ++step) {
          ts.fill_grads(1000 + std::uint64_t(step));
          model.copy_grads_from(ts);
          run_step(opt, c.opt, st, step, ts.shard(), kGradScale);
          model_step(model, c.opt, step, kGradScale);
          std::string where;
          ASSERT_TRUE(same_bytes(ts, model, &where))
              << where << " differs from the fp32 formula after step " << step << " (n = " << n
              << (misaligned ? ", misaligned" : "") << ", out " << int(out) << ")";
        }
      }
    }
  }
}

class OutputRounding : public ::testing::TestWithParam<Case> {};

TEST_P(OutputRounding, OutputIsParamsRoundedToNearestEven) {
  const Case& c = GetParam();
  STRATA_SKIP_UNLESS_RUNNABLE(c.target);
  Optimizer opt(options_for(c.target));
  for (Out o : {Out::bf16, Out::f16}) {
    TestShard ts(with_out(c, o), 4099, true, 5);
    ShardStep st;
    for (int step = 1; step <= 3; ++step) {
      ts.fill_grads(std::uint64_t(step));
      run_step(opt, c.opt, st, step, ts.shard(), kGradScale);
      const auto* out = static_cast<const std::uint16_t*>(ts.out.get());
      for (std::size_t i = 0; i < ts.n; ++i) {
        const float p = ts.params()[i];
        const std::uint16_t want = o == Out::bf16 ? f32_to_bf16(p) : f32_to_f16(p);
        ASSERT_EQ(out[i], want) << "out[" << i << "] for params " << p << " at step " << step;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllCases, Exactness, ::testing::ValuesIn(all_cases()), CaseName());
INSTANTIATE_TEST_SUITE_P(AllCases, OutputRounding, ::testing::ValuesIn(all_cases()), CaseName());

}  // namespace
}  // namespace strata::cpu_optim::test
