// Bit-exact properties of every kernel on every SIMD target: the results equal the documented scalar
// fp32 formula (which makes them identical across targets), and the low-precision output is exactly the
// new fp32 params rounded to nearest even.
#include <bit>
#include <cmath>
#include <iterator>
#include <utility>
#include <vector>

#include "tests/cpu_optim/fp32_model.h"

namespace strata::cpu_optim::test {
namespace {

// Around the vector widths (ten steps, aligned and not), plus one size that several threads split, with
// heads and tails in every range (three steps, misaligned).
constexpr std::size_t kSizes[] = {0, 1, 15, 16, 17, 1000};
constexpr std::size_t kThreaded = (std::size_t(1) << 16) + 1003;

// Whether ts's output is exactly its params rounded to the output dtype (NaN payloads included).
::testing::AssertionResult out_is_rounded_params(const TestShard& ts, Out o) {
  const auto* out = static_cast<const std::uint16_t*>(ts.out.get());
  for (std::size_t i = 0; i < ts.n; ++i) {
    const float p = ts.params()[i];
    const std::uint16_t want = o == Out::bf16 ? f32_to_bf16(p) : f32_to_f16(p);
    if (out[i] != want) {
      return ::testing::AssertionFailure()
             << "out[" << i << "] = " << out[i] << ", want " << want << " for params " << std::hexfloat << p;
    }
  }
  return ::testing::AssertionSuccess();
}

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

// Three steps of a shard whose params hold `special` values at `pos` (other params random), with finite
// gradients: each step must report its gradients finite, every buffer must equal the fp32 formula (a NaN
// where it has a NaN: payloads may differ where two NaNs meet) and the output must be the kernel's own
// new params rounded, NaN payloads included.
void expect_formula_with_special_params(const Case& c,
                                        const std::vector<std::pair<std::size_t, float>>& special) {
  Optimizer opt(options_for(c.target));
  constexpr std::size_t n = 4099;  // several blocks of the main loop, and a tail
  for (Out out : kAllOuts) {
    const Case co = with_out(c, out);
    TestShard ts(co, n, true, 91);
    for (const auto& [i, x] : special) ts.params()[i] = x;
    TestShard model(co, n, false, 0, /*fill=*/false);
    model.copy_from(ts);
    ShardStep st;
    for (int step = 1; step <= 3; ++step) {
      ts.fill_grads(500 + std::uint64_t(step));
      model.copy_grads_from(ts);
      EXPECT_TRUE(run_step(opt, c.opt, st, step, ts.shard(), kGradScale))
          << "finite gradients reported non-finite at step " << step << " (out " << int(out) << ")";
      model_step(model, c.opt, step, kGradScale);
      std::string where;
      ASSERT_TRUE(same_bytes(ts, model, &where, /*any_nan_payload=*/true))
          << where << " differs from the fp32 formula after step " << step << " (out " << int(out) << ")";
      if (out != Out::none) {
        ASSERT_TRUE(out_is_rounded_params(ts, out)) << "at step " << step;
      }
    }
  }
}

// The update loop checks blocks of elements for NaN through the sum of their new params and repairs a
// block that has one (cpu_optim/simd-inl.h): params already NaN or infinite must come out as the
// formula says, their outputs rounded with NaN kept, without a false report of non-finite gradients.
// The NaNs carry low payload bits, which a rounding that ignored NaN would carry into the exponent or
// the sign.
TEST_P(Exactness, NaNAndInfiniteParamsFollowTheFormula) {
  const Case& c = GetParam();
  STRATA_SKIP_UNLESS_RUNNABLE(c.target);
  const auto bits = [](std::uint32_t u) { return std::bit_cast<float>(u); };
  expect_formula_with_special_params(c, {{0, bits(0x7fffffffu)},
                                         {511, bits(0xff80ffffu)},  // signalling
                                         {512, INFINITY},
                                         {1000, -INFINITY},
                                         {2065, bits(0x7fc00001u)},
                                         {4098, bits(0xffbfffffu)}});  // signalling
}

// Finite params whose sum overflows to inf and then to NaN inside one block: a false alarm for the
// blockwise check, which must cost nothing but time.
TEST_P(Exactness, HugeParamsWhoseSumOverflowsFollowTheFormula) {
  const Case& c = GetParam();
  STRATA_SKIP_UNLESS_RUNNABLE(c.target);
  const float big = 3e38f;
  expect_formula_with_special_params(c, {{1030, big}, {1031, big}, {1040, -big}, {1041, -big}, {1042, -big}});
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
      ASSERT_TRUE(out_is_rounded_params(ts, o)) << "at step " << step;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllCases, Exactness, ::testing::ValuesIn(all_cases()), CaseName());
INSTANTIATE_TEST_SUITE_P(AllCases, OutputRounding, ::testing::ValuesIn(all_cases()), CaseName());

}  // namespace
}  // namespace strata::cpu_optim::test
