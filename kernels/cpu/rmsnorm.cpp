// strata/kernels/cpu/rmsnorm.cpp: RMSNorm, out = x * rstd * (w + w_offset) (Llama: offset 0; Gemma: 1).
#include <cmath>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/ops_impl.h"
#include "kernels/cpu/parallel_impl.h"

namespace strata::kernels::cpu {

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int N, int C, float eps,
                     float w_offset) {
  impl::parallel_for_each_index(std::size_t(N), 8, [&](std::size_t i) {
    const float* xi = x + i * C;
    double ss = 0.0;
    for (int c = 0; c < C; ++c) ss += double(xi[c]) * xi[c];
    const float r = float(1.0 / std::sqrt(ss / C + eps));
    float* oi = out + i * C;
    if (w_offset == 0.0f) {
      for (int c = 0; c < C; ++c) oi[c] = xi[c] * r * w[c];
    } else {  // HF's Gemma: (x * r) * (1 + w), both in fp32
      for (int c = 0; c < C; ++c) oi[c] = (xi[c] * r) * (w_offset + w[c]);
    }
    rstd[i] = r;
  });
}

// With r = rstd: out_c = x_c r w_c and dr/dx_k = -r^3 x_k / C, so
//   dx_k = r (dout_k w_k - x_k r^2 (1/C) sum_c dout_c w_c x_c).
void impl::rmsnorm_backward_row(float* dxi, const float* gi, const float* xi, const float* w, float r, int C,
                                float w_offset) {
  double dot = 0.0;
  for (int c = 0; c < C; ++c) dot += double(gi[c]) * (w[c] + w_offset) * xi[c];
  const float k = float(dot / C) * r * r;
  for (int c = 0; c < C; ++c) dxi[c] += r * (gi[c] * (w[c] + w_offset) - xi[c] * k);
}

void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                      const float* rstd, int N, int C, float w_offset) {
  impl::parallel_for_each_index(std::size_t(N), 8, [&](std::size_t i) {
    impl::rmsnorm_backward_row(dx + i * C, dout + i * C, x + i * C, w, rstd[i], C, w_offset);
  });
  if (dw != nullptr) impl::rmsnorm_dw(dw, dout, x, rstd, N, C);  // none for a frozen weight
}

template <typename T>
void impl::rmsnorm_dw(float* dw, const T* dout, const T* x, const float* rstd, int N, int C) {
  constexpr int kBlock = 64;
  const std::size_t blocks = (std::size_t(C) + kBlock - 1) / kBlock;
  impl::parallel_for_each_index(blocks, 1, [&](std::size_t b) {
    const int c0 = int(b) * kBlock;
    const int c1 = c0 + kBlock < C ? c0 + kBlock : C;
    float acc[kBlock] = {};
    for (int i = 0; i < N; ++i) {
      const T* xi = x + std::size_t(i) * C;
      const T* gi = dout + std::size_t(i) * C;
      const float r = rstd[i];
      for (int c = c0; c < c1; ++c) acc[c - c0] += to_f32(gi[c]) * to_f32(xi[c]) * r;
    }
    for (int c = c0; c < c1; ++c) dw[c] += acc[c - c0];
  });
}
template void impl::rmsnorm_dw(float*, const float*, const float*, const float*, int, int);
template void impl::rmsnorm_dw(float*, const bf16_t*, const bf16_t*, const float*, int, int);

}  // namespace strata::kernels::cpu
