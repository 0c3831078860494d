// strata/kernels/cpu/elementwise.cpp: SwiGLU, GeGLU, a projection's bias and the residual add.
#include <cmath>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/ops_impl.h"
#include "kernels/cpu/parallel_impl.h"
#include "kernels/cpu/simd_impl.h"

namespace strata::kernels::cpu {
namespace {

// PyTorch's gelu(approximate="tanh") in float: 0.5 z (1 + tanh(k0 (z + k1 z^3))).
constexpr float kGeluK0 = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluK1 = 0.044715f;

float gelu_tanh(float z) {
  const float inner = kGeluK0 * (z + kGeluK1 * z * z * z);
  return 0.5f * z * (1.0f + std::tanh(inner));
}

// d/dz: 0.5 (1 + t) + 0.5 z (1 - t^2) k0 (1 + 3 k1 z^2), t = tanh(inner).
float gelu_tanh_grad(float z) {
  const float inner = kGeluK0 * (z + kGeluK1 * z * z * z);
  const float t = std::tanh(inner);
  return 0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * kGeluK0 * (1.0f + 3.0f * kGeluK1 * z * z);
}

}  // namespace

void geglu_forward(float* out, const float* gate, const float* up, std::size_t n) {
  impl::parallel_for_range(n, impl::kElementGrain, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) out[i] = gelu_tanh(gate[i]) * up[i];
  });
}

void geglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                    std::size_t n) {
  impl::parallel_for_range(n, impl::kElementGrain, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) {
      const float z = gate[i], u = up[i], g = dout[i];
      dgate[i] = g * u * gelu_tanh_grad(z);
      dup[i] = g * gelu_tanh(z);
    }
  });
}

void bias_forward(float* out, const float* b, int N, int OC) {
  impl::parallel_for_each_index(std::size_t(N), 8, [&](std::size_t i) {
    float* oi = out + i * std::size_t(OC);
    for (int c = 0; c < OC; ++c) oi[c] += b[c];
  });
}

namespace {

// One task per block of columns, rows summed in order (Note [deterministic CPU ops]); T = float, or bf16_t
// widened as it is read (the bf16 variant).
template <typename T>
void column_sums(float* db, const T* dout, int N, int OC) {
  constexpr int kBlock = 64;
  const std::size_t blocks = (std::size_t(OC) + kBlock - 1) / kBlock;
  impl::parallel_for_each_index(blocks, 1, [&](std::size_t b) {
    const int c0 = int(b) * kBlock;
    const int c1 = c0 + kBlock < OC ? c0 + kBlock : OC;
    float acc[kBlock] = {};
    for (int i = 0; i < N; ++i) {
      const T* gi = dout + std::size_t(i) * std::size_t(OC);
      for (int c = c0; c < c1; ++c) acc[c - c0] += impl::to_f32(gi[c]);
    }
    for (int c = c0; c < c1; ++c) db[c] += acc[c - c0];
  });
}

}  // namespace

void bias_backward(float* db, const float* dout, int N, int OC) {
  column_sums(db, dout, N, OC);
}
void bias_backward(float* db, const bf16_t* dout, int N, int OC) {
  column_sums(db, dout, N, OC);
}

// SwiGLU's passes, compiled for each SIMD target (Note [SIMD row passes] in simd_impl.h): e^x is
// impl::exp_f32, so all targets give the same bits.
namespace {

[[gnu::always_inline]] inline float silu_sigmoid(float z) {
  return 1.0f / (1.0f + impl::exp_f32(-z));
}

[[gnu::always_inline]] inline void swiglu_forward_body(float* out, const float* gate, const float* up,
                                                       std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = gate[i] * silu_sigmoid(gate[i]) * up[i];
}

// d silu(z)/dz = sig(z) (1 + z (1 - sig(z))).
[[gnu::always_inline]] inline void swiglu_backward_body(float* dgate, float* dup, const float* dout,
                                                        const float* gate, const float* up, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const float z = gate[i], sg = silu_sigmoid(z), g = dout[i], u = up[i];
    dgate[i] = g * u * sg * (1.0f + z * (1.0f - sg));
    dup[i] = g * z * sg;
  }
}

