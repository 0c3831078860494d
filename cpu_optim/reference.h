// strata/cpu_optim/reference.h: the float64 scalar reference of every optimizer, the oracle that each SIMD
// target is tested against (tests/cpu_optim). Plain loops, no SIMD, no threads: correct, not fast.
//
// Example:
//   namespace co = strata::cpu_optim;
//   co::reference::State ref = co::reference::State::from(n, p0, m0, v0, strata::DType::fp32);
//   std::vector<double> g = ...;                 // gradients as the kernel reads them, times grad_scale
//   co::reference::adam(ref, g, hp, step);       // ref.p, ref.m, ref.v now hold step `step`'s result
//
// The reference follows the formulas of cpu_optim.h in double precision (hyper-parameters are the fp32
// values widened; the bias corrections are exact doubles). With bf16 states it rounds m and v to bf16
// after each step (round to nearest even, from the double value), as storage in bf16 would.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cpu_optim/cpu_optim.h"

namespace strata::cpu_optim::reference {

struct State {
  std::vector<double> p, m, v;  // (n) each
  DType state_dtype = DType::fp32;
  // (n) Lion only: how far p may legitimately differ from the reference, because sign(c) was decided on
  // a c so close to 0 (|c| <= 1e-5 (|beta1 m| + |(1 - beta1) g|)) that fp32 arithmetic may give the
  // other sign. Each such step adds 2 * lr. Zero elsewhere.
  std::vector<double> slack;
};

// Widened copies of buffers (state buffers of `state_dtype`; null m or v gives zeros).
State make_state(std::size_t n, const float* p, const void* m, const void* v, DType state_dtype);

// The value of element i of a buffer of dtype t, exactly.
inline double widen(const void* buf, DType t, std::size_t i) {
  switch (t) {
    case DType::fp32:
      return static_cast<const float*>(buf)[i];
    case DType::bf16:
      return bf16_to_f32(static_cast<const std::uint16_t*>(buf)[i]);
    case DType::fp16:
      return f16_to_f32(static_cast<const std::uint16_t*>(buf)[i]);
    default:  // not a floating-point type
      break;
  }
  return 0.0;
}

// Round to the nearest bf16 value, ties to even, directly from double (no intermediate fp32 rounding).
double round_to_bf16(double x);

void adam(State& s, const std::vector<double>& g, const AdamParams& hp, std::int64_t step);
void adagrad(State& s, const std::vector<double>& g, const AdagradParams& hp);
void lion(State& s, const std::vector<double>& g, const LionParams& hp);

// Sum of squares of the fp32 products grad * scale (as the kernels form them), in long double.
long double sum_sq(const void* grads, DType t, std::size_t n, float scale);

}  // namespace strata::cpu_optim::reference
