// strata/kernels/cpu/attention_impl.h: the row passes of the fp32 causal attention (attention.cpp).
// Internal to kernels/cpu.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace strata::kernels::cpu::impl {

// The first key row t sees: t - window + 1 with a sliding window (kernels/cpu/ops.h), else 0.
inline std::size_t band_start(std::size_t t, int window) {
  return window > 0 && t >= std::size_t(window) ? t - std::size_t(window) + 1 : 0;
}

// The first key row t sees (Note [Document masks] in ops.h): band_start(t, window), or, with `pos` (the
// row's positions, (T) i32), the start of t's document t - pos[t] where that is later.
inline std::size_t first_key(std::size_t t, int window, const std::int32_t* pos) {
  const std::size_t lo = band_start(t, window);
  if (!pos) return lo;
  const std::size_t back = std::size_t(std::max<std::int32_t>(pos[t], 0));
  return std::max(lo, back < t ? t - back : 0);
}

// Row t of a (T, T) score block: a[s] = softmax over lo <= s <= t of scale * a[s]; exact zeros outside
// (so the products that read the block add nothing from masked positions). lo is band_start(t, window):
// 0 for plain causal attention. scale 1 leaves the scores as they are (the fp32 path folds 1/sqrt(HD) into
// its product).
inline void causal_softmax_row(float* a, std::size_t t, std::size_t T, float scale, std::size_t lo) {
  float maxv = -INFINITY;
  for (std::size_t s = lo; s <= t; ++s) {
    a[s] *= scale;
    maxv = a[s] > maxv ? a[s] : maxv;
  }
  float sum = 0.0f;
  for (std::size_t s = lo; s <= t; ++s) {
    a[s] = std::exp(a[s] - maxv);
    sum += a[s];
  }
  const float inv = 1.0f / sum;
  for (std::size_t s = lo; s <= t; ++s) a[s] *= inv;
  for (std::size_t s = 0; s < lo; ++s) a[s] = 0.0f;
  for (std::size_t s = t + 1; s < T; ++s) a[s] = 0.0f;
}

// Row t of the softmax's gradient: dp = a (dp - rowsum(a dp)) * scale over lo <= s <= t, zeros outside.
inline void causal_softmax_grad_row(float* dp, const float* a, std::size_t t, std::size_t T, float scale,
                                    std::size_t lo) {
  float adot = 0.0f;
  for (std::size_t s = lo; s <= t; ++s) adot += a[s] * dp[s];
  for (std::size_t s = lo; s <= t; ++s) dp[s] = a[s] * (dp[s] - adot) * scale;
  for (std::size_t s = 0; s < lo; ++s) dp[s] = 0.0f;
  for (std::size_t s = t + 1; s < T; ++s) dp[s] = 0.0f;
}

}  // namespace strata::kernels::cpu::impl
