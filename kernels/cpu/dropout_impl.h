// strata/kernels/cpu/dropout_impl.h: the dropout mask's arithmetic, shared by the CPU and CUDA
// implementations so that both draw the same mask and scale bit for bit (internal to kernels/; the
// specification is kernels/cpu/ops.h's dropout()).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define STRATA_DROPOUT_FN __host__ __device__ inline constexpr
#else
#define STRATA_DROPOUT_FN inline constexpr
#endif

namespace strata::kernels::cpu::impl {

// splitmix64's output function (Steele, Lea, Flood 2014), as model/chunk.cpp's initialisation uses it.
STRATA_DROPOUT_FN std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The key of `value` under `key`: splitmix64(key ^ splitmix64(value)).
STRATA_DROPOUT_FN std::uint64_t mix_key(std::uint64_t key, std::uint64_t value) {
  return splitmix64(key ^ splitmix64(value));
}

// Element i's factor: `scale` when the top 32 bits of mix_key(key, i) are at least `threshold` (kept),
// else 0 (dropped).
STRATA_DROPOUT_FN float dropout_factor(std::uint64_t key, std::uint64_t i, std::uint64_t threshold,
                                       float scale) {
  return (mix_key(key, i) >> 32) >= threshold ? scale : 0.0f;
}

// What a call computes with, from p in [0, 1): drop when the 32-bit draw is below floor(p 2^32) (so
// P(drop) is p to within 2^-32; p = 0 drops nothing), keep with the factor 1 / (1 - p) computed as
// PyTorch's kernels do: 1 - p in double, then fp32(1) / fp32(1 - p), correctly rounded in fp32.
struct DropoutScalars {
  std::uint64_t threshold;
  float scale;
};
inline DropoutScalars dropout_scalars(double p) {
  return {.threshold = std::uint64_t(p * 4294967296.0), .scale = 1.0f / float(1.0 - p)};
}

}  // namespace strata::kernels::cpu::impl

#undef STRATA_DROPOUT_FN
