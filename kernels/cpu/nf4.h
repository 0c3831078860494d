// strata/kernels/cpu/nf4.h: QLoRA's 4-bit NormalFloat (NF4) as bitsandbytes stores it — the CPU reference
// for a base quantised to 4 bits (the adapters' frozen base).
//
// Example:
//   std::vector<std::uint8_t> codes(nf4_code_bytes(n));
//   std::vector<float> absmax(nf4_blocks(n, 64));
//   quantize_nf4(w, n, 64, codes.data(), absmax.data());      // 0.5 byte + 4 / 64 a value
//   dequantize_nf4(codes.data(), absmax.data(), n, 64, out);   // out[i] = kNf4Levels[code_i] x absmax
//
//   // Double quantisation (QLoRA's default): the absmax stored as 8-bit codes, 4 + 4 / 256 bytes a block.
//   Nf4DoubleQuant dq = quantize_nf4_absmax(absmax.data(), absmax.size());
//   dequantize_nf4_absmax(dq, absmax.size(), absmax.data());  // the absmax as dequantised
//   dequantize_nf4(codes.data(), absmax.data(), n, 64, out);  // what bitsandbytes' dequantize_4bit gives
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
//
// Note [NF4 double quantisation as bitsandbytes computes it] (quantize_4bit with compress_statistics=True,
// whose absmax goes through quantize_blockwise(absmax - offset, blocksize=256); on the CPU that is
// libbitsandbytes_cpu's quantize_cpu, a lookup table since 0.50 (csrc/cpu_ops.cpp). nf4_test.cpp checks it
// bit for bit against bitsandbytes 0.50.2; kernels/cuda/nf4_cuda.h dequantises it on a GPU):
//   - the NF4 codes are those of the fp32 absmax (quantize_nf4): only what is stored of the absmax changes;
//   - offset = the fp32 mean of the absmax as torch's CPU mean computes it: its cascade sum (SumKernel.cpp:
//     8 lanes, 4 interleaved rows, 4 levels of partial sums of 16 or more, the n % 8 tail, then the lanes),
//     divided by float(nblocks). That is torch's order in one thread, and in any number of threads below
//     32768 blocks (torch's GRAIN_SIZE); above it, with T > 1 threads torch sums T chunks apart and adds
//     them, so bitsandbytes' own offset there depends on torch.get_num_threads() (by an ulp or so);
//   - v = absmax - offset (fp32), cut into blocks of 256 (the last shorter); absmax2 of a block = max |v|;
//   - a block whose absmax2 is 0 gets codes 0 (not the code of 0). Otherwise s = v x (1 / absmax2),
//     clamped to [-1, 1], goes onto a grid of 65536 points, j = int(fma((s + 1) x 0.5, 65535, 0.5)), and
//     its code is the number of kDynamicMap's midpoints 0.5 x (m[k] + m[k+1]) below the grid point
//     2j / 65535 - 1 (bitsandbytes' table entry j, computed here per value): the level nearest the grid
//     point, which is not always the level nearest s (about 1 absmax in 600 for normal weights, where the
//     levels near 0 are closer together than the grid's points);
//   - dequantised: absmax = kDynamicMap[code] x absmax2[block / 256] + offset, a product then a sum, two
//     fp32 roundings (dequantize_blockwise, then torch's += offset).
// bitsandbytes' cuda path picks codes by a binary search over the levels (kernels.cu, dQuantize), so where
// the grid and s disagree its codes are one level away from these. That changes nothing for loading: a
// checkpoint stores the codes, absmax2 and offset, and the dequantisation formula above is the same.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

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

// ---- double quantisation of the absmax (Note [NF4 double quantisation as bitsandbytes computes it]) ----

// The 256 levels of bitsandbytes' signed dynamic map (create_dynamic_map(signed=True)), ascending: code 0
// is -0.99297, code 127 is 0, code 255 is 1.
extern const std::array<float, 256> kDynamicMap;

inline constexpr std::size_t kNf4AbsmaxBlocksize = 256;  // absmax values per absmax2 (bitsandbytes': 256)

// The absmax of nblocks NF4 blocks, quantised: codes (nblocks) into kDynamicMap, absmax2
// (ceil(nblocks / 256)) and offset. nblocks 0 gives an empty state with offset 0.
struct Nf4DoubleQuant {
  std::vector<std::uint8_t> codes;  // (nblocks)
  std::vector<float> absmax2;       // (ceil(nblocks / kNf4AbsmaxBlocksize))
  float offset = 0;
};

// absmax (nblocks) -> its double quantisation.
Nf4DoubleQuant quantize_nf4_absmax(const float* absmax, std::size_t nblocks);
// -> absmax_out (nblocks): kDynamicMap[code] x absmax2 + offset. nblocks must be q.codes.size().
void dequantize_nf4_absmax(const Nf4DoubleQuant& q, std::size_t nblocks, float* absmax_out);
// The same from the stored arrays: codes (nblocks), absmax2 (ceil(nblocks / 256)) and the offset.
void dequantize_nf4_absmax(const std::uint8_t* codes, const float* absmax2, float offset, std::size_t nblocks,
                           float* absmax_out);

}  // namespace strata::kernels::cpu
