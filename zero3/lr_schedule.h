// strata/zero3/lr_schedule.h: the learning-rate schedules of DeepSpeed's `scheduler` section.
//
// Example:
//   strata::zero3::LrSchedule sched(cfg.scheduler, cfg.optimizer.lr);
//   float lr = sched.lr();           // the rate for the next optimizer step
//   ... optimizer step with lr ...
//   sched.step();                    // after every step that was applied (not after a skipped one)
//   nlohmann::json s = sched.state(); sched.load_state(s);   // checkpoints
//
// Semantics are DeepSpeed's (deepspeed/runtime/lr_schedules.py), with its parameter names. The schedule
// has a counter `last_batch_iteration` (L), -1 before the first step; the engine calls step() after each
// applied optimizer step, which adds one. So optimizer step k (1-based, skipped steps not counted) runs
// with the rate at L = k - 2. With W = max(2, warmup_num_steps) and T = total_num_steps:
//   warmup fraction f(L) = log(L + 1) / log(W)   (warmup_type log)      for L < W
//                        = L / W                  (warmup_type linear)
//   WarmupLR        lr = min + (max - min) * (L < W ? f(L) : 1)
//   WarmupDecayLR   lr = min + (max - min) * (L < W ? f(L) : max(0, (T - L) / max(1, T - W)))
//   WarmupCosineLR  ratio = L < W ? warmup_min_ratio + f(L) * (1 - warmup_min_ratio)
//                                 : max(0, cos_min_ratio + (1 - cos_min_ratio) * (1 + cos(pi * (L - W + 1)
//                                                                                 / (T - W))) / 2)
//                   lr = optimizer.params.lr * ratio
// (min, max = warmup_min_lr, warmup_max_lr.) Before the first step (L = -1) DeepSpeed sets the optimizer's
// rate from the schedule: warmup_min_lr for WarmupLR and WarmupDecayLR, 0 for WarmupCosineLR; a schedule
// constructed with last_batch_iteration >= 0 leaves optimizer.params.lr in place until its first step().
// Without a scheduler the rate stays optimizer.params.lr.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "config/config.h"

namespace strata::zero3 {

class LrSchedule {
 public:
  LrSchedule(const SchedulerConfig& cfg, double base_lr);

  // The learning rate the next optimizer step uses.
  double lr() const { return lr_; }
  // One optimizer step was applied: advance the schedule.
  void step();
  std::int64_t last_batch_iteration() const { return last_; }

  // {"type", "last_batch_iteration", "lr"}; load_state throws ConfigError when the type differs.
  nlohmann::json state() const;
  void load_state(const nlohmann::json& j);

  // The rate at counter value L (L >= 0), as DeepSpeed's get_lr.
  double lr_at(std::int64_t L) const;

 private:
  double warmup_fraction(std::int64_t L) const;

  SchedulerConfig cfg_;
  double base_lr_;
  std::int64_t warmup_ = 2;  // max(2, warmup_num_steps)
  std::int64_t last_ = -1;
  double lr_ = 0;
};

const char* to_string(SchedulerType t);

}  // namespace strata::zero3
