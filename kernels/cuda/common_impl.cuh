// strata/kernels/cuda/common_impl.cuh: launch sizes, bf16 loads/stores, the CPU's bit-exact conversions
// and deterministic block reductions shared by the kernels (internal to kernels/cuda).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace strata::kernels::cuda::impl {

constexpr int kThreads = 256;  // threads per block everywhere (a power of two: block_reduce needs it)

inline unsigned blocks_for(std::size_t n, int threads = kThreads) {
  return unsigned((n + std::size_t(threads) - 1) / std::size_t(threads));
}

// ---- element-wise kernels: 8 elements per thread, 16-byte loads
// -------------------------------------------- Note [vectorised element-wise kernels]: each thread handles
// the 8 elements [8t, 8t + 8). When every pointer of the call is 16-byte aligned (`vec`, decided on the
// host), a full group moves as one or two 16-byte loads and stores (8 bf16 or fp16 in one, 8 floats in two);
// the last, partial group and any unaligned call go element by element. Each element sees the same arithmetic
// either way, so results do not depend on the path. A thread reads all its elements before writing any, so an
// output may alias an input of the same element.
constexpr int kVec = 8;

inline unsigned vec_blocks_for(std::size_t n) {
  return blocks_for((n + kVec - 1) / kVec);
}

inline bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

template <typename T>
struct alignas(16) Pack8 {
  T v[kVec];
};

// The group of 8 starting at i (a multiple of 8); elements at or past n read as T{}.
template <typename T>
__device__ inline Pack8<T> load8(const T* p, std::size_t i, std::size_t n, bool vec) {
  Pack8<T> r;
  if (vec && i + kVec <= n) {
    const uint4* src = reinterpret_cast<const uint4*>(p + i);
    uint4* dst = reinterpret_cast<uint4*>(&r);
#pragma unroll
    for (int k = 0; k < int(sizeof(r) / sizeof(uint4)); ++k) dst[k] = src[k];
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) r.v[k] = i + k < n ? p[i + k] : T{};
  }
  return r;
}

// Stores the group of 8 starting at i; elements at or past n are not written.
template <typename T>
__device__ inline void store8(T* p, std::size_t i, std::size_t n, bool vec, const Pack8<T>& r) {
  if (vec && i + kVec <= n) {
    const uint4* src = reinterpret_cast<const uint4*>(&r);
    uint4* dst = reinterpret_cast<uint4*>(p + i);
#pragma unroll
    for (int k = 0; k < int(sizeof(r) / sizeof(uint4)); ++k) dst[k] = src[k];
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      if (i + k < n) p[i + k] = r.v[k];
  }
}

// The first element of this thread's group.
__device__ inline std::size_t group_start() {
  return (std::size_t(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
}

__device__ inline float ld(const bf16* p, std::size_t i) {
  return __bfloat162float(p[i]);
}
__device__ inline bf16 to_bf16(float x) {
  return __float2bfloat16_rn(x);
}

// The conversions of kernels/cpu/cast.cpp, the same integer arithmetic.
__device__ inline std::uint16_t f32_to_bf16_bits(float x) {
  const std::uint32_t u = __float_as_uint(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return std::uint16_t((u >> 16) | 0x0040u);
  return std::uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

__device__ inline std::uint16_t f32_to_f16_bits(float x) {
  const std::uint32_t u = __float_as_uint(x);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return std::uint16_t(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x477FF000u) return std::uint16_t(sign | 0x7C00u);
  const std::uint32_t e = a >> 23;
  std::uint32_t m, shift, h;
  if (e >= 113) {
    m = a & 0x7FFFFFu;
    shift = 13;
    h = ((e - 112) << 10) | (m >> shift);
  } else {
    if (a <= 0x33000000u) return std::uint16_t(sign);
    m = (a & 0x7FFFFFu) | 0x800000u;
    shift = 126 - e;
    h = m >> shift;
  }
  const std::uint32_t rem = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
  return std::uint16_t(sign | h);
}

// Sum (or max) of one value per thread over the block, in a fixed tree order: the same inputs give the
// same bits every launch. Every thread of the block must call it; all receive the result. `shared` holds
// kThreads elements.
template <typename T>
__device__ T block_sum(T v, T* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  const T r = shared[0];
  __syncthreads();
  return r;
}

__device__ inline float block_max(float v, float* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) shared[threadIdx.x] = fmaxf(shared[threadIdx.x], shared[threadIdx.x + s]);
    __syncthreads();
  }
  const float r = shared[0];
  __syncthreads();
  return r;
}

}  // namespace strata::kernels::cuda::impl
