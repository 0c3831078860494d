#include "tests/cpu_optim/fp32_model.h"

#include <cmath>
#include <cstring>
#include <string>

namespace strata::cpu_optim::test {
namespace {

float load(const Buf& b, DType t, std::size_t i) {
  return float(reference::widen(b.get(), t, i));
}

void store(const Buf& b, DType t, std::size_t i, float x) {
  if (t == DType::fp32)
    static_cast<float*>(b.get())[i] = x;
  else if (t == DType::bf16)
    static_cast<std::uint16_t*>(b.get())[i] = f32_to_bf16(x);
  else
    static_cast<std::uint16_t*>(b.get())[i] = f32_to_f16(x);
}

void store_out(TestShard& ts, std::size_t i, float p) {
  if (ts.c.out == Out::none) return;
  store(ts.out, ts.c.out == Out::bf16 ? DType::bf16 : DType::fp16, i, p);
}

}  // namespace

void model_adam(TestShard& ts, const AdamParams& hp, std::int64_t step, float scale) {
  const double t = double(step);
  const double bc1 = hp.bias_correction ? 1.0 - std::pow(double(hp.beta1), t) : 1.0;
  const double bc2 = hp.bias_correction ? 1.0 / std::sqrt(1.0 - std::pow(double(hp.beta2), t)) : 1.0;
  const float step_size = float(-double(hp.lr) / bc1), bias2 = float(bc2);
  const float w_decay = float(-double(hp.lr) * double(hp.weight_decay));
  const float b1 = hp.beta1, b2 = hp.beta2, omb1 = 1.0f - b1, omb2 = 1.0f - b2;
  for (std::size_t i = 0; i < ts.n; ++i) {
    float g = load(ts.g, ts.c.grad, i) * scale;
    float p = ts.params()[i];
    if (!hp.adamw && hp.weight_decay != 0.0f) g = p * hp.weight_decay + g;
    const float m = b1 * load(ts.m, ts.c.state, i) + omb1 * g;
    const float v = b2 * load(ts.v, ts.c.state, i) + omb2 * (g * g);
    const float u = m / (std::sqrt(v) * bias2 + hp.eps);
    if (hp.adamw && hp.weight_decay != 0.0f) p = p + w_decay * p;
    p = p + step_size * u;
    ts.params()[i] = p;
    store(ts.m, ts.c.state, i, m);
    store(ts.v, ts.c.state, i, v);
    store_out(ts, i, p);
  }
}

void model_adagrad(TestShard& ts, const AdagradParams& hp, float scale) {
  for (std::size_t i = 0; i < ts.n; ++i) {
    float g = load(ts.g, ts.c.grad, i) * scale;
    float p = ts.params()[i];
    if (hp.weight_decay != 0.0f) g = p * hp.weight_decay + g;
    const float v = load(ts.v, ts.c.state, i) + g * g;
    p = p + (-hp.lr) * (g / (std::sqrt(v) + hp.eps));
    ts.params()[i] = p;
    store(ts.v, ts.c.state, i, v);
    store_out(ts, i, p);
  }
}

void model_lion(TestShard& ts, const LionParams& hp, float scale) {
  const float w_decay = float(-double(hp.lr) * double(hp.weight_decay));
  for (std::size_t i = 0; i < ts.n; ++i) {
    const float g = load(ts.g, ts.c.grad, i) * scale;
    float p = ts.params()[i];
    const float m0 = load(ts.m, ts.c.state, i);
    const float c = hp.beta1 * m0 + (1.0f - hp.beta1) * g;
    const float sign = c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : c * 0.0f);
    if (hp.weight_decay != 0.0f) p = p + w_decay * p;
    p = p + (-hp.lr) * sign;
    ts.params()[i] = p;
    store(ts.m, ts.c.state, i, hp.beta2 * m0 + (1.0f - hp.beta2) * g);
    store_out(ts, i, p);
  }
}

void model_step(TestShard& ts, Opt o, std::int64_t step, float scale) {
  switch (o) {
    case Opt::adam:
    case Opt::adam_l2:
    case Opt::adamw:
      model_adam(ts, adam_params(o), step, scale);
      break;
    case Opt::adagrad:
    case Opt::adagrad_l2:
      model_adagrad(ts, adagrad_params(o), scale);
      break;
    case Opt::lion:
    case Opt::lion_wd:
      model_lion(ts, lion_params(o), scale);
      break;
  }
}

bool same_bytes(const TestShard& a, const TestShard& b, std::string* where, bool any_nan_payload) {
  const auto first_diff = [&](const Buf& x, const Buf& y, std::size_t elem, const char* name, DType t) {
    const auto* p = static_cast<const std::uint8_t*>(x.get());
    const auto* q = static_cast<const std::uint8_t*>(y.get());
    const auto is_nan = [t](const std::uint8_t* e) {
      if (t == DType::fp32) {
        float f;
        std::memcpy(&f, e, 4);
        return std::isnan(f);
      }
      std::uint16_t h;
      std::memcpy(&h, e, 2);
      return std::isnan(t == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h));
    };
    for (std::size_t i = 0; i < a.n; ++i) {
      if (any_nan_payload && is_nan(p + i * elem) && is_nan(q + i * elem)) continue;
      if (std::memcmp(p + i * elem, q + i * elem, elem) != 0) {
        *where = std::string(name) + "[" + std::to_string(i) + "]";
        return false;
      }
    }
    return true;
  };
  const std::size_t sb = dtype_bytes(a.c.state);
  const DType ot = a.c.out == Out::f16 ? DType::fp16 : DType::bf16;
  if (!first_diff(a.p, b.p, 4, "params", DType::fp32)) return false;
  if (uses_m(a.c.opt) && !first_diff(a.m, b.m, sb, "exp_avg", a.c.state)) return false;
  if (uses_v(a.c.opt) && !first_diff(a.v, b.v, sb, "exp_avg_sq", a.c.state)) return false;
  if (a.c.out != Out::none && !first_diff(a.out, b.out, 2, "out", ot)) return false;
  return true;
}

}  // namespace strata::cpu_optim::test
