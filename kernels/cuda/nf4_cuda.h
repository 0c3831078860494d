// strata/kernels/cuda/nf4_cuda.h: NF4 dequantisation on a CUDA device: a frozen base's 4-bit codes and
// their absmax (fp32, or double-quantised) to bf16, a gathered chunk's working dtype, or to fp32. Built only
// with STRATA_WITH_CUDA. kernels/cpu/nf4.h is the oracle (its Notes give the format and the arithmetic);
// tests/kernels/cuda_nf4_test.cpp compares the two bit for bit.
//
// Example (n values in blocks of 64, on stream s; every pointer is device memory):
//   namespace kc = strata::kernels::cuda;
//   kc::dequantize_nf4(w /*(n) bf16*/, codes, absmax /*(nf4_blocks(n, 64)) fp32*/, n, 64, s);
//   // double quantisation: the arrays of a cpu::Nf4DoubleQuant, uploaded, and its offset
//   kc::dequantize_nf4(w, codes, kc::Nf4DoubleQuantDevice{codes8, absmax2, dq.offset}, n, 64, s);
//
// Each value is kernels/cpu's fp32 value bit for bit: kNf4Levels[code] x absmax of its block, the absmax
// being kDynamicMap[code8] x absmax2[block / 256] + offset when double-quantised (a product, then a sum: two
// roundings, never fused). A bf16 output is that value rounded to nearest even (kernels/cpu's
// f32_to_bf16). Conventions are kernels/cuda/ops.h's: output first, work queued on `stream` on the stream's
// device, nothing synchronises the host, every launch checked (BackendError), n = 0 launches nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/ops.h"  // bf16

namespace strata::kernels::cuda {

// A double-quantised absmax on the device (kernels/cpu/nf4.h's Nf4DoubleQuant, its arrays uploaded).
struct Nf4DoubleQuantDevice {
  const std::uint8_t* codes = nullptr;  // (nf4_blocks(n, blocksize)) device: codes into kDynamicMap
  const float* absmax2 = nullptr;       // (ceil(nblocks / kNf4AbsmaxBlocksize)) device
  float offset = 0;                     // host value
};

// codes (nf4_code_bytes(n): two a byte, the first value in the high nibble) and absmax -> out (n).
// blocksize > 0.
void dequantize_nf4(bf16* out /*(n)*/, const std::uint8_t* codes, const float* absmax /*(nblocks) fp32*/,
                    std::size_t n, std::size_t blocksize, cudaStream_t stream);
void dequantize_nf4(float* out /*(n)*/, const std::uint8_t* codes, const float* absmax /*(nblocks) fp32*/,
                    std::size_t n, std::size_t blocksize, cudaStream_t stream);
void dequantize_nf4(bf16* out /*(n)*/, const std::uint8_t* codes, const Nf4DoubleQuantDevice& absmax,
                    std::size_t n, std::size_t blocksize, cudaStream_t stream);
void dequantize_nf4(float* out /*(n)*/, const std::uint8_t* codes, const Nf4DoubleQuantDevice& absmax,
                    std::size_t n, std::size_t blocksize, cudaStream_t stream);

}  // namespace strata::kernels::cuda
