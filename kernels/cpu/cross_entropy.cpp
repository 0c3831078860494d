// strata/kernels/cpu/cross_entropy.cpp: mean cross-entropy over the tokens, fused with d loss / d logits.
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/parallel_impl.h"

namespace strata::kernels::cpu {

float cross_entropy_forward_backward(float* dlogits, float* losses, const float* logits,
                                     const std::int32_t* targets, int N, int V, float grad_scale) {
  int n_valid = 0;
  for (int i = 0; i < N; ++i) {
    if (targets[i] >= V)
      throw Error(::strata::detail::cat("cross_entropy: target ", targets[i], " at position ", i,
                                        " is outside the vocabulary [0, ", V,
                                        "); negative targets are ignored"));
    if (targets[i] >= 0) ++n_valid;
  }
  const float gscale = n_valid > 0 ? float(double(grad_scale) / n_valid) : 0.0f;
  std::vector<double> row_loss(N, 0.0);
  impl::parallel_for_each_index(std::size_t(N), 1, [&](std::size_t i) {
    const float* li = logits + i * V;
    const int target = targets[i];
    float maxv = -INFINITY;
    for (int j = 0; j < V; ++j) maxv = li[j] > maxv ? li[j] : maxv;
    const float target_logit = target >= 0 ? li[target] : 0.0f;
    // dlogits may alias logits: each li[j] is read once, before di[j] receives its exponential.
    float* di = dlogits != nullptr ? dlogits + i * V : nullptr;
    double sum = 0.0;
    for (int j = 0; j < V; ++j) {
      const float e = std::exp(li[j] - maxv);
      sum += e;
      if (di != nullptr) di[j] = e;
    }
    if (target >= 0) row_loss[i] = std::log(sum) - (double(target_logit) - maxv);
    if (di == nullptr) return;
    if (target < 0) {
      for (int j = 0; j < V; ++j) di[j] = 0.0f;
      return;
    }
    const float inv_sum = float(1.0 / sum);
    for (int j = 0; j < V; ++j) di[j] = gscale * (di[j] * inv_sum);
    di[target] -= gscale;
  });
  double total = 0.0;
  for (int i = 0; i < N; ++i) {
    total += row_loss[i];
    if (losses != nullptr) losses[i] = float(row_loss[i]);
  }
  return n_valid > 0 ? float(total / n_valid) : 0.0f;
}

}  // namespace strata::kernels::cpu
