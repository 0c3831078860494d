// An optimizer type's facts and its dispatch (rule.h): the one place that switches on OptimizerType.
#include "cpu_optim/rule.h"

namespace strata::cpu_optim {

const char* Rule::name() const {
  switch (o_.type) {
    case OptimizerType::Adam:
      return "Adam";
    case OptimizerType::AdamW:
      return "AdamW";
    case OptimizerType::Adagrad:
      return "Adagrad";
    case OptimizerType::Lion:
      return "Lion";
  }
  return "?";
}

AdamParams Rule::adam(double lr) const {
  return {.lr = float(lr),
          .beta1 = float(o_.betas[0]),
          .beta2 = float(o_.betas[1]),
          .eps = float(o_.eps),
          .weight_decay = float(o_.weight_decay),
          .adamw = decoupled_decay(),
          .bias_correction = o_.bias_correction};
}

AdagradParams Rule::adagrad(double lr) const {
  return {.lr = float(lr), .eps = float(o_.eps), .weight_decay = float(o_.weight_decay)};
}

LionParams Rule::lion(double lr) const {
  return {.lr = float(lr),
          .beta1 = float(o_.betas[0]),
          .beta2 = float(o_.betas[1]),
          .weight_decay = float(o_.weight_decay)};
}

bool Rule::step(Optimizer& opt, ShardStep& st, double lr, std::int64_t step_no, const Shard& shard,
                float grad_scale) const {
  switch (o_.type) {
    case OptimizerType::Adam:
    case OptimizerType::AdamW:
      return opt.adam(st, adam(lr), step_no, shard, grad_scale);
    case OptimizerType::Adagrad:
      return opt.adagrad(st, adagrad(lr), step_no, shard, grad_scale);
    case OptimizerType::Lion:
      return opt.lion(st, lion(lr), step_no, shard, grad_scale);
  }
  return false;
}

}  // namespace strata::cpu_optim