void swiglu_forward_baseline(float* out, const float* gate, const float* up, std::size_t n) {
  swiglu_forward_body(out, gate, up, n);
}
void swiglu_backward_baseline(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                              std::size_t n) {
  swiglu_backward_body(dgate, dup, dout, gate, up, n);
}
#if STRATA_SIMD_X86
[[gnu::target("avx2")]] void swiglu_forward_avx2(float* out, const float* gate, const float* up,
                                                 std::size_t n) {
  swiglu_forward_body(out, gate, up, n);
}
[[gnu::target("avx2")]] void swiglu_backward_avx2(float* dgate, float* dup, const float* dout,
                                                  const float* gate, const float* up, std::size_t n) {
  swiglu_backward_body(dgate, dup, dout, gate, up, n);
}
[[gnu::target("avx512f,avx512bw,avx512vl")]] void swiglu_forward_avx512(float* out, const float* gate,
                                                                        const float* up, std::size_t n) {
  swiglu_forward_body(out, gate, up, n);
}
[[gnu::target("avx512f,avx512bw,avx512vl")]] void swiglu_backward_avx512(float* dgate, float* dup,
                                                                         const float* dout, const float* gate,
                                                                         const float* up, std::size_t n) {
  swiglu_backward_body(dgate, dup, dout, gate, up, n);
}
#endif

}  // namespace

namespace impl {

void swiglu_forward_on(SimdTarget t, float* out, const float* gate, const float* up, std::size_t n) {
#if STRATA_SIMD_X86
  if (t == SimdTarget::avx512) return swiglu_forward_avx512(out, gate, up, n);
  if (t == SimdTarget::avx2) return swiglu_forward_avx2(out, gate, up, n);
#endif
  (void)t;
  swiglu_forward_baseline(out, gate, up, n);
}

void swiglu_backward_on(SimdTarget t, float* dgate, float* dup, const float* dout, const float* gate,
                        const float* up, std::size_t n) {
#if STRATA_SIMD_X86
  if (t == SimdTarget::avx512) return swiglu_backward_avx512(dgate, dup, dout, gate, up, n);
  if (t == SimdTarget::avx2) return swiglu_backward_avx2(dgate, dup, dout, gate, up, n);
#endif
  (void)t;
  swiglu_backward_baseline(dgate, dup, dout, gate, up, n);
}

}  // namespace impl

void swiglu_forward(float* out, const float* gate, const float* up, std::size_t n) {
  const impl::SimdTarget t = impl::simd_target();
  impl::parallel_for_range(n, impl::kElementGrain, [&](std::size_t i0, std::size_t i1) {
    impl::swiglu_forward_on(t, out + i0, gate + i0, up + i0, i1 - i0);
  });
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                     std::size_t n) {
  const impl::SimdTarget t = impl::simd_target();
  impl::parallel_for_range(n, impl::kElementGrain, [&](std::size_t i0, std::size_t i1) {
    impl::swiglu_backward_on(t, dgate + i0, dup + i0, dout + i0, gate + i0, up + i0, i1 - i0);
  });
}

void residual_forward(float* out, const float* a, const float* b, std::size_t n) {
  impl::parallel_for_range(n, impl::kElementGrain, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) out[i] = a[i] + b[i];
  });
}

void residual_backward(float* da, float* db, const float* dout, std::size_t n) {
  impl::parallel_for_range(n, impl::kElementGrain, [&](std::size_t i0, std::size_t i1) {
    if (da != nullptr)
      for (std::size_t i = i0; i < i1; ++i) da[i] += dout[i];
    if (db != nullptr)
      for (std::size_t i = i0; i < i1; ++i) db[i] += dout[i];
  });
}

}  // namespace strata::kernels::cpu
