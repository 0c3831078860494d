#include "model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"
#include "kernels/cpu/ops.h"

namespace strata::model {
namespace {

// Note [Rope arithmetic]: transformers computes inv_freq with torch fp32 tensors and python floats
// (doubles). A python scalar meets an fp32 tensor as an fp32 value (fp32(factor) · t); a / t is
// t.reciprocal() · a (torch's __rtruediv__); python-float steps (YaRN's correction range, its attention
// factor) are double here too. theta ** (fp32(2i) / fp32(HD)) is torch's vectorised fp32 pow, which is within
// one ulp but not always correctly rounded: pos_freq rounds the exact power of the same fp32 inputs, so a
// frequency may differ from transformers' in its last bit where torch's pow does (tests/model/rope_test.cpp
// counts them). rope_theta is fp32 in ModelConfig; the usual bases (1e4, 5e5, 1e6) are exact in it, others
// reach YaRN's python-float ln(theta) rounded to fp32.

// transformers' pos_freqs_i = theta ** (arange(0, HD, 2).float() / HD), in fp32.
float pos_freq(float theta, int i, int HD) {
  return float(std::pow(double(theta), double(float(2 * i) / float(HD))));
}

// transformers' _compute_yarn_parameters.
void yarn_inv_freq(std::vector<float>& f, const RopeScaling& r, float theta, int HD) {
  const double fast = r.beta_fast.value_or(0.0) != 0.0 ? *r.beta_fast : 32.0;  // python's `or`
  const double slow = r.beta_slow.value_or(0.0) != 0.0 ? *r.beta_slow : 1.0;
  const double omp = double(r.original_max_position_embeddings);
  // find_correction_dim: the dimension whose frequency turns `rotations` times in the original context.
  auto correction_dim = [&](double rotations) {
    return (HD * std::log(omp / (rotations * 2 * std::numbers::pi))) / (2 * std::log(double(theta)));
  };
  double low = correction_dim(fast), high = correction_dim(slow);
  if (r.truncate.value_or(true)) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0);
  high = std::min(high, double(HD - 1));
  if (low == high) high += 0.001;  // linear_ramp_factor's guard against a zero-width ramp
  const float factor = float(r.factor), low_f = float(low), span = float(high - low);
  for (std::size_t i = 0; i < f.size(); ++i) {
    const float pos = pos_freq(theta, int(i), HD);
    const float extrapolation = 1.0f / pos, interpolation = 1.0f / (factor * pos);
    const float ramp = std::clamp((float(i) - low_f) / span, 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    f[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
}

}  // namespace

float rope_attention_factor(const ModelConfig& cfg) {
  const RopeScaling& r = cfg.rope_scaling;
  return r.type == "longrope" || r.type == "yarn" ? float(r.attention_factor) : 1.0f;
}

std::vector<float> rope_inv_freq(const ModelConfig& cfg, int T) {
  const int HD = int(cfg.head_dim());
  std::vector<float> f(std::size_t(HD / 2));
  const RopeScaling& r = cfg.rope_scaling;
  if (r.type == "longrope") {
    const std::vector<double>& e = T > r.original_max_position_embeddings ? r.long_factor : r.short_factor;
    STRATA_CHECK(e.size() == f.size(), "longrope factors: ", e.size(), " for ", f.size(), " frequencies");
    for (std::size_t i = 0; i < f.size(); ++i)
      f[i] = 1.0f / (float(e[i]) * std::pow(cfg.rope_theta, float(2 * i) / float(HD)));
    return f;
  }
  if (r.type == "linear") {
    for (std::size_t i = 0; i < f.size(); ++i)
      f[i] = (1.0f / pos_freq(cfg.rope_theta, int(i), HD)) / float(r.factor);
    return f;
  }
  if (r.type == "yarn") {
    yarn_inv_freq(f, r, cfg.rope_theta, HD);
    return f;
  }
  kernels::cpu::rope_inv_freq(f.data(), HD, cfg.rope_theta);
  if (r.is_default()) return f;
  STRATA_CHECK(r.type == "llama3", "rope scaling \"", r.type,
               "\" (the config parser admits default, linear, llama3, yarn and longrope)");
  // Python scalars meet fp32 tensors as fp32 values; a / t is t.reciprocal() * a (torch's __rtruediv__).
  const float factor = float(r.factor), low = float(r.low_freq_factor);
  const float old_len = float(r.original_max_position_embeddings);
  const float low_wavelen = float(double(r.original_max_position_embeddings) / r.low_freq_factor);
  const float high_wavelen = float(double(r.original_max_position_embeddings) / r.high_freq_factor);
  const float two_pi = float(2.0 * std::numbers::pi);
  const float span = float(r.high_freq_factor - r.low_freq_factor);
  for (float& inv : f) {
    const float wavelen = (1.0f / inv) * two_pi;
    const float scaled = wavelen > low_wavelen ? inv / factor : inv;
    const float smooth = ((1.0f / wavelen) * old_len - low) / span;
    const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    inv = medium ? smoothed : scaled;
  }
  return f;
}

}  // namespace strata::model
