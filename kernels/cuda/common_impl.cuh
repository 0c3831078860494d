// strata/kernels/cuda/common_impl.cuh: launch sizes, bf16 loads/stores, the CPU's bit-exact conversions,
// deterministic block reductions and column sums shared by the kernels (internal to kernels/cuda).
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

// ---- deterministic column sums ----------------------------------------------------------------------------
// Note [deterministic column sums]: dst_c += sum over rows i of term(i, c), for an (N, C) term (a weight or
// bias gradient: RMSNorm's dw, a projection's db). Two passes: (1) a grid of (row blocks of kColumnRows
// rows) x (column blocks), each thread summing one column over its block's rows in row order into scratch
// (column_row_blocks(N), C) fp32; (2) one thread per column summing those partials in row-block order and
// adding the total to dst. Loads are coalesced across columns, the work spreads over N * C / kColumnRows
// threads, and the summation order is fixed by the shape alone (not the GPU), so the result is
// deterministic run to run. `Term` is a small struct, passed by value, whose
// `__device__ float operator()(int i, int c) const` gives term(i, c).
constexpr int kColumnRows = 64;

inline int column_row_blocks(int N) {
  return (N + kColumnRows - 1) / kColumnRows;
}

// Bytes of scratch column_sums needs for an (N, C) term.
inline std::size_t column_sums_scratch_bytes(int N, int C) {
  return std::size_t(column_row_blocks(N)) * std::size_t(C) * sizeof(float);
}

// Pass 1: partial[b, c] = the sum of term(i, c) over the rows i of row block b, in row order.
template <typename Term>
__global__ void column_partial_kernel(float* partial, Term term, int N, int C) {
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int i0 = blockIdx.x * kColumnRows, i1 = min(N, i0 + kColumnRows);
  float acc = 0.0f;
  for (int i = i0; i < i1; ++i) acc += term(i, c);
  partial[std::size_t(blockIdx.x) * C + c] = acc;
}

// Pass 2: dst[c] += the partials of column c in row-block order. (A template so that every translation
// unit including this header has its own copy without a duplicate symbol.)
template <typename T = float>
__global__ void column_total_kernel(T* dst, const float* partial, int blocks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = 0.0f;
  for (int b = 0; b < blocks; ++b) acc += partial[std::size_t(b) * C + c];
  dst[c] += acc;
}

// Enqueues both passes on `stream` (Note [deterministic column sums]); N > 0 and C > 0, `scratch` at least
// column_sums_scratch_bytes(N, C) bytes (the caller checks both). Every launch is checked.
template <typename Term>
void column_sums(float* dst /*(C) +=*/, Term term, int N, int C, void* scratch, cudaStream_t stream) {
  const int blocks = column_row_blocks(N);
  float* partial = static_cast<float*>(scratch);
  const dim3 grid(unsigned(blocks), blocks_for(std::size_t(C)));  // row blocks in x: no 65535 limit
  column_partial_kernel<<<grid, kThreads, 0, stream>>>(partial, term, N, C);
  STRATA_KERNEL_CHECK(stream);
  column_total_kernel<<<blocks_for(std::size_t(C)), kThreads, 0, stream>>>(dst, partial, blocks, C);
  STRATA_KERNEL_CHECK(stream);
}

}  // namespace strata::kernels::cuda::impl
