// Test helper: one forward and backward's loss and gradients, and how far two runs' gradients of a chunk
// are apart — for the model's tests that set one way of computing against another.
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

#include "model/layout.h"

namespace strata::model {

struct GradResult {
  float loss = 0;
  std::vector<float> grads;  // every chunk's, end to end (InMemoryChunks::all_grads)
};

// Relative L2 distance of chunk c's gradients in `a` from those in `b` (absolute where b's are zero).
inline double grad_rel(const GradResult& a, const GradResult& b, const ChunkLayout& c) {
  double d = 0, s = 0;
  for (std::size_t i = c.flat_offset; i < c.flat_offset + c.padded_numel; ++i) {
    d += std::pow(double(a.grads[i]) - double(b.grads[i]), 2);
    s += std::pow(double(b.grads[i]), 2);
  }
  return s > 0 ? std::sqrt(d / s) : std::sqrt(d);
}

}  // namespace strata::model
