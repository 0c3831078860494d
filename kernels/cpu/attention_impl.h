// strata/kernels/cpu/attention_impl.h: the row passes of the fp32 causal attention (attention.cpp).
// Internal to kernels/cpu.
#pragma once

#include <cmath>
#include <cstddef>

namespace strata::kernels::cpu::impl {

// Row t of a (T, T) score block: a[s] = softmax over s <= t of scale * a[s]; exact zeros above the
// diagonal (so the products that read the block add nothing from masked positions). scale 1 leaves the
// scores as they are (the fp32 path folds 1/sqrt(HD) into its product).
inline void causal_softmax_row(float* a, std::size_t t, std::size_t T, float scale) {
  float maxv = -INFINITY;
  for (std::size_t s = 0; s <= t; ++s) {
    a[s] *= scale;
    maxv = a[s] > maxv ? a[s] : maxv;
  }
  float sum = 0.0f;
  for (std::size_t s = 0; s <= t; ++s) {
    a[s] = std::exp(a[s] - maxv);
    sum += a[s];
  }
  const float inv = 1.0f / sum;
  for (std::size_t s = 0; s <= t; ++s) a[s] *= inv;
  for (std::size_t s = t + 1; s < T; ++s) a[s] = 0.0f;
}

// Row t of the softmax's gradient: dp = a (dp - rowsum(a dp)) * scale, zeros above the diagonal.
inline void causal_softmax_grad_row(float* dp, const float* a, std::size_t t, std::size_t T, float scale) {
  float adot = 0.0f;
  for (std::size_t s = 0; s <= t; ++s) adot += a[s] * dp[s];
  for (std::size_t s = 0; s <= t; ++s) dp[s] = a[s] * (dp[s] - adot) * scale;
  for (std::size_t s = t + 1; s < T; ++s) dp[s] = 0.0f;
}

}  // namespace strata::kernels::cpu::impl
