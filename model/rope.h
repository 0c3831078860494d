// strata/model/rope.h: the rotary embedding's inverse frequencies for a model config, Hugging Face's
// formulas in Hugging Face's fp32 arithmetic.
//
// Example:
//   std::vector<float> f = strata::model::rope_inv_freq(cfg);   // head_dim / 2 values
//   ops.rope_cache(cos, sin, T, int(cfg.head_dim()), f);
//
// "default": inv_freq_i = fp32(theta^(-2i/HD)) (kernels/cpu's rope_inv_freq).
// "llama3" (Llama 3.1's scaling; factor s, low / high frequency factors l / h, original context L):
//   wavelen_i = 2π / inv_freq_i
//   wavelen_i > L / l (low frequencies):   inv_freq_i / s
//   wavelen_i < L / h (high frequencies):  inv_freq_i
//   otherwise, with a = (L / wavelen_i - l) / (h - l):  (1 - a) · inv_freq_i / s + a · inv_freq_i
// each operation rounded to fp32 as transformers' tensor arithmetic does.
#pragma once

#include <vector>

#include "model/config.h"

namespace strata::model {

std::vector<float> rope_inv_freq(const ModelConfig& cfg);

}  // namespace strata::model
