// strata/kernels/cpu/adamw.cpp: the AdamW update with DeepSpeed CPU Adam's arithmetic (see ops.h).
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/adamw_impl.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/parallel_impl.h"

namespace strata::kernels::cpu {

impl::AdamWScalars impl::adamw_scalars(const AdamWParams& hp, std::int64_t step) {
  STRATA_CHECK(step >= 1, "adamw_update: step ", step, " must be at least 1 (it counts this update)");
  const double t = double(step);
  const double bc1 = hp.bias_correction ? 1.0 - std::pow(double(hp.beta1), t) : 1.0;
  const double bc2 = hp.bias_correction ? 1.0 / std::sqrt(1.0 - std::pow(double(hp.beta2), t)) : 1.0;
  AdamWScalars s;
  s.beta1 = hp.beta1;
  s.beta2 = hp.beta2;
  s.one_minus_beta1 = 1.0f - hp.beta1;
  s.one_minus_beta2 = 1.0f - hp.beta2;
  s.eps = hp.eps;
  s.weight_decay = hp.weight_decay;
  s.bias2 = float(bc2);
  s.step_size = float(-double(hp.lr) / bc1);
  s.w_decay = float(-double(hp.lr) * double(hp.weight_decay));
  s.l2 = !hp.adamw_mode && hp.weight_decay != 0.0f;
  s.decoupled = hp.adamw_mode && hp.weight_decay != 0.0f;
  return s;
}

void adamw_update(float* p, const float* g, float* m, float* v, bf16_t* p_bf16, std::size_t n,
                  const AdamWParams& hp, std::int64_t step, float grad_scale) {
  const impl::AdamWScalars s = impl::adamw_scalars(hp, step);
  impl::parallel_for_range(n, impl::kElementGrain, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) {
      float grad = g[i] * grad_scale, param = p[i];
      if (s.l2) grad = param * s.weight_decay + grad;
      const float mi = s.beta1 * m[i] + s.one_minus_beta1 * grad;
      const float vi = s.beta2 * v[i] + s.one_minus_beta2 * (grad * grad);
      const float update = mi / (std::sqrt(vi) * s.bias2 + s.eps);
      if (s.decoupled) param = param + s.w_decay * param;
      param = param + s.step_size * update;
      m[i] = mi;
      v[i] = vi;
      p[i] = param;
      if (p_bf16 != nullptr) p_bf16[i] = f32_to_bf16(param);
    }
  });
}

}  // namespace strata::kernels::cpu
