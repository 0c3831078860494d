// kernels' AdamW is the arithmetic of cpu_optim/, bit for bit: the device AdamW (tested against
// kernels/cpu) then matches the offloaded optimizer too. (Their casts are one function, core/dtype.h's;
// tests/kernels/cast_test.cpp holds the kernels' bulk casts to it.)
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <vector>

#include "cpu_optim/cpu_optim.h"
#include "kernels/cpu/ops.h"
#include "tests/kernels/reference.h"

namespace strata::kernels::test {
namespace {

namespace cpu = strata::kernels::cpu;

struct Mode {
  bool adamw, bias_correction;
  float weight_decay, grad_scale;
};

class CpuOptimAgreement : public ::testing::TestWithParam<Mode> {};

TEST_P(CpuOptimAgreement, AdamWIsBitIdentical) {
  const Mode mode = GetParam();
  const std::size_t n = 70001;  // above cpu_optim's single-thread cutoff, not a multiple of any vector width
  auto p = random_floats(n, 1), m = random_floats(n, 2, 0.01f), v = random_floats(n, 3, 0.01f);
  for (auto& x : v) x = x * x;
  auto p2 = p, m2 = m, v2 = v;
  std::vector<cpu::bf16_t> out(n), out2(n);
  cpu::AdamWParams hp;
  hp.lr = 2e-3f;
  hp.beta2 = 0.95f;
  hp.weight_decay = mode.weight_decay;
  hp.adamw_mode = mode.adamw;
  hp.bias_correction = mode.bias_correction;
  cpu_optim::AdamParams hp2;
  hp2.lr = hp.lr;
  hp2.beta1 = hp.beta1;
  hp2.beta2 = hp.beta2;
  hp2.eps = hp.eps;
  hp2.weight_decay = hp.weight_decay;
  hp2.adamw = hp.adamw_mode;
  hp2.bias_correction = hp.bias_correction;
  cpu_optim::Optimizer opt;
  cpu_optim::ShardStep state;
  for (std::int64_t step = 1; step <= 3; ++step) {
    const auto g = random_floats(n, 10 + step);
    cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), out.data(), n, hp, step, mode.grad_scale);
    cpu_optim::Shard shard;
    shard.params = p2.data();
    shard.grads = g.data();
    shard.exp_avg = m2.data();
    shard.exp_avg_sq = v2.data();
    shard.out = out2.data();
    shard.n = n;
    opt.adam(state, hp2, step, shard, mode.grad_scale);
  }
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(p[i]), std::bit_cast<std::uint32_t>(p2[i]))
        << i << " on " << opt.target();
    ASSERT_EQ(std::bit_cast<std::uint32_t>(m[i]), std::bit_cast<std::uint32_t>(m2[i])) << i;
    ASSERT_EQ(std::bit_cast<std::uint32_t>(v[i]), std::bit_cast<std::uint32_t>(v2[i])) << i;
    ASSERT_EQ(out[i], out2[i]) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, CpuOptimAgreement,
                         ::testing::Values(Mode{true, true, 0.1f, 1.0f}, Mode{false, true, 0.05f, 0.25f},
                                           Mode{true, false, 0.0f, 1.0f}),
                         [](const auto& info) {
                           const Mode& m = info.param;
                           return std::string(m.adamw ? "adamw" : "adam_l2") +
                                  (m.bias_correction ? "_bc" : "_nobc") +
                                  (m.weight_decay != 0 ? "_wd" : "_nowd") +
                                  (m.grad_scale != 1 ? "_scaled" : "");
                         });

}  // namespace
}  // namespace strata::kernels::test
