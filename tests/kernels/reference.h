// tests/kernels/reference.h: float64 re-implementations of the CPU ops' forward passes, written as plain
// loops straight from the definitions (independent of kernels/cpu), and the helpers the tests share.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"

namespace strata::kernels::test {

using Vec = std::vector<double>;

inline std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// `n` values of `dtype` (fp32, bf16 or fp16) as stored in `raw`, widened to float exactly.
inline std::vector<float> widen(const void* raw, DType dtype, std::size_t n) {
  std::vector<float> v(n);
  const char* p = static_cast<const char*>(raw);
  for (std::size_t i = 0; i < n; ++i) {
    if (dtype == DType::fp32) {
      std::memcpy(&v[i], p + 4 * i, 4);
      continue;
    }
    std::uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    v[i] = dtype == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
  }
  return v;
}

// Each value rounded to bf16 (core's rounding), as bit patterns; and bf16 patterns widened to float (exact).
inline std::vector<std::uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<std::uint16_t> b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
  return b;
}
inline std::vector<float> from_bf16(const std::vector<std::uint16_t>& b) {
  std::vector<float> v(b.size());
  for (std::size_t i = 0; i < b.size(); ++i) v[i] = bf16_to_f32(b[i]);
  return v;
}

inline Vec to_double(const std::vector<float>& v) {
  return Vec(v.begin(), v.end());
}

// ||a - b|| / ||b||; infinity if anything is NaN, so a NaN never passes a bound.
template <typename A, typename B>
double rel_l2(const A& a, const B& b) {
  double num = 0.0, den = 0.0;
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = double(a[i]), y = double(b[i]);
    if (std::isnan(x) || std::isnan(y)) return std::numeric_limits<double>::infinity();
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

// The gradient of L(x) = sum_j dout[j] * f(x)[j] with respect to input tensor `which`, by central
// differences in float64.
inline Vec fd_grad(const std::function<Vec(const std::vector<Vec>&)>& f, std::vector<Vec> inputs,
                   std::size_t which, const Vec& dout, double h = 1e-6) {
  Vec g(inputs[which].size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double x0 = inputs[which][i];
    inputs[which][i] = x0 + h;
    const Vec up = f(inputs);
    inputs[which][i] = x0 - h;
    const Vec down = f(inputs);
    inputs[which][i] = x0;
    double s = 0.0;
    for (std::size_t j = 0; j < dout.size(); ++j) s += dout[j] * (up[j] - down[j]);
    g[i] = s / (2 * h);
  }
  return g;
}

// ---- float64 forwards -------------------------------------------------------------------------------

// out = x * rstd * (w + w_offset) (w_offset 1: Gemma's norm).
inline Vec ref_rmsnorm(const Vec& x, const Vec& w, int N, int C, double eps, double w_offset = 0.0) {
  Vec out(x.size());
  for (int i = 0; i < N; ++i) {
    double ms = 0.0;
    for (int c = 0; c < C; ++c) ms += x[i * C + c] * x[i * C + c];
    const double r = 1.0 / std::sqrt(ms / C + eps);
    for (int c = 0; c < C; ++c) out[i * C + c] = x[i * C + c] * r * (w[c] + w_offset);
  }
  return out;
}

// out (N,OC) = x (N,IC) W^T, W (OC,IC).
inline Vec ref_linear(const Vec& x, const Vec& w, int N, int IC, int OC) {
  Vec out(std::size_t(N) * OC, 0.0);
  for (int i = 0; i < N; ++i)
    for (int o = 0; o < OC; ++o)
      for (int c = 0; c < IC; ++c) out[i * OC + o] += x[i * IC + c] * w[o * IC + c];
  return out;
}

// Hugging Face's apply_rotary_pos_emb on a (B,T,H,HD) tensor: x * cos + rotate_half(x) * sin with
// rotate_half(x) = cat(-x2, x1) and cos/sin = cat(freqs, freqs); row (b, t) at position t, or with `pos`
// ((B,T), position_ids) at pos[b * T + t].
inline Vec ref_rope(const Vec& x, int B, int T, int H, int HD, double theta,
                    const std::vector<std::int32_t>* pos = nullptr) {
  Vec out(x.size());
  const int half = HD / 2;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        const double* xh = &x[((std::size_t(b) * T + t) * H + h) * HD];
        double* oh = &out[((std::size_t(b) * T + t) * H + h) * HD];
        const double p = pos ? double((*pos)[std::size_t(b) * T + t]) : double(t);
        for (int d = 0; d < HD; ++d) {
          const double freq = std::pow(theta, -double(2 * (d % half)) / HD);
          const double rot = d < half ? -xh[d + half] : xh[d - half];
          oh[d] = xh[d] * std::cos(p * freq) + rot * std::sin(p * freq);
        }
      }
  return out;
}

