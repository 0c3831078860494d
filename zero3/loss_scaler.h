// strata/zero3/loss_scaler.h: fp16 loss scaling (DeepSpeed's fp16 keys) and the one gradient scale the
// optimizer applies (unscale × clip).
//
// Example:
//   strata::zero3::LossScaler scaler(cfg.fp16);          // 1, never overflows, when fp16 is off
//   model.backward(chunks, float(scaler.scale() / accumulation));
//   ... global squared norm `sum_sq` and `finite` over every gradient shard ...
//   bool applied = scaler.update(!finite);             // false: skip this step (the scale may drop)
//   if (applied) {
//     GradScale gs = grad_scale(sum_sq, scaler.scale(), cfg.gradient_clipping);
//     optimizer.step(..., gs.factor);                  // grads × factor = unscaled, clipped
//   }
//
// Dynamic scaling follows DeepSpeed's DynamicLossScaler: the scale starts at 2^initial_scale_power. On an
// overflow the step is skipped; if the hysteresis count is down to 1 the scale is divided by 2 (never below
// min_loss_scale; an overflow at min_loss_scale is an error, as in DeepSpeed), else the count drops by one.
// After loss_scale_window steps without overflow (counted from the last overflow) the scale doubles and the
// count is refilled to `hysteresis`; with consecutive_hysteresis the count is refilled after every step
// without overflow. A static scale (fp16.loss_scale > 0) never changes; overflowing steps are still skipped.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "config/config.h"

namespace strata::zero3 {

class LossScaler {
 public:
  explicit LossScaler(const Fp16Config& cfg);

  double scale() const { return scale_; }
  bool dynamic() const { return dynamic_; }
  bool enabled() const { return enabled_; }  // fp16 on: overflow checks decide whether a step applies
  // Records one optimizer step's outcome; returns whether the step is applied (no overflow). Throws
  // strata::Error when an overflow happens with the scale already at min_loss_scale.
  bool update(bool overflow);
  std::int64_t skipped_steps() const { return skipped_; }

  nlohmann::json state() const;
  void load_state(const nlohmann::json& j);

 private:
  Fp16Config cfg_;
  bool enabled_ = false, dynamic_ = false;
  double scale_ = 1.0;
  std::int64_t iter_ = 0, last_overflow_iter_ = -1, hysteresis_ = 1, skipped_ = 0;
};

// The factor the optimizer multiplies every gradient by, from the squared norm of the (loss-scaled)
// gradients: 1 / (loss_scale × clip), clip = (norm / loss_scale + 1e-6) / max_norm when that exceeds 1
// (DeepSpeed's unscale_and_clip_grads); max_norm 0 disables clipping.
struct GradScale {
  double norm = 0;  // global L2 norm of the unscaled gradients (before clipping)
  bool clipped = false;
  float factor = 1.0f;
};
GradScale grad_scale(double sum_sq_scaled, double loss_scale, double max_norm);

}  // namespace strata::zero3
