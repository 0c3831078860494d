// strata/cpu_optim/dtype.h: the element types of an optimizer shard and their scalar conversions.
//
// Example:
//   std::uint16_t b = strata::cpu_optim::f32_to_bf16(x);   // round-to-nearest-even, NaN stays NaN
//   float y = strata::cpu_optim::bf16_to_f32(b);            // exact
//
// bf16 and fp16 values are stored as their raw 16-bit patterns (std::uint16_t). These scalar conversions
// define the rounding every SIMD target must reproduce bit for bit: round to nearest, ties to even;
// overflow to +-inf; a NaN stays a NaN with its sign, its top payload bits and the quiet bit set (what
// x86's VCVTPS2PH and VCVTNEPS2BF16 produce).
#pragma once

#include <bit>
#include <cstdint>

namespace strata::cpu_optim {

enum class DType : std::uint8_t { f32, bf16, f16 };

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "fp32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "fp16";
  }
  return "?";
}

inline std::size_t dtype_bytes(DType t) {
  return t == DType::f32 ? 4 : 2;
}

inline std::uint16_t f32_to_bf16(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x0040u);  // NaN: keep it quiet
  return std::uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float bf16_to_f32(std::uint16_t b) {
  return std::bit_cast<float>(std::uint32_t(b) << 16);
}

inline std::uint16_t f32_to_f16(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7fffffffu;
  std::uint32_t h;
  if (a > 0x7f800000u) {
    h = 0x7e00u | ((a >> 13) & 0x3ffu);  // NaN: quiet, top payload bits kept
  } else if (a >= 0x47800000u) {
    h = 0x7c00u;  // >= 65536 (and inf) overflows to inf; 65520..65535 round up to inf below
  } else if (a < 0x38800000u) {
    // Below the smallest normal half (2^-14): let an fp32 add round the value into the subnormal grid.
    // Adding 0.5f puts 2^-24 (one half subnormal step) at the last mantissa bit of the sum.
    const float s = std::bit_cast<float>(a) + 0.5f;
    h = std::bit_cast<std::uint32_t>(s) - 0x3f000000u;
  } else {
    const std::uint32_t odd = (a >> 13) & 1u;
    h = (a + 0xc8000fffu + odd) >> 13;  // rebias the exponent (-112 << 23) and round to nearest even
  }
  return std::uint16_t(h | sign);
}

inline float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t em = h & 0x7fffu;
  std::uint32_t bits;
  if (em >= 0x7c00u) {
    bits = 0x7f800000u | (em << 13);  // inf, NaN (payload kept)
  } else {
    // Reinterpreting (em << 13) as fp32 gives the value scaled by 2^-112 (subnormals included); one
    // exact multiply rebiases it.
    bits = std::bit_cast<std::uint32_t>(std::bit_cast<float>(em << 13) * 0x1p112f);
  }
  return std::bit_cast<float>(bits | sign);
}

}  // namespace strata::cpu_optim
