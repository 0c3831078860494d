#include "model/rope.h"

#include <cmath>
#include <numbers>

#include "core/error.h"
#include "kernels/cpu/ops.h"

namespace strata::model {

std::vector<float> rope_inv_freq(const ModelConfig& cfg) {
  const int HD = int(cfg.head_dim());
  std::vector<float> f(std::size_t(HD / 2));
  kernels::cpu::rope_inv_freq(f.data(), HD, cfg.rope_theta);
  const RopeScaling& r = cfg.rope_scaling;
  if (r.is_default()) return f;
  STRATA_CHECK(r.type == "llama3", "rope scaling \"", r.type,
               "\" (the config parser admits default and llama3)");
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
