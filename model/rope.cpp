#include "model/rope.h"

#include <cmath>
#include <numbers>

#include "core/error.h"
#include "kernels/cpu/ops.h"

namespace strata::model {

float rope_attention_factor(const ModelConfig& cfg) {
  return cfg.rope_scaling.type == "longrope" ? float(cfg.rope_scaling.attention_factor) : 1.0f;
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
  kernels::cpu::rope_inv_freq(f.data(), HD, cfg.rope_theta);
  if (r.is_default()) return f;
  STRATA_CHECK(r.type == "llama3", "rope scaling \"", r.type,
               "\" (the config parser admits default, llama3 and longrope)");
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
