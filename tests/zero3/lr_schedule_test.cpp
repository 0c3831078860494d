// The learning-rate schedules against DeepSpeed's formulas, evaluated independently here in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <numbers>

#include "tests/common/source_dir.h"
#include "zero3/lr_schedule.h"

namespace strata::zero3 {
namespace {

SchedulerConfig warmup(SchedulerType type, WarmupType wt) {
  SchedulerConfig s;
  s.type = type;
  s.warmup_min_lr = 1e-5;
  s.warmup_max_lr = 1e-3;
  s.warmup_num_steps = 10;
  s.warmup_type = wt;
  s.total_num_steps = 50;
  s.cos_min_ratio = 0.1;
  s.warmup_min_ratio = 0.05;
  return s;
}

// The rate used by optimizer step k (1-based): the schedule's value at counter k - 2.
std::vector<double> rates(LrSchedule s, int steps) {
  std::vector<double> r;
  for (int k = 1; k <= steps; ++k) {
    r.push_back(s.lr());
    s.step();
  }
  return r;
}

TEST(LrSchedule, NoSchedulerKeepsTheOptimizerRate) {
  LrSchedule s(SchedulerConfig{}, 3e-4);
  for (double r : rates(s, 5)) EXPECT_EQ(r, 3e-4);
}

TEST(LrSchedule, WarmupLRLogRamp) {
  auto cfg = warmup(SchedulerType::WarmupLR, WarmupType::log);
  auto r = rates(LrSchedule(cfg, 1e-3), 15);
  EXPECT_EQ(r[0], 1e-5);  // before the first step(): warmup_min_lr
  for (int k = 2; k <= 15; ++k) {
    const int L = k - 2;
    const double gamma = L < 10 ? std::log(L + 1.0) / std::log(10.0) : 1.0;
    EXPECT_DOUBLE_EQ(r[std::size_t(k - 1)], 1e-5 + (1e-3 - 1e-5) * gamma) << "step " << k;
  }
}

TEST(LrSchedule, WarmupDecayLRLinear) {
  auto cfg = warmup(SchedulerType::WarmupDecayLR, WarmupType::linear);
  auto r = rates(LrSchedule(cfg, 1e-3), 60);
  for (int k = 2; k <= 60; ++k) {
    const int L = k - 2;
    const double gamma = L < 10 ? L / 10.0 : std::max(0.0, (50.0 - L) / 40.0);
    EXPECT_DOUBLE_EQ(r[std::size_t(k - 1)], 1e-5 + (1e-3 - 1e-5) * gamma) << "step " << k;
  }
  EXPECT_EQ(r.back(), 1e-5);  // decayed to the floor
}

TEST(LrSchedule, WarmupCosineLR) {
  auto cfg = warmup(SchedulerType::WarmupCosineLR, WarmupType::linear);
  auto r = rates(LrSchedule(cfg, 2e-3), 50);
  EXPECT_EQ(r[0], 0.0);  // DeepSpeed's get_lr before the first step
  for (int k = 2; k <= 50; ++k) {
    const int L = k - 2;
    double ratio;
    if (L < 10) {
      ratio = 0.05 + (L / 10.0) * 0.95;
    } else {
      ratio = 0.1 + 0.9 * (1 + std::cos(std::numbers::pi * (L - 10 + 1) / 40.0)) / 2;
    }
    EXPECT_DOUBLE_EQ(r[std::size_t(k - 1)], 2e-3 * ratio) << "step " << k;
  }
}

TEST(LrSchedule, WarmupStepsBelowTwoActAsTwo) {
  auto cfg = warmup(SchedulerType::WarmupLR, WarmupType::linear);
  cfg.warmup_num_steps = 0;
  LrSchedule s(cfg, 1e-3);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 1e-5);
  EXPECT_DOUBLE_EQ(s.lr_at(1), 1e-5 + (1e-3 - 1e-5) * 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(2), 1e-3);
}

TEST(LrSchedule, StateRoundTripsAndChecksTheType) {
  auto cfg = warmup(SchedulerType::WarmupDecayLR, WarmupType::log);
  LrSchedule a(cfg, 1e-3);
  for (int i = 0; i < 7; ++i) a.step();
  LrSchedule b(cfg, 1e-3);
  b.load_state(a.state());
  EXPECT_EQ(b.lr(), a.lr());
  a.step(), b.step();
  EXPECT_EQ(b.lr(), a.lr());
  LrSchedule other(warmup(SchedulerType::WarmupLR, WarmupType::log), 1e-3);
  EXPECT_THROW(other.load_state(a.state()), ConfigError);
}

}  // namespace
}  // namespace strata::zero3

namespace strata::zero3 {
namespace {

// The stock demo config leaves the schedule's length to the run (Note [Loud auto] in config/config.cpp):
// with --steps 30 the cosine ends with the run, its lowest rate at step 30, near cos_min_ratio × lr.
TEST(LrSchedule, TheStockScheduleEndsWithTheRun) {
  std::ifstream in(strata::test::source_path("configs/demo_cpu.json"));
  const Config cfg = Config::parse(nlohmann::json::parse(in), {}, 1, "demo_cpu.json",
                                   {.total_steps = 30, .from = "--steps 30"});
  const std::vector<double> r = rates(LrSchedule(cfg.scheduler, cfg.optimizer.lr), 30);
  // After the warmup (steps 1 and 2 at the schedule's start, then ceil(0.08 × 30) = 3 steps up), the
  // rate falls every step to its lowest at the last.
  ASSERT_EQ(cfg.scheduler.warmup_num_steps, 3);
  const auto peak = std::max_element(r.begin(), r.end());
  EXPECT_LT(peak - r.begin(), 6);
  EXPECT_TRUE(std::is_sorted(peak, r.end(), std::greater<>())) << "the rate rises after its peak";
  const double floor = cfg.scheduler.cos_min_ratio * cfg.optimizer.lr;
  EXPECT_LT(r.back(), 1.05 * floor);
  EXPECT_GE(r.back(), floor);
}

}  // namespace
}  // namespace strata::zero3
