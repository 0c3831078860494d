// strata/model/rope.h: the rotary embedding's inverse frequencies for a model config, Hugging Face's
// formulas in Hugging Face's fp32 arithmetic.
//
// Example:
//   std::vector<float> f = strata::model::rope_inv_freq(cfg);   // head_dim / 2 values
//   ops.rope_cache(cos, sin, T, int(cfg.head_dim()), f);
//
// "default": inv_freq_i = fp32(theta^(-2i/HD)) (kernels/cpu's rope_inv_freq).
// "linear" (factor s):  inv_freq_i = (1 / p_i) / s, with p_i = fp32(theta^(fp32(2i) / HD)) (transformers'
//   pos_freqs: the same power, rounded to fp32 before the reciprocal).
// "llama3" (Llama 3.1's scaling; factor s, low / high frequency factors l / h, original context L):
//   wavelen_i = 2π / inv_freq_i
//   wavelen_i > L / l (low frequencies):   inv_freq_i / s
//   wavelen_i < L / h (high frequencies):  inv_freq_i
//   otherwise, with a = (L / wavelen_i - l) / (h - l):  (1 - a) · inv_freq_i / s + a · inv_freq_i
// each operation rounded to fp32 as transformers' tensor arithmetic does.
// "yarn" (factor s, original context L, beta_fast / beta_slow b_f / b_s, default 32 / 1):
//   d(b) = HD · ln(L / (2π b)) / (2 ln theta), in double (the dimension that turns b times in L)
//   low = max(floor(d(b_f)), 0), high = min(ceil(d(b_s)), HD - 1)  (no floor / ceil with truncate false)
//   ramp_i = clamp((i - low) / (high - low), 0, 1)                  (high += 0.001 when equal)
//   inv_freq_i = (1 / (s · p_i)) · ramp_i + (1 / p_i) · (1 - ramp_i)
//   each operation rounded to fp32 as transformers' tensor arithmetic does (1 - ramp_i is formed first, and
//   1 - (1 - ramp_i) from it); and cos, sin times attention_factor (RopeScaling, model/config.h).
// "longrope" (Phi-3; one factor e_i per frequency, the short ones for a sequence of T tokens up to the
// original context L, the long ones past it, as transformers' longrope_frequency_update picks them):
//   inv_freq_i = 1 / (e_i · fp32(theta)^(fp32(2i) / HD)), in fp32; and cos, sin times attention_factor
//   (rope_attention_factor).
#pragma once

#include <vector>

#include "model/config.h"

namespace strata::model {

// For sequences of T tokens (longrope chooses its factors by T; the other forms do not depend on it).
std::vector<float> rope_inv_freq(const ModelConfig& cfg, int T);
// What cos and sin are multiplied by (longrope's and yarn's attention factor, rounded to fp32; 1 otherwise).
float rope_attention_factor(const ModelConfig& cfg);

}  // namespace strata::model
