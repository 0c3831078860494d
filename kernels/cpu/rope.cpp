// strata/kernels/cpu/rope.cpp: rotary position embedding, Hugging Face's rotate_half convention.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/parallel_impl.h"

namespace strata::kernels::cpu {
namespace {

// Rotates every head of every row by +angle (sign = 1) or -angle (sign = -1); row (b, t)'s angle is that of
// position t, or pos[b, t] (Note [Document masks] in ops.h).
void rotate(float* out, const float* x, const float* cos, const float* sin, int B, int T, int H, int HD,
            float sign, const std::int32_t* pos) {
  STRATA_CHECK(HD % 2 == 0, "rotary embedding: head width ", HD, " must be even");
  const int half = HD / 2;
  impl::parallel_for_each_index(std::size_t(B) * T, 4, [&](std::size_t bt) {
    const std::size_t t = pos ? std::size_t(pos[bt]) : bt % std::size_t(T);
    const float* ct = cos + t * half;
    const float* st = sin + t * half;
    for (int h = 0; h < H; ++h) {
      const float* xh = x + (bt * H + h) * HD;
      float* oh = out + (bt * H + h) * HD;
      for (int i = 0; i < half; ++i) {
        const float x1 = xh[i], x2 = xh[i + half];
        const float s = sign * st[i];
        oh[i] = x1 * ct[i] - x2 * s;
        oh[i + half] = x2 * ct[i] + x1 * s;
      }
    }
  });
}

}  // namespace

void rope_inv_freq(float* inv_freq, int HD, float theta) {
  STRATA_CHECK(HD % 2 == 0, "rope_inv_freq: head width ", HD, " must be even");
  STRATA_CHECK(theta > 0.0f, "rope_inv_freq: rope_theta ", theta, " must be positive");
  // As Hugging Face computes it: inv_freq in fp32.
  for (int i = 0; i < HD / 2; ++i) inv_freq[i] = float(1.0 / std::pow(double(theta), double(2 * i) / HD));
}

void rope_cache(float* cos, float* sin, int T, int HD, const float* inv_freq) {
  STRATA_CHECK(HD % 2 == 0, "rope_cache: head width ", HD, " must be even");
  const int half = HD / 2;
  for (int i = 0; i < half; ++i) {
    // As Hugging Face computes it: the angle t * inv_freq rounded to fp32.
    for (int t = 0; t < T; ++t) {
      const float angle = float(t) * inv_freq[i];
      cos[std::size_t(t) * half + i] = float(std::cos(double(angle)));
      sin[std::size_t(t) * half + i] = float(std::sin(double(angle)));
    }
  }
}

void rope_cache(float* cos, float* sin, int T, int HD, float theta) {
  std::vector<float> inv_freq(std::size_t(std::max(0, HD / 2)));
  rope_inv_freq(inv_freq.data(), HD, theta);
  rope_cache(cos, sin, T, HD, inv_freq.data());
}

void rope_forward(float* out, const float* x, const float* cos, const float* sin, int B, int T, int H, int HD,
                  const std::int32_t* pos) {
  rotate(out, x, cos, sin, B, T, H, HD, 1.0f, pos);
}

void rope_backward(float* dx, const float* dout, const float* cos, const float* sin, int B, int T, int H,
                   int HD, const std::int32_t* pos) {
  rotate(dx, dout, cos, sin, B, T, H, HD, -1.0f, pos);
}

}  // namespace strata::kernels::cpu
