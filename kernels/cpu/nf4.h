// strata/kernels/cpu/nf4.h: QLoRA's 4-bit NormalFloat (NF4) as bitsandbytes stores it — the CPU reference
// for a base quantised to 4 bits (the adapters' frozen base).
//
// Example:
//   std::vector<std::uint8_t> codes(nf4_code_bytes(n));
//   std::vector<float> absmax(nf4_blocks(n, 64));
//   quantize_nf4(w, n, 64, codes.data(), absmax.data());      // 0.5 byte + 4 / 64 a value
//   dequantize_nf4(codes.data(), absmax.data(), n, 64, out);   // out[i] = kNf4Levels[code_i] x absmax
//
// Note [NF4 as bitsandbytes stores it] (bitsandbytes' quantize_4bit with quant_type "nf4", as its CPU path
// computes it; tests/kernels/nf4_test.cpp compares bit for bit with vectors it made):
//   - the values are cut into blocks of `blocksize` (64 in QLoRA), the last one shorter when n is not a
//     multiple; each block's absmax is the largest |x| in it, kept in fp32;
//   - each value is scaled into [-1, 1]: x times the fp32 reciprocal of its block's absmax (the last,
//     shorter block: x divided by it), absmax taken as at least 1e-38, clamped;
//   - its code is the level whose bucket holds it, the buckets split at the fp32 midpoints between
//     consecutive levels, a value on a midpoint going to the lower level;
//   - two codes a byte, the first value in the high nibble; an odd n pads a zero (code 7);
//   - dequantised, value i is kNf4Levels[code_i] x absmax of its block, one fp32 product.
// Not here yet: the double quantisation of the absmax (bitsandbytes' compress_statistics).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace strata::kernels::cpu {

// The 16 levels, ascending (bitsandbytes' get_4bit_type("nf4")): code 7 is 0, code 15 is 1.
extern const std::array<float, 16> kNf4Levels;

inline std::size_t nf4_blocks(std::size_t n, std::size_t blocksize) {
  return (n + blocksize - 1) / blocksize;
}
inline std::size_t nf4_code_bytes(std::size_t n) {
  return (n + 1) / 2;
}

// x (n) -> codes (nf4_code_bytes(n)) and absmax (nf4_blocks(n, blocksize)). blocksize > 0.
void quantize_nf4(const float* x, std::size_t n, std::size_t blocksize, std::uint8_t* codes, float* absmax);
// codes and absmax -> out (n) in fp32.
void dequantize_nf4(const std::uint8_t* codes, const float* absmax, std::size_t n, std::size_t blocksize,
                    float* out);

}  // namespace strata::kernels::cpu
