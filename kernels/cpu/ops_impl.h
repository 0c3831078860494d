// strata/kernels/cpu/ops_impl.h: what the ops on bf16 activations (bf16_ops.cpp)
// share with the fp32 ops (internal to kernels/cpu): the widening and rounding of a block, and the pieces
// of the fp32 ops that the bf16 variants run on their own blocks, so that both compute with one
// arithmetic. Each piece is the fp32 op's own code, which both call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/parallel_impl.h"
#include "kernels/cpu/simd_impl.h"

namespace strata::kernels::cpu::impl {

// dst = src widened to fp32 (exact), on the calling thread (one task's block).
inline void widen_bf16(float* dst, const bf16_t* src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}
// dst = bf16(src) (core/dtype.h's rounding: nearest, ties to even), on the calling thread.
inline void narrow_bf16(bf16_t* dst, const float* src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

// An element as fp32: itself, or a bf16 value widened (exact).
inline float to_f32(float x) {
  return x;
}
inline float to_f32(bf16_t x) {
  return bf16_to_f32(x);
}

// ---- RMSNorm (rmsnorm.cpp) ----
// rmsnorm_backward's dw += the sum over rows of dout * x * rstd, one task per block of 64 channels, rows
// in order (Note [deterministic CPU ops]); T = float, or bf16_t widened as it is read (the bf16 variant).
template <typename T>
void rmsnorm_dw(float* dw, const T* dout, const T* x, const float* rstd, int N, int C);
// One row of rmsnorm_backward's input gradient: dx += r (dout (w + w_offset) - x r^2 (1/C) sum dout w x).
void rmsnorm_backward_row(float* dx /*(C) +=*/, const float* dout /*(C)*/, const float* x /*(C)*/,
                          const float* w /*(C)*/, float r, int C, float w_offset);

// ---- SwiGLU (elementwise.cpp) ----
// swiglu_forward / swiglu_backward on one block, in the copy compiled for target `t` (Note [SIMD row
// passes]): every target gives the same bits; the ops call simd_target()'s, tests each one.
void swiglu_forward_on(SimdTarget t, float* out, const float* gate, const float* up, std::size_t n);
void swiglu_backward_on(SimdTarget t, float* dgate, float* dup, const float* dout, const float* gate,
                        const float* up, std::size_t n);

// ---- cross-entropy (cross_entropy.cpp) ----
// Checks the targets (strata::Error for one >= V) and returns how many are >= 0.
int cross_entropy_valid_rows(const std::int32_t* targets, int N, int V);
// One row: returns its loss (0 for target < 0); writes di (may alias li) if not null, scaled by gscale.
// The exponentials and the row's max and sum run in simd_target()'s copy (Note [SIMD row passes]);
// cross_entropy_row_on names the target (every one gives the same bits).
double cross_entropy_row(float* di /*(V) or null*/, const float* li /*(V)*/, int target, int V, float gscale);
double cross_entropy_row_on(SimdTarget t, float* di, const float* li, int target, int V, float gscale);

// cross_entropy_forward_backward's frame: the targets checked, row(i, gscale) -> row i's loss called once
// per row (one task per row), losses (if not null) and the mean summed in row order in double.
template <typename Row>
float cross_entropy_rows(float* losses, const std::int32_t* targets, int N, int V, float grad_scale,
                         int given, Row&& row) {
  const int counted = cross_entropy_valid_rows(targets, N, V);
  const int n_valid = given >= 0 ? given : counted;
  const float gscale = n_valid > 0 ? float(double(grad_scale) / n_valid) : 0.0f;
  std::vector<double> row_loss(std::size_t(N), 0.0);
  parallel_for_each_index(std::size_t(N), 1, [&](std::size_t i) { row_loss[i] = row(i, gscale); });
  double total = 0.0;
  for (int i = 0; i < N; ++i) {
    total += row_loss[std::size_t(i)];
    if (losses != nullptr) losses[i] = float(row_loss[std::size_t(i)]);
  }
  return n_valid > 0 ? float(total / n_valid) : 0.0f;
}

}  // namespace strata::kernels::cpu::impl
