#include "zero3/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/log.h"

namespace strata::zero3 {

LossScaler::LossScaler(const Fp16Config& cfg) : cfg_(cfg), enabled_(cfg.enabled) {
  if (!enabled_) return;
  dynamic_ = cfg.loss_scale == 0.0;
  scale_ = dynamic_ ? std::ldexp(1.0, int(cfg.initial_scale_power)) : cfg.loss_scale;
  hysteresis_ = cfg.hysteresis;
}

bool LossScaler::update(bool overflow) {
  if (!enabled_) return !overflow;
  if (overflow) ++skipped_;
  if (!dynamic_) return !overflow;
  if (overflow) {
    if (cfg_.hysteresis == 1 || hysteresis_ == 1) {
      if (scale_ <= cfg_.min_loss_scale)
        throw Error(
            detail::cat("fp16: the gradients overflow with the loss scale already at fp16.min_loss_scale ",
                        cfg_.min_loss_scale,
                        "; lower optimizer.params.lr, clip gradients (gradient_clipping) or train in bf16"));
      double next = std::max(scale_ / 2.0, cfg_.min_loss_scale);
      STRATA_LOG_INFO("fp16 overflow: skipping step, loss scale ", scale_, " -> ", next);
      scale_ = next;
    } else {
      STRATA_LOG_INFO("fp16 overflow: skipping step at loss scale ", scale_, ", hysteresis ", hysteresis_,
                      " -> ", hysteresis_ - 1);
      --hysteresis_;
    }
    last_overflow_iter_ = iter_;
  } else {
    if (cfg_.consecutive_hysteresis) hysteresis_ = cfg_.hysteresis;
    if ((iter_ - last_overflow_iter_) % cfg_.loss_scale_window == 0) {
      if (!cfg_.consecutive_hysteresis) hysteresis_ = cfg_.hysteresis;
      scale_ *= 2.0;
    }
  }
  ++iter_;
  return !overflow;
}

nlohmann::json LossScaler::state() const {
  return {{"scale", scale_},
          {"iter", iter_},
          {"last_overflow_iter", last_overflow_iter_},
          {"hysteresis", hysteresis_},
          {"skipped_steps", skipped_}};
}

void LossScaler::load_state(const nlohmann::json& j) {
  scale_ = j.at("scale").get<double>();
  iter_ = j.at("iter").get<std::int64_t>();
  last_overflow_iter_ = j.at("last_overflow_iter").get<std::int64_t>();
  hysteresis_ = j.at("hysteresis").get<std::int64_t>();
  skipped_ = j.at("skipped_steps").get<std::int64_t>();
}

GradScale grad_scale(double sum_sq_scaled, double loss_scale, double max_norm) {
  GradScale g;
  g.norm = std::sqrt(sum_sq_scaled) / loss_scale;
  double combined = loss_scale;
  if (max_norm > 0.0) {
    double clip = (g.norm + 1e-6) / max_norm;
    if (clip > 1.0) {
      combined = clip * loss_scale;
      g.clipped = true;
    }
  }
  g.factor = float(1.0 / combined);
  return g;
}

}  // namespace strata::zero3
