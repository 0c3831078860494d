// strata/kernels/cpu/adamw_impl.h: the per-call scalars of the AdamW update, shared by the CPU and CUDA
// implementations so both compute them identically (internal to kernels/).
#pragma once

#include <cstdint>

#include "kernels/cpu/ops.h"

namespace strata::kernels::cpu::impl {

struct AdamWScalars {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay;
  float bias2;      // 1 / sqrt(1 - beta2^step), or 1
  float step_size;  // -lr / (1 - beta1^step), or -lr
  float w_decay;    // -lr * weight_decay
  bool l2;          // Adam: weight decay added to the gradient
  bool decoupled;   // AdamW: decoupled weight decay
};

// Throws strata::Error when step < 1.
AdamWScalars adamw_scalars(const AdamWParams& hp, std::int64_t step);

}  // namespace strata::kernels::cpu::impl
