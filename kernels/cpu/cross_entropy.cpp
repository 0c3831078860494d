// strata/kernels/cpu/cross_entropy.cpp: mean cross-entropy over the tokens, fused with d loss / d logits.
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/ops_impl.h"
#include "kernels/cpu/simd_impl.h"

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

namespace {

// The row's passes (Note [SIMD row passes] in simd_impl.h): its max in kLanes lanes, e^(l - max) by
// exp_f32 summed in kLanes double lanes, then the tail.
[[gnu::always_inline]] inline double row_body(float* di, const float* li, int target, int V, float gscale) {
  const float maxv = max_row(li, V, -INFINITY);
  const float target_logit = target >= 0 ? li[target] : 0.0f;
  // di may alias li: each li[j] is read once, before di[j] receives its exponential.
  double lane[kLanes] = {};
  int j = 0;
  if (di != nullptr) {
    for (; j + kLanes <= V; j += kLanes)
      for (int k = 0; k < kLanes; ++k) {
        const float e = exp_f32(li[j + k] - maxv);
        lane[k] += double(e);
        di[j + k] = e;
      }
  } else {
    for (; j + kLanes <= V; j += kLanes)
      for (int k = 0; k < kLanes; ++k) lane[k] += double(exp_f32(li[j + k] - maxv));
  }
  double sum = 0.0;
  for (double l : lane) sum += l;
  for (; j < V; ++j) {
    const float e = exp_f32(li[j] - maxv);
    sum += double(e);
    if (di != nullptr) di[j] = e;
  }
  const double loss = target >= 0 ? std::log(sum) - (double(target_logit) - maxv) : 0.0;
  if (di == nullptr) return loss;
  if (target < 0) {
    for (int c = 0; c < V; ++c) di[c] = 0.0f;
    return loss;
  }
  const float inv_sum = float(1.0 / sum);
  for (int c = 0; c < V; ++c) di[c] = gscale * (di[c] * inv_sum);
  di[target] -= gscale;
  return loss;
}

double row_baseline(float* di, const float* li, int target, int V, float gscale) {
  return row_body(di, li, target, V, gscale);
}
#if STRATA_SIMD_X86
[[gnu::target("avx2")]] double row_avx2(float* di, const float* li, int target, int V, float gscale) {
  return row_body(di, li, target, V, gscale);
}
[[gnu::target("avx512f,avx512bw,avx512vl")]] double row_avx512(float* di, const float* li, int target, int V,
                                                               float gscale) {
  return row_body(di, li, target, V, gscale);
}
#endif

}  // namespace

double cross_entropy_row_on(SimdTarget t, float* di, const float* li, int target, int V, float gscale) {
#if STRATA_SIMD_X86
  if (t == SimdTarget::avx512) return row_avx512(di, li, target, V, gscale);
  if (t == SimdTarget::avx2) return row_avx2(di, li, target, V, gscale);
#endif
  (void)t;
  return row_baseline(di, li, target, V, gscale);
}

double cross_entropy_row(float* di, const float* li, int target, int V, float gscale) {
  return cross_entropy_row_on(simd_target(), di, li, target, V, gscale);
}

}  // namespace impl

float cross_entropy_forward_backward(float* dlogits, float* losses, const float* logits,
                                     const std::int32_t* targets, int N, int V, float grad_scale,
                                     int n_valid) {
  return impl::cross_entropy_rows(
      losses, targets, N, V, grad_scale, n_valid, [&](std::size_t i, float gscale) {
        return impl::cross_entropy_row(dlogits != nullptr ? dlogits + i * V : nullptr, logits + i * V,
                                       targets[i], V, gscale);
      });
}

}  // namespace strata::kernels::cpu
