// strata/kernels/cpu/cross_entropy.cpp: mean cross-entropy over the tokens, fused with d loss / d logits.
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/ops_impl.h"

namespace strata::kernels::cpu {

namespace impl {

int cross_entropy_valid_rows(const std::int32_t* targets, int N, int V) {
  int n_valid = 0;
  for (int i = 0; i < N; ++i) {
    if (targets[i] >= V)
      throw Error(::strata::detail::cat("cross_entropy: target ", targets[i], " at position ", i,
                                        " is outside the vocabulary [0, ", V,
                                        "); negative targets are ignored"));
    if (targets[i] >= 0) ++n_valid;
  }
  return n_valid;
}

double cross_entropy_row(float* di, const float* li, int target, int V, float gscale) {
  float maxv = -INFINITY;
  for (int j = 0; j < V; ++j) maxv = li[j] > maxv ? li[j] : maxv;
  const float target_logit = target >= 0 ? li[target] : 0.0f;
  // di may alias li: each li[j] is read once, before di[j] receives its exponential.
  double sum = 0.0;
  for (int j = 0; j < V; ++j) {
    const float e = std::exp(li[j] - maxv);
    sum += e;
    if (di != nullptr) di[j] = e;
  }
  const double loss = target >= 0 ? std::log(sum) - (double(target_logit) - maxv) : 0.0;
  if (di == nullptr) return loss;
  if (target < 0) {
    for (int j = 0; j < V; ++j) di[j] = 0.0f;
    return loss;
  }
  const float inv_sum = float(1.0 / sum);
  for (int j = 0; j < V; ++j) di[j] = gscale * (di[j] * inv_sum);
  di[target] -= gscale;
  return loss;
}

}  // namespace impl

float cross_entropy_forward_backward(float* dlogits, float* losses, const float* logits,
                                     const std::int32_t* targets, int N, int V, float grad_scale) {
  return impl::cross_entropy_rows(losses, targets, N, V, grad_scale, [&](std::size_t i, float gscale) {
    return impl::cross_entropy_row(dlogits != nullptr ? dlogits + i * V : nullptr, logits + i * V, targets[i],
                                   V, gscale);
  });
}

}  // namespace strata::kernels::cpu
