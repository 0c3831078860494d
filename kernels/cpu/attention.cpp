// strata/kernels/cpu/attention.cpp: causal self-attention with grouped-query heads, O(T^2) scores.
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/parallel_impl.h"

namespace strata::kernels::cpu {
namespace {

void check_heads(const char* op, int NH, int NKV, int HD) {
  STRATA_CHECK(NKV > 0 && NH % NKV == 0, op, ": n_heads ", NH, " must be a positive multiple of n_kv_heads ",
               NKV);
  STRATA_CHECK(HD > 0, op, ": head width ", HD, " must be positive");
}

float dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void attention_forward(float* out, float* att, const float* q, const float* k, const float* v, int B, int T,
                       int NH, int NKV, int HD) {
  check_heads("attention_forward", NH, NKV, HD);
  const int group = NH / NKV;
  const float scale = float(1.0 / std::sqrt(double(HD)));
  const std::size_t qrow = std::size_t(NH) * HD, kvrow = std::size_t(NKV) * HD;
  // One task per (b, h, t) query row.
  impl::parallel_for_each_index(std::size_t(B) * NH * T, 8, [&](std::size_t row) {
    const std::size_t t = row % T, h = (row / T) % NH, b = row / (std::size_t(T) * NH);
    const std::size_t g = h / group;
    const float* qt = q + (b * T + t) * qrow + h * HD;
    const float* kb = k + b * T * kvrow + g * HD;
    const float* vb = v + b * T * kvrow + g * HD;
    float* a = att + row * T;
    float maxv = -INFINITY;
    for (std::size_t s = 0; s <= t; ++s) {
      a[s] = dot(qt, kb + s * kvrow, HD) * scale;
      if (a[s] > maxv) maxv = a[s];
    }
    float sum = 0.0f;
    for (std::size_t s = 0; s <= t; ++s) {
      a[s] = std::exp(a[s] - maxv);
      sum += a[s];
    }
    const float inv = 1.0f / sum;
    for (std::size_t s = 0; s <= t; ++s) a[s] *= inv;
    for (std::size_t s = t + 1; s < std::size_t(T); ++s) a[s] = 0.0f;
    float* ot = out + (b * T + t) * qrow + h * HD;
    for (int d = 0; d < HD; ++d) ot[d] = 0.0f;
    for (std::size_t s = 0; s <= t; ++s) {
      const float* vs = vb + s * kvrow;
      for (int d = 0; d < HD; ++d) ot[d] += a[s] * vs[d];
    }
  });
}

// With a = att, p = pre-softmax scores: da_s = dout . v_s, dp_s = a_s (da_s - sum_s' a_s' da_s'),
// dq = scale sum_s dp_s k_s, dk_s = scale sum_(h in group, t >= s) dp_ts q_t, dv_s = sum a_ts dout_t.
void attention_backward(float* dq, float* dk, float* dv, float* scratch, const float* dout, const float* q,
                        const float* k, const float* v, const float* att, int B, int T, int NH, int NKV,
                        int HD) {
  check_heads("attention_backward", NH, NKV, HD);
  const int group = NH / NKV;
  const float scale = float(1.0 / std::sqrt(double(HD)));
  const std::size_t qrow = std::size_t(NH) * HD, kvrow = std::size_t(NKV) * HD;
  // Pass 1, one task per query row: the scaled score gradients (into scratch) and dq.
  impl::parallel_for_each_index(std::size_t(B) * NH * T, 8, [&](std::size_t row) {
    const std::size_t t = row % T, h = (row / T) % NH, b = row / (std::size_t(T) * NH);
    const std::size_t g = h / group;
    const float* gt = dout + (b * T + t) * qrow + h * HD;
    const float* kb = k + b * T * kvrow + g * HD;
    const float* vb = v + b * T * kvrow + g * HD;
    const float* a = att + row * T;
    float* dp = scratch + row * T;
    float adot = 0.0f;
    for (std::size_t s = 0; s <= t; ++s) {
      dp[s] = dot(gt, vb + s * kvrow, HD);
      adot += a[s] * dp[s];
    }
    for (std::size_t s = 0; s <= t; ++s) dp[s] = a[s] * (dp[s] - adot) * scale;
    for (std::size_t s = t + 1; s < std::size_t(T); ++s) dp[s] = 0.0f;
    float* dqt = dq + (b * T + t) * qrow + h * HD;
    for (int d = 0; d < HD; ++d) dqt[d] = 0.0f;
    for (std::size_t s = 0; s <= t; ++s) {
      const float* ks = kb + s * kvrow;
      for (int d = 0; d < HD; ++d) dqt[d] += dp[s] * ks[d];
    }
  });
  // Pass 2, one task per key/value row (b, s, g): sums over the group's heads, then t >= s, in order.
  impl::parallel_for_each_index(std::size_t(B) * NKV * T, 8, [&](std::size_t row) {
    const std::size_t s = row % T, g = (row / T) % NKV, b = row / (std::size_t(T) * NKV);
    float* dks = dk + (b * T + s) * kvrow + g * HD;
    float* dvs = dv + (b * T + s) * kvrow + g * HD;
    for (int d = 0; d < HD; ++d) dks[d] = dvs[d] = 0.0f;
    for (std::size_t h = g * group; h < (g + 1) * group; ++h) {
      const std::size_t head_rows = (b * NH + h) * T;
      for (std::size_t t = s; t < std::size_t(T); ++t) {
        const float dp = scratch[(head_rows + t) * T + s];
        const float a = att[(head_rows + t) * T + s];
        const float* qt = q + (b * T + t) * qrow + h * HD;
        const float* gt = dout + (b * T + t) * qrow + h * HD;
        for (int d = 0; d < HD; ++d) {
          dks[d] += dp * qt[d];
          dvs[d] += a * gt[d];
        }
      }
    }
  });
}

}  // namespace strata::kernels::cpu