// transformers' find_packed_sequence_indices: the sequence each token of a row belongs to, a new one
// wherever position_ids do not go up by one (pos (B,T)).
inline std::vector<int> ref_packed_sequences(const std::vector<std::int32_t>& pos, int B, int T) {
  std::vector<int> seq(pos.size());
  for (int b = 0; b < B; ++b)
    for (int t = 0, n = 0; t < T; ++t) {
      const std::size_t i = std::size_t(b) * T + t;
      if (t > 0 && pos[i] != pos[i - 1] + 1) ++n;
      seq[i] = n;
    }
  return seq;
}

// Causal softmax attention; query head h reads key/value head h / (NH / NKV) (HF's repeat_kv). With a
// sliding window w > 0, query t attends to keys u with t - w < u <= t only (transformers'
// sliding_window_causal_mask_function: kv_idx > q_idx - sliding_window and kv_idx <= q_idx). With `pos`
// ((B,T) position_ids), only to keys of its own packed sequence as well (transformers'
// packed_sequence_mask_function over ref_packed_sequences).
inline Vec ref_attention(const Vec& q, const Vec& k, const Vec& v, int B, int T, int NH, int NKV, int HD,
                         int window = 0, const std::vector<std::int32_t>* pos = nullptr) {
  Vec out(q.size(), 0.0);
  const int rep = NH / NKV;
  const std::vector<int> seq = pos ? ref_packed_sequences(*pos, B, T) : std::vector<int>{};
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const int g = h / rep;
        Vec s(t + 1, -std::numeric_limits<double>::infinity());  // outside the mask: e^(-inf) = 0 below
        double mx = -1e300;
        for (int u = 0; u <= t; ++u) {
          if (window > 0 && u <= t - window) continue;
          if (pos && seq[std::size_t(b) * T + u] != seq[std::size_t(b) * T + t]) continue;
          double d = 0.0;
          for (int e = 0; e < HD; ++e)
            d += q[((std::size_t(b) * T + t) * NH + h) * HD + e] *
                 k[((std::size_t(b) * T + u) * NKV + g) * HD + e];
          s[u] = d / std::sqrt(double(HD));
          mx = std::max(mx, s[u]);
        }
        double z = 0.0;
        for (auto& x : s) z += (x = std::exp(x - mx));
        for (int u = 0; u <= t; ++u)
          for (int e = 0; e < HD; ++e)
            out[((std::size_t(b) * T + t) * NH + h) * HD + e] +=
                s[u] / z * v[((std::size_t(b) * T + u) * NKV + g) * HD + e];
      }
  return out;
}

inline Vec ref_swiglu(const Vec& gate, const Vec& up) {
  Vec out(gate.size());
  for (std::size_t i = 0; i < gate.size(); ++i) out[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
  return out;
}

// PyTorch's gelu(approximate="tanh") times up.
inline Vec ref_geglu(const Vec& gate, const Vec& up) {
  const double k0 = std::sqrt(2.0 / 3.14159265358979323846);
  Vec out(gate.size());
  for (std::size_t i = 0; i < gate.size(); ++i) {
    const double z = gate[i];
    out[i] = 0.5 * z * (1.0 + std::tanh(k0 * (z + 0.044715 * z * z * z))) * up[i];
  }
  return out;
}

// out (N,OC) = x (N,OC) + b broadcast over rows.
inline Vec ref_bias(const Vec& x, const Vec& b, int N, int OC) {
  Vec out(x.size());
  for (int i = 0; i < N; ++i)
    for (int c = 0; c < OC; ++c) out[std::size_t(i) * OC + c] = x[std::size_t(i) * OC + c] + b[c];
  return out;
}

// Mean over rows with target >= 0 of -log softmax(logits)[target].
inline double ref_cross_entropy(const Vec& logits, const std::vector<std::int32_t>& targets, int N, int V) {
  double total = 0.0;
  int n_valid = 0;
  for (int i = 0; i < N; ++i) {
    if (targets[i] < 0) continue;
    double mx = -1e300, z = 0.0;
    for (int j = 0; j < V; ++j) mx = std::max(mx, logits[i * V + j]);
    for (int j = 0; j < V; ++j) z += std::exp(logits[i * V + j] - mx);
    total += std::log(z) - (logits[i * V + targets[i]] - mx);
    ++n_valid;
  }
  return n_valid ? total / n_valid : 0.0;
}

}  // namespace strata::kernels::test
