// strata/kernels/cpu/adamw.cpp: the AdamW update with DeepSpeed CPU Adam's arithmetic (see ops.h).
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/parallel_impl.h"

namespace strata::kernels::cpu {

void adamw_update(float* p, const float* g, float* m, float* v, bf16_t* p_bf16, std::size_t n,
                  const AdamWParams& hp, std::int64_t step, float grad_scale) {
  STRATA_CHECK(step >= 1, "adamw_update: step ", step, " must be at least 1 (it counts this update)");
  const double bc1 = hp.bias_correction ? 1.0 - std::pow(double(hp.beta1), double(step)) : 1.0;
  const double bc2 =
      hp.bias_correction ? 1.0 / std::sqrt(1.0 - std::pow(double(hp.beta2), double(step))) : 1.0;
  const float step_size = float(-double(hp.lr) / bc1);
  const float bias2 = float(bc2);
  const float w_decay = float(-double(hp.lr) * hp.weight_decay);
  const float b1 = hp.beta1, b2 = hp.beta2, one_minus_b1 = 1.0f - b1, one_minus_b2 = 1.0f - b2, eps = hp.eps;
  const bool l2 = !hp.adamw_mode && hp.weight_decay != 0.0f;
  const bool decoupled = hp.adamw_mode && hp.weight_decay != 0.0f;
  impl::parallel_for_range(n, impl::kElementGrain, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) {
      float grad = g[i] * grad_scale, param = p[i];
      if (l2) grad = param * hp.weight_decay + grad;
      const float mi = b1 * m[i] + one_minus_b1 * grad;
      const float vi = b2 * v[i] + one_minus_b2 * (grad * grad);
      const float denom = std::sqrt(vi) * bias2 + eps;
      const float update = mi / denom;
      if (decoupled) param = param + w_decay * param;
      param = param + step_size * update;
      m[i] = mi;
      v[i] = vi;
      p[i] = param;
      if (p_bf16 != nullptr) p_bf16[i] = f32_to_bf16(param);
    }
  });
}

}  // namespace strata::kernels::cpu
