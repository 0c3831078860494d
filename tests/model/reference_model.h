// tests/model/reference_model.h: a float64 Llama forward written independently of kernels/, the oracle
// for the whole-model gradient check (finite differences in double) and for the forward's loss.
//
// Parameters are read through the same ModelLayout table the model uses, from a double copy of every
// chunk laid end to end (chunk c at layout.chunk(c).flat_offset). Straight loops, no cleverness.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "model/layout.h"

namespace strata::model::testing {

class ReferenceModel {
 public:
  explicit ReferenceModel(const ModelLayout& layout) : layout_(layout), cfg_(layout.config()) {}

  // Mean cross-entropy of targets given inputs, both (B, T), over the parameters `p` (total_padded_numel).
  double loss(const std::vector<double>& p, const int32_t* inputs, const int32_t* targets, int B,
              int T) const {
    const int C = int(cfg_.d_model), V = int(cfg_.vocab_size), N = B * T;
    auto tensor = [&](int chunk, int idx) {
      const ChunkLayout& c = layout_.chunk(chunk);
      return p.data() + c.flat_offset + c.tensors[size_t(idx)].offset;
    };
    std::vector<double> x(size_t(N) * C);
    const double* wte = tensor(layout_.embedding_chunk(), kTokEmbeddings);
    for (int i = 0; i < N; ++i)
      for (int c = 0; c < C; ++c) x[size_t(i) * C + c] = wte[size_t(inputs[i]) * C + c];
    for (int l = 0; l < cfg_.n_layers; ++l) block(p, layout_.block_chunk(l), x, B, T);
    std::vector<double> xf = rmsnorm(x, tensor(layout_.head_chunk(), kFinalNorm), N);
    const double* w_head = cfg_.tie_embeddings ? tensor(layout_.embedding_chunk(), kTokEmbeddings)
                                               : tensor(layout_.head_chunk(), kLmHead);
    std::vector<double> logits = linear(xf, w_head, N, C, V);
    double total = 0;
    int valid = 0;
    for (int i = 0; i < N; ++i) {
      if (targets[i] < 0) continue;
      const double* z = logits.data() + size_t(i) * V;
      double mx = z[0];
      for (int v = 1; v < V; ++v) mx = std::max(mx, z[v]);
      double s = 0;
      for (int v = 0; v < V; ++v) s += std::exp(z[v] - mx);
      total += std::log(s) + mx - z[targets[i]];
      ++valid;
    }
    return valid ? total / valid : 0.0;
  }

 private:
  std::vector<double> rmsnorm(const std::vector<double>& x, const double* w, int N) const {
    const int C = int(cfg_.d_model);
    std::vector<double> out(x.size());
    for (int i = 0; i < N; ++i) {
      double ss = 0;
      for (int c = 0; c < C; ++c) ss += x[size_t(i) * C + c] * x[size_t(i) * C + c];
      double r = 1.0 / std::sqrt(ss / C + double(cfg_.norm_eps));
      for (int c = 0; c < C; ++c) out[size_t(i) * C + c] = x[size_t(i) * C + c] * r * w[c];
    }
    return out;
  }

  // out (N, OC) = x (N, IC) W^T, W (OC, IC).
  static std::vector<double> linear(const std::vector<double>& x, const double* w, int N, int IC, int OC) {
    std::vector<double> out(size_t(N) * OC);
    for (int i = 0; i < N; ++i)
      for (int o = 0; o < OC; ++o) {
        double s = 0;
        for (int k = 0; k < IC; ++k) s += x[size_t(i) * IC + k] * w[size_t(o) * IC + k];
        out[size_t(i) * OC + o] = s;
      }
    return out;
  }

  // Rotates pairs (i, i + D/2) of every head of x (B, T, H, D) by position t (Hugging Face rotate_half).
  void rope(std::vector<double>& x, int B, int T, int H) const {
    const int D = int(cfg_.head_dim());
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < H; ++h) {
          double* v = x.data() + ((size_t(b) * T + t) * H + h) * D;
          for (int i = 0; i < D / 2; ++i) {
            double ang = t * std::pow(double(cfg_.rope_theta), -2.0 * i / D);
            double c = std::cos(ang), s = std::sin(ang);
            double a = v[i], bb = v[i + D / 2];
            v[i] = a * c - bb * s;
            v[i + D / 2] = bb * c + a * s;
          }
        }
  }

  void block(const std::vector<double>& p, int chunk, std::vector<double>& x, int B, int T) const {
    const ChunkLayout& cl = layout_.chunk(chunk);
    auto w = [&](int idx) { return p.data() + cl.flat_offset + cl.tensors[size_t(idx)].offset; };
    const int N = B * T, C = int(cfg_.d_model), F = int(cfg_.ffn_dim), D = int(cfg_.head_dim());
    const int NH = int(cfg_.n_heads), NKV = int(cfg_.n_kv_heads), group = NH / NKV;

    std::vector<double> xn = rmsnorm(x, w(kAttnNorm), N);
    std::vector<double> q = linear(xn, w(kWq), N, C, NH * D);
    std::vector<double> k = linear(xn, w(kWk), N, C, NKV * D);
    std::vector<double> v = linear(xn, w(kWv), N, C, NKV * D);
    rope(q, B, T, NH);
    rope(k, B, T, NKV);
    std::vector<double> y(size_t(N) * NH * D, 0.0);
    const double scale = 1.0 / std::sqrt(double(D));
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < NH; ++h) {
        const int g = h / group;
        for (int t = 0; t < T; ++t) {
          const double* qv = q.data() + ((size_t(b) * T + t) * NH + h) * D;
          std::vector<double> s(size_t(t) + 1);
          double mx = -1e300;
          for (int u = 0; u <= t; ++u) {
            const double* kv = k.data() + ((size_t(b) * T + u) * NKV + g) * D;
            double d = 0;
            for (int i = 0; i < D; ++i) d += qv[i] * kv[i];
            s[size_t(u)] = d * scale;
            mx = std::max(mx, s[size_t(u)]);
          }
          double sum = 0;
          for (double& e : s) sum += (e = std::exp(e - mx));
          double* yv = y.data() + ((size_t(b) * T + t) * NH + h) * D;
          for (int u = 0; u <= t; ++u) {
            const double* vv = v.data() + ((size_t(b) * T + u) * NKV + g) * D;
            for (int i = 0; i < D; ++i) yv[i] += s[size_t(u)] / sum * vv[i];
          }
        }
      }
    std::vector<double> o = linear(y, w(kWo), N, NH * D, C);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    std::vector<double> xn2 = rmsnorm(x, w(kFfnNorm), N);
    std::vector<double> gate = linear(xn2, w(kWGate), N, C, F);
    std::vector<double> up = linear(xn2, w(kWUp), N, C, F);
    for (size_t i = 0; i < gate.size(); ++i) gate[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
    std::vector<double> down = linear(gate, w(kWDown), N, F, C);
    for (size_t i = 0; i < x.size(); ++i) x[i] += down[i];
  }

  const ModelLayout& layout_;
  ModelConfig cfg_;
};

}  // namespace strata::model::testing
