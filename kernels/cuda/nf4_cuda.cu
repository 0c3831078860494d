// strata/kernels/cuda/nf4_cuda.cu: NF4 dequantisation (kernels/cuda/nf4_cuda.h), kernels/cpu/nf4.cpp's
// arithmetic on the device; 8 values per thread, 16-byte stores (Note [vectorised element-wise kernels] in
// common_impl.cuh).
//
// Note [NF4 tables on the device]: the 16 NF4 levels and the 256 levels of the dynamic map are kernels/cpu's
// arrays (kNf4Levels, kDynamicMap), passed by value as a kernel parameter and copied into shared memory by
// each block: one source for both sides, no per-device constant-memory upload, and lookups by a
// per-thread index go to shared memory rather than serialising on the parameter bank.
#include <cstring>

#include "kernels/cpu/nf4.h"
#include "kernels/cuda/common_impl.cuh"
#include "kernels/cuda/nf4_cuda.h"

namespace strata::kernels::cuda {
namespace {

using impl::kVec;
using impl::Pack8;

constexpr int kLevels = 16, kMapLevels = 256;

struct Tables {
  float levels[kLevels];
  float map[kMapLevels];
};

Tables make_tables() {
  Tables t;
  std::memcpy(t.levels, cpu::kNf4Levels.data(), sizeof(t.levels));
  std::memcpy(t.map, cpu::kDynamicMap.data(), sizeof(t.map));
  return t;
}

// The absmax of block b: stored in fp32, or dequantised from its 8-bit code.
struct Fp32Absmax {
  const float* absmax;
  __device__ float operator()(std::size_t b, const float* /*map*/) const { return absmax[b]; }
};
struct DoubleQuantAbsmax {
  const std::uint8_t* codes;
  const float* absmax2;
  float offset;
  __device__ float operator()(std::size_t b, const float* map) const {
    return __fadd_rn(__fmul_rn(map[codes[b]], absmax2[b / cpu::kNf4AbsmaxBlocksize]), offset);
  }
};

__device__ inline void store_value(float& out, float v) {
  out = v;
}
__device__ inline void store_value(bf16& out, float v) {
  out = __ushort_as_bfloat16(impl::f32_to_bf16_bits(v));  // kernels/cpu's rounding, bit for bit
}

template <typename Out, typename Absmax>
__global__ void dequantize_nf4_kernel(Out* out, const std::uint8_t* codes, Absmax absmax, std::size_t n,
                                      std::size_t blocksize, Tables tables, bool vec) {
  __shared__ float levels[kLevels], map[kMapLevels];
  for (int k = int(threadIdx.x); k < kLevels + kMapLevels; k += int(blockDim.x)) {
    if (k < kLevels) {
      levels[k] = tables.levels[k];
    } else {
      map[k - kLevels] = tables.map[k - kLevels];
    }
  }
  __syncthreads();
  const std::size_t i = impl::group_start();
  if (i >= n) return;
  std::size_t b = i / blocksize, next = (b + 1) * blocksize;  // this value's block, where the next starts
  float scale = absmax(b, map);
  Pack8<Out> y;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const std::size_t j = i + k;
    if (j >= n) break;  // store8 writes nothing past n
    if (j >= next) {
      while (j >= next) {
        ++b;
        next += blocksize;
      }
      scale = absmax(b, map);
    }
    const std::uint8_t byte = codes[j / 2];
    const int c = j % 2 == 0 ? byte >> 4 : byte & 0xF;
    store_value(y.v[k], __fmul_rn(levels[c], scale));
  }
  impl::store8(out, i, n, vec, y);
}

template <typename Out, typename Absmax>
void dequantize(Out* out, const std::uint8_t* codes, Absmax absmax, std::size_t n, std::size_t blocksize,
                cudaStream_t stream) {
  STRATA_CHECK(blocksize > 0, "dequantize_nf4: blocksize 0");
  if (n == 0) return;
  static const Tables tables = make_tables();
  detail::CudaDeviceGuard guard(stream);
  dequantize_nf4_kernel<<<impl::vec_blocks_for(n), impl::kThreads, 0, stream>>>(
      out, codes, absmax, n, blocksize, tables, impl::aligned16(out));
  STRATA_KERNEL_CHECK(stream);
}

DoubleQuantAbsmax double_quant(const Nf4DoubleQuantDevice& a) {
  return DoubleQuantAbsmax{a.codes, a.absmax2, a.offset};
}

}  // namespace

void dequantize_nf4(bf16* out, const std::uint8_t* codes, const float* absmax, std::size_t n,
                    std::size_t blocksize, cudaStream_t stream) {
  dequantize(out, codes, Fp32Absmax{absmax}, n, blocksize, stream);
}

void dequantize_nf4(float* out, const std::uint8_t* codes, const float* absmax, std::size_t n,
                    std::size_t blocksize, cudaStream_t stream) {
  dequantize(out, codes, Fp32Absmax{absmax}, n, blocksize, stream);
}

void dequantize_nf4(bf16* out, const std::uint8_t* codes, const Nf4DoubleQuantDevice& absmax, std::size_t n,
                    std::size_t blocksize, cudaStream_t stream) {
  dequantize(out, codes, double_quant(absmax), n, blocksize, stream);
}

void dequantize_nf4(float* out, const std::uint8_t* codes, const Nf4DoubleQuantDevice& absmax, std::size_t n,
                    std::size_t blocksize, cudaStream_t stream) {
  dequantize(out, codes, double_quant(absmax), n, blocksize, stream);
}

}  // namespace strata::kernels::cuda
