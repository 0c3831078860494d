// strata/cpu_optim/rule.h: an optimizer as the config's "optimizer" section names it (Adam, AdamW, Adagrad,
// Lion) — its name, the state tensors it keeps beside the fp32 master, its hyper-parameters at a rate, and
// one call that steps a shard with it — so that the engine keeps, swaps and checkpoints states without
// switching on the type.
//
// Example:
//   const cpu_optim::Rule rule(cfg.optimizer);
//   for (int i = 0; i < rule.states(); ++i) ...                  // 2 for Adam/AdamW, 1 for Adagrad/Lion
//   rule.step(optimizer, shard_step, lr, step_no, shard, factor);  // adam(), adagrad() or lion()
#pragma once

#include <cstdint>

#include "config/config.h"
#include "cpu_optim/cpu_optim.h"

namespace strata::cpu_optim {

class Rule {
 public:
  explicit Rule(const OptimizerConfig& o) : o_(o) {}

  const OptimizerConfig& config() const { return o_; }
  // "Adam", "AdamW", "Adagrad" or "Lion": the config's word, kept in checkpoints.
  const char* name() const;
  // The state tensors kept per parameter (Shard's buffers): exp_avg for Adam, AdamW and Lion; exp_avg_sq
  // for Adam, AdamW and Adagrad.
  bool keeps_exp_avg() const { return o_.type != OptimizerType::Adagrad; }
  bool keeps_exp_avg_sq() const { return o_.type != OptimizerType::Lion; }
  int states() const { return int(keeps_exp_avg()) + int(keeps_exp_avg_sq()); }
  // Adam's or AdamW's arithmetic, the one the compute interface's device optimizer has (Ops::adamw).
  bool adam_family() const { return o_.type == OptimizerType::Adam || o_.type == OptimizerType::AdamW; }
  // Weight decay decoupled from the gradient: AdamW, or Adam with adam_w_mode.
  bool decoupled_decay() const { return o_.type == OptimizerType::AdamW || o_.adam_w_mode; }

  AdamParams adam(double lr) const;
  AdagradParams adagrad(double lr) const;
  LionParams lion(double lr) const;

  // One update of `shard` at rate `lr` (Optimizer::adam, adagrad or lion, as the type says). Returns
  // whether every scaled gradient was finite.
  bool step(Optimizer& opt, ShardStep& st, double lr, std::int64_t step_no, const Shard& shard,
            float grad_scale) const;

 private:
  OptimizerConfig o_;
};

}  // namespace strata::cpu_optim
