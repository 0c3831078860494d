#include "zero3/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace strata::zero3 {

const char* to_string(SchedulerType t) {
  switch (t) {
    case SchedulerType::none:
      return "none";
    case SchedulerType::WarmupLR:
      return "WarmupLR";
    case SchedulerType::WarmupDecayLR:
      return "WarmupDecayLR";
    case SchedulerType::WarmupCosineLR:
      return "WarmupCosineLR";
  }
  return "?";
}

LrSchedule::LrSchedule(const SchedulerConfig& cfg, double base_lr)
    : cfg_(cfg), base_lr_(base_lr), warmup_(std::max<std::int64_t>(2, cfg.warmup_num_steps)) {
  last_ = cfg_.type == SchedulerType::none ? -1 : cfg_.last_batch_iteration;
  if (cfg_.type == SchedulerType::none) {
    lr_ = base_lr_;
  } else if (last_ == -1) {
    // DeepSpeed's constructors set the optimizer's rate from get_lr() before the first step.
    lr_ = cfg_.type == SchedulerType::WarmupCosineLR ? 0.0 : cfg_.warmup_min_lr;
  } else {
    lr_ = base_lr_;  // resumed by counter: the optimizer's own rate until the first step()
  }
}

double LrSchedule::warmup_fraction(std::int64_t L) const {
  if (cfg_.warmup_type == WarmupType::linear) return double(L) / double(warmup_);
  return std::log(double(L) + 1.0) / std::log(double(warmup_));
}

double LrSchedule::lr_at(std::int64_t L) const {
  const double min = cfg_.warmup_min_lr, max = cfg_.warmup_max_lr;
  switch (cfg_.type) {
    case SchedulerType::none:
      return base_lr_;
    case SchedulerType::WarmupLR:
      return min + (max - min) * (L < warmup_ ? warmup_fraction(L) : 1.0);
    case SchedulerType::WarmupDecayLR: {
      double gamma = L < warmup_ ? warmup_fraction(L)
                                 : std::max(0.0, double(cfg_.total_num_steps - L) /
                                                     std::max(1.0, double(cfg_.total_num_steps - warmup_)));
      return min + (max - min) * gamma;
    }
    case SchedulerType::WarmupCosineLR: {
      double ratio;
      if (L < warmup_) {
        ratio = cfg_.warmup_min_ratio + warmup_fraction(L) * (1.0 - cfg_.warmup_min_ratio);
      } else {
        // DeepSpeed divides by T - W unguarded; a schedule that never leaves warmup (T <= W) would divide
        // by zero there, so the denominator is floored at 1 as WarmupDecayLR's is.
        const double real_last = double(L - warmup_ + 1);
        const double real_total = std::max(1.0, double(cfg_.total_num_steps - warmup_));
        const double c = (1.0 + std::cos(std::numbers::pi * real_last / real_total)) / 2.0;
        ratio = std::max(0.0, cfg_.cos_min_ratio + (1.0 - cfg_.cos_min_ratio) * c);
      }
      return base_lr_ * ratio;
    }
  }
  return base_lr_;
}

void LrSchedule::step() {
  if (cfg_.type == SchedulerType::none) return;
  ++last_;
  lr_ = lr_at(last_);
}

nlohmann::json LrSchedule::state() const {
  return {{"type", to_string(cfg_.type)}, {"last_batch_iteration", last_}, {"lr", lr_}};
}

void LrSchedule::load_state(const nlohmann::json& j) {
  std::string type = j.value("type", std::string());
  if (type != to_string(cfg_.type))
    throw ConfigError(detail::cat("checkpoint scheduler is '", type, "' but the config's scheduler.type is '",
                                  to_string(cfg_.type),
                                  "'; resume with the config the checkpoint was saved with"));
  last_ = j.at("last_batch_iteration").get<std::int64_t>();
  lr_ = j.at("lr").get<double>();
}

}  // namespace strata::zero3
