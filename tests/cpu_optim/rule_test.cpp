// cpu_optim::Rule (cpu_optim/rule.h): the config's optimizer type names its states and its update, and
// Rule::step is the update the type's own call makes, bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cpu_optim/rule.h"

namespace strata::cpu_optim {
namespace {

TEST(Rule, NamesTheStatesEachTypeKeeps) {
  struct Case {
    OptimizerType type;
    const char* name;
    bool exp_avg, exp_avg_sq;
  } cases[] = {{OptimizerType::Adam, "Adam", true, true},
               {OptimizerType::AdamW, "AdamW", true, true},
               {OptimizerType::Adagrad, "Adagrad", false, true},
               {OptimizerType::Lion, "Lion", true, false}};
  for (const Case& c : cases) {
    const Rule r(OptimizerConfig{.type = c.type});
    EXPECT_STREQ(r.name(), c.name);
    EXPECT_EQ(r.keeps_exp_avg(), c.exp_avg) << c.name;
    EXPECT_EQ(r.keeps_exp_avg_sq(), c.exp_avg_sq) << c.name;
    EXPECT_EQ(r.states(), int(c.exp_avg) + int(c.exp_avg_sq)) << c.name;
  }
}

TEST(Rule, StepIsTheTypesOwnUpdateBitForBit) {
  constexpr std::size_t n = 1000;
  Optimizer opt({.threads = 1});
  for (OptimizerType type :
       {OptimizerType::Adam, OptimizerType::AdamW, OptimizerType::Adagrad, OptimizerType::Lion}) {
    const OptimizerConfig o{.type = type, .lr = 1e-2, .betas = {0.8, 0.9}, .eps = 1e-6, .weight_decay = 0.1};
    const Rule rule(o);
    std::vector<float> g(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = float(int(i % 17) - 8) * 0.125f;
    struct State {
      std::vector<float> p, m, v;
      ShardStep st;
    } a{std::vector<float>(n, 0.5f), std::vector<float>(n, 0.f), std::vector<float>(n, 0.f), {}}, b = a;
    auto shard = [&](State& s) {
      return Shard{.params = s.p.data(),
                   .grads = g.data(),
                   .exp_avg = rule.keeps_exp_avg() ? s.m.data() : nullptr,
                   .exp_avg_sq = rule.keeps_exp_avg_sq() ? s.v.data() : nullptr,
                   .n = n};
    };
    for (std::int64_t step = 1; step <= 3; ++step) {
      rule.step(opt, a.st, 1e-2, step, shard(a), 0.5f);
      switch (type) {
        case OptimizerType::Adam:
        case OptimizerType::AdamW:
          opt.adam(b.st,
                   {.lr = 1e-2f,
                    .beta1 = 0.8f,
                    .beta2 = 0.9f,
                    .eps = 1e-6f,
                    .weight_decay = 0.1f,
                    .adamw = type == OptimizerType::AdamW || o.adam_w_mode},
                   step, shard(b), 0.5f);
          break;
        case OptimizerType::Adagrad:
          opt.adagrad(b.st, {.lr = 1e-2f, .eps = 1e-6f, .weight_decay = 0.1f}, step, shard(b), 0.5f);
          break;
        case OptimizerType::Lion:
          opt.lion(b.st, {.lr = 1e-2f, .beta1 = 0.8f, .beta2 = 0.9f, .weight_decay = 0.1f}, step, shard(b),
                   0.5f);
          break;
      }
    }
    EXPECT_EQ(std::memcmp(a.p.data(), b.p.data(), n * sizeof(float)), 0) << rule.name();
    EXPECT_EQ(std::memcmp(a.m.data(), b.m.data(), n * sizeof(float)), 0) << rule.name();
    EXPECT_EQ(std::memcmp(a.v.data(), b.v.data(), n * sizeof(float)), 0) << rule.name();
    EXPECT_EQ(a.st.step, 3);
  }
}

}  // namespace
}  // namespace strata::cpu_optim
