// strata/kernels/cpu/elementwise.cpp: SwiGLU and the residual add.
#include <cmath>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/parallel_impl.h"

namespace strata::kernels::cpu {
namespace {

float sigmoid(float z) {
  return 1.0f / (1.0f + std::exp(-z));
}

}  // namespace

void swiglu_forward(float* out, const float* gate, const float* up, std::size_t n) {
  impl::parallel_for_range(n, impl::kElementGrain, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) out[i] = gate[i] * sigmoid(gate[i]) * up[i];
  });
}

// d silu(z)/dz = sig(z) (1 + z (1 - sig(z))).
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                     std::size_t n) {
  impl::parallel_for_range(n, impl::kElementGrain, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) {
      const float z = gate[i], sg = sigmoid(z), g = dout[i];
      dgate[i] = g * up[i] * sg * (1.0f + z * (1.0f - sg));
      dup[i] = g * z * sg;
    }
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
