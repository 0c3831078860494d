// strata/core/dtype.h: the one element-type enum of the whole tree, and the scalar conversions between
// fp32 and the 16-bit storage types that every other conversion (SIMD, bulk, CUDA) must reproduce.
//
// Example:
//   strata::DType t = strata::DType::bf16;
//   std::size_t bytes = n * strata::dtype_bytes(t);
//   std::uint16_t b = strata::f32_to_bf16(x);   // round to nearest even, NaN stays NaN
//   float y = strata::bf16_to_f32(b);            // exact
//
// bf16 and fp16 values are stored as their raw 16-bit patterns (std::uint16_t). The rounding: to
// nearest, ties to even; overflow to +-inf; a NaN stays a NaN with its sign, its top payload bits and the
// quiet bit set (what x86's VCVTPS2PH and VCVTNEPS2BF16 and CUDA's __float2bfloat16_rn produce); fp16
// subnormals are produced exactly. 16-bit -> fp32 is exact.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace strata {

// fp32/bf16/fp16: tensors of model state and activations; u8: raw bytes; i32: token ids and targets.
enum class DType : std::uint8_t { fp32, bf16, fp16, u8, i32 };
inline constexpr int kDTypeCount = 5;  // DType(0) .. DType(kDTypeCount - 1)

// "fp32", "bf16", "fp16", "u8", "i32".
const char* dtype_name(DType t);
constexpr std::size_t dtype_bytes(DType t) {
  return t == DType::fp32 || t == DType::i32 ? 4 : t == DType::u8 ? 1 : 2;
}
// fp32, bf16, fp16: the floating-point types, the ones the conversions below take.
constexpr bool dtype_is_float(DType t) {
  return t == DType::fp32 || t == DType::bf16 || t == DType::fp16;
}
// Parses dtype_name's spelling (and "float32"/"bfloat16"/"float16"/"f32"/"f16"); false for anything else.
bool parse_dtype(std::string_view s, DType* out);

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

}  // namespace strata
