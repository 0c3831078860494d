// strata/cpu_optim/reference.cpp: the float64 scalar reference (see reference.h).
#include "cpu_optim/reference.h"

#include <bit>
#include <cmath>

namespace strata::cpu_optim::reference {

State make_state(std::size_t n, const float* p, const void* m, const void* v, DType state_dtype) {
  State s;
  s.state_dtype = state_dtype;
  s.p.resize(n);
  s.m.assign(n, 0.0);
  s.v.assign(n, 0.0);
  s.slack.assign(n, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    s.p[i] = p[i];
    if (m != nullptr) s.m[i] = widen(m, state_dtype, i);
    if (v != nullptr) s.v[i] = widen(v, state_dtype, i);
  }
  return s;
}

double round_to_bf16(double x) {
  if (!std::isfinite(x) || x == 0.0) return x;
  const double ax = std::fabs(x);
  if (ax >= 0x1p-126 && ax < 0x1p127) {
    // Normal bf16 range: round the double's 52-bit fraction to bf16's 7 bits, ties to even, in integer
    // arithmetic (a carry into the exponent is the correct result).
    std::uint64_t bits = std::bit_cast<std::uint64_t>(x);
    bits += (std::uint64_t(1) << 44) - 1 + ((bits >> 45) & 1);
    return std::bit_cast<double>(bits & ~((std::uint64_t(1) << 45) - 1));
  }
  int e = 0;
  std::frexp(x, &e);  // |x| = f * 2^e, f in [0.5, 1)
  // bf16 keeps 8 significant bits; below fp32's normal range its step stays 2^-133.
  const double ulp = std::ldexp(1.0, std::max(e - 8, -133));
  const double r = std::nearbyint(x / ulp) * ulp;  // ties to even in the default rounding mode
  return std::fabs(r) >= 0x1p128 ? std::copysign(INFINITY, x) : r;
}

namespace {

void store_states(State& s, std::size_t i) {
  if (s.state_dtype == DType::bf16) {
    s.m[i] = round_to_bf16(s.m[i]);
    s.v[i] = round_to_bf16(s.v[i]);
  }
}

}  // namespace

void adam(State& s, const std::vector<double>& g, const AdamParams& hp, std::int64_t step) {
  const double b1 = hp.beta1, b2 = hp.beta2, lr = hp.lr, wd = hp.weight_decay, t = double(step);
  const double bc1 = hp.bias_correction ? 1.0 - std::pow(b1, t) : 1.0;
  const double bc2 = hp.bias_correction ? 1.0 - std::pow(b2, t) : 1.0;
  for (std::size_t i = 0; i < s.p.size(); ++i) {
    double gi = g[i];
    if (!hp.adamw) gi += wd * s.p[i];
    s.m[i] = b1 * s.m[i] + (1.0 - b1) * gi;
    s.v[i] = b2 * s.v[i] + (1.0 - b2) * gi * gi;
    const double u = s.m[i] / (std::sqrt(s.v[i] / bc2) + double(hp.eps));
    if (hp.adamw) s.p[i] *= 1.0 - lr * wd;
    s.p[i] -= lr / bc1 * u;
    store_states(s, i);
  }
}

void adagrad(State& s, const std::vector<double>& g, const AdagradParams& hp) {
  for (std::size_t i = 0; i < s.p.size(); ++i) {
    const double gi = g[i] + double(hp.weight_decay) * s.p[i];
    s.v[i] += gi * gi;
    s.p[i] -= double(hp.lr) * gi / (std::sqrt(s.v[i]) + double(hp.eps));
    store_states(s, i);
  }
}

void lion(State& s, const std::vector<double>& g, const LionParams& hp) {
  const double b1 = hp.beta1, b2 = hp.beta2, lr = hp.lr;
  for (std::size_t i = 0; i < s.p.size(); ++i) {
    const double t1 = b1 * s.m[i], t2 = (1.0 - b1) * g[i];
    const double c = t1 + t2;
    if (std::fabs(c) <= 1e-5 * (std::fabs(t1) + std::fabs(t2))) s.slack[i] += 2.0 * lr;
    const double sign = c > 0 ? 1.0 : (c < 0 ? -1.0 : 0.0);
    s.p[i] = s.p[i] * (1.0 - lr * double(hp.weight_decay)) - lr * sign;
    s.m[i] = b2 * s.m[i] + (1.0 - b2) * g[i];
    store_states(s, i);
  }
}

long double sum_sq(const void* grads, DType t, std::size_t n, float scale) {
  long double s = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float x = float(widen(grads, t, i)) * scale;
    s += (long double)x * x;
  }
  return s;
}

}  // namespace strata::cpu_optim::reference
