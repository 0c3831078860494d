// bench/cpu_adam/loops.h: the comparison loops of the cpu_adam benchmark, compiled per SIMD target
// (loops.cpp) so that they run at the same vector width as the optimizer they are compared with.
//
// ceiling: the physical limit for an optimizer's traffic. An in-place read-modify-write over the same
//   arrays with trivial arithmetic: read params (fp32), grads and the optimizer's states (two for Adam,
//   one for Adagrad and Lion); write params, the states and, when there is one, the 16-bit output (16-bit
//   values are widened by a shift and narrowed by truncation: no rounding work). `stream_out` writes the
//   output with non-temporal stores; `prefetch` adds the optimizer's own software prefetch of every read
//   stream (cpu_optim/simd-inl.h), so the ceiling has every help the optimizer has.
// unfused: the same AdamW step done the way a framework's unfused optimizer does it (PyTorch's
//   single-tensor Adam), one elementwise pass per operation over whole arrays, each pass its own
//   parallel region: g *= scale; p *= 1 - lr*wd; m = b1*m + (1-b1)*g; v *= b2; v += (1-b2)*g*g;
//   d = sqrt(v) * bc2 (into a temporary); d += eps; p += step_size * m / d; out = bf16(p).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace strata::bench {

struct Arrays {
  float* p = nullptr;
  void* g = nullptr;
  void* m = nullptr;
  void* v = nullptr;
  void* out = nullptr;                     // may be null
  float* tmp = nullptr;                    // unfused only: the denominator
  int g_type = 0, s_type = 0, o_type = 0;  // 0 fp32, 1 16-bit (bf16 or fp16 alike); o_type 0: no output
  int states = 2;                          // 2: m and v; 1: m only (Adagrad's or Lion's one state)
};

// [begin, end) of the ceiling loop on `target` (a Highway target bit).
void ceiling_range(std::int64_t target, const Arrays& a, std::size_t begin, std::size_t end, bool stream_out,
                   bool prefetch);

// One pass of the unfused AdamW over [begin, end); pass 0..8 in the order of the comment above.
inline constexpr int kUnfusedPasses = 9;
struct UnfusedScalars {
  float scale, decay, b1, omb1, b2, omb2, bc2, eps, step_size;
};
void unfused_pass(std::int64_t target, int pass, const Arrays& a, const UnfusedScalars& s, std::size_t begin,
                  std::size_t end);

// The Highway bit of a compiled target by its lower-case name (as cpu_optim names them); 0 if none.
std::int64_t target_bit(const std::string& name);

}  // namespace strata::bench
