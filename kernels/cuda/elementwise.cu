// strata/kernels/cuda/elementwise.cu: SwiGLU, GeGLU, a projection's bias and the residual add, 8 bf16 per
// thread with 16-byte loads (Note [vectorised element-wise kernels] in common_impl.cuh); the bias gradient
// is a deterministic column sum (Note [deterministic column sums]).
#include "kernels/cuda/common_impl.cuh"

namespace strata::kernels::cuda {
namespace {

using impl::kVec;
using impl::Pack8;

__device__ inline float sigmoid(float z) {
  return 1.0f / (1.0f + expf(-z));
}

__global__ void swiglu_forward_kernel(bf16* out, const bf16* gate, const bf16* up, std::size_t n, bool vec) {
  const std::size_t i = impl::group_start();
  if (i >= n) return;
  const Pack8<bf16> z = impl::load8(gate, i, n, vec), u = impl::load8(up, i, n, vec);
  Pack8<bf16> o;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const float zk = __bfloat162float(z.v[k]);
    o.v[k] = impl::to_bf16(zk * sigmoid(zk) * __bfloat162float(u.v[k]));
  }
  impl::store8(out, i, n, vec, o);
}

__global__ void swiglu_backward_kernel(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate,
                                       const bf16* up, std::size_t n, bool vec) {
  const std::size_t i = impl::group_start();
  if (i >= n) return;
  const Pack8<bf16> z8 = impl::load8(gate, i, n, vec), u8 = impl::load8(up, i, n, vec),
                    g8 = impl::load8(dout, i, n, vec);
  Pack8<bf16> dg, du;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const float z = __bfloat162float(z8.v[k]), sg = sigmoid(z), g = __bfloat162float(g8.v[k]);
    dg.v[k] = impl::to_bf16(g * __bfloat162float(u8.v[k]) * sg * (1.0f + z * (1.0f - sg)));
    du.v[k] = impl::to_bf16(g * z * sg);
  }
  impl::store8(dgate, i, n, vec, dg);
  impl::store8(dup, i, n, vec, du);
}

// PyTorch's gelu(approximate="tanh") and its derivative, the CPU's formulas (kernels/cpu/elementwise.cpp).
constexpr float kGeluK0 = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluK1 = 0.044715f;

__device__ inline float gelu_tanh(float z) {
  const float inner = kGeluK0 * (z + kGeluK1 * z * z * z);
  return 0.5f * z * (1.0f + tanhf(inner));
}

// d/dz: 0.5 (1 + t) + 0.5 z (1 - t^2) k0 (1 + 3 k1 z^2), t = tanh(inner).
__device__ inline float gelu_tanh_grad(float z) {
  const float inner = kGeluK0 * (z + kGeluK1 * z * z * z);
  const float t = tanhf(inner);
  return 0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * kGeluK0 * (1.0f + 3.0f * kGeluK1 * z * z);
}

__global__ void geglu_forward_kernel(bf16* out, const bf16* gate, const bf16* up, std::size_t n, bool vec) {
  const std::size_t i = impl::group_start();
  if (i >= n) return;
  const Pack8<bf16> z = impl::load8(gate, i, n, vec), u = impl::load8(up, i, n, vec);
  Pack8<bf16> o;
#pragma unroll
  for (int k = 0; k < kVec; ++k)
    o.v[k] = impl::to_bf16(gelu_tanh(__bfloat162float(z.v[k])) * __bfloat162float(u.v[k]));
  impl::store8(out, i, n, vec, o);
}

__global__ void geglu_backward_kernel(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate,
                                      const bf16* up, std::size_t n, bool vec) {
  const std::size_t i = impl::group_start();
  if (i >= n) return;
  const Pack8<bf16> z8 = impl::load8(gate, i, n, vec), u8 = impl::load8(up, i, n, vec),
                    g8 = impl::load8(dout, i, n, vec);
  Pack8<bf16> dg, du;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const float z = __bfloat162float(z8.v[k]), g = __bfloat162float(g8.v[k]);
    dg.v[k] = impl::to_bf16(g * __bfloat162float(u8.v[k]) * gelu_tanh_grad(z));
    du.v[k] = impl::to_bf16(g * gelu_tanh(z));
  }
  impl::store8(dgate, i, n, vec, dg);
  impl::store8(dup, i, n, vec, du);
}

// out[i] += b[i % OC] over the n = N * OC elements of out, 8 per thread.
__global__ void bias_forward_kernel(bf16* out, const bf16* b, std::size_t n, int OC, bool vec) {
  const std::size_t i = impl::group_start();
  if (i >= n) return;
  Pack8<bf16> o = impl::load8(out, i, n, vec);
  int c = int(i % std::size_t(OC));
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    o.v[k] = impl::to_bf16(__bfloat162float(o.v[k]) + impl::ld(b, c));  // past n: computed, not stored
    if (++c == OC) c = 0;
  }
  impl::store8(out, i, n, vec, o);
}

// The term of the bias gradient's column sum: dout_ic.
struct BiasGradTerm {
  const bf16* dout;
  int OC;
  __device__ float operator()(int i, int c) const { return impl::ld(dout, std::size_t(i) * OC + c); }
};

__global__ void add_kernel(bf16* out, const bf16* a, const bf16* b, std::size_t n, bool vec) {
  const std::size_t i = impl::group_start();
  if (i >= n) return;
  const Pack8<bf16> x = impl::load8(a, i, n, vec), y = impl::load8(b, i, n, vec);
  Pack8<bf16> o;
#pragma unroll
  for (int k = 0; k < kVec; ++k) o.v[k] = impl::to_bf16(__bfloat162float(x.v[k]) + __bfloat162float(y.v[k]));
  impl::store8(out, i, n, vec, o);
}

void add(bf16* out, const bf16* a, const bf16* b, std::size_t n, cudaStream_t stream) {
  const bool vec = impl::aligned16(out) && impl::aligned16(a) && impl::aligned16(b);
  add_kernel<<<impl::vec_blocks_for(n), impl::kThreads, 0, stream>>>(out, a, b, n, vec);
  STRATA_KERNEL_CHECK(stream);
}

}  // namespace

void swiglu_forward(bf16* out, const bf16* gate, const bf16* up, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  detail::CudaDeviceGuard guard(stream);
  const bool vec = impl::aligned16(out) && impl::aligned16(gate) && impl::aligned16(up);
  swiglu_forward_kernel<<<impl::vec_blocks_for(n), impl::kThreads, 0, stream>>>(out, gate, up, n, vec);
  STRATA_KERNEL_CHECK(stream);
}

void swiglu_backward(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up,
                     std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  detail::CudaDeviceGuard guard(stream);
  const bool vec = impl::aligned16(dgate) && impl::aligned16(dup) && impl::aligned16(dout) &&
                   impl::aligned16(gate) && impl::aligned16(up);
  swiglu_backward_kernel<<<impl::vec_blocks_for(n), impl::kThreads, 0, stream>>>(dgate, dup, dout, gate, up,
                                                                                 n, vec);
  STRATA_KERNEL_CHECK(stream);
}

void geglu_forward(bf16* out, const bf16* gate, const bf16* up, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  detail::CudaDeviceGuard guard(stream);
  const bool vec = impl::aligned16(out) && impl::aligned16(gate) && impl::aligned16(up);
  geglu_forward_kernel<<<impl::vec_blocks_for(n), impl::kThreads, 0, stream>>>(out, gate, up, n, vec);
  STRATA_KERNEL_CHECK(stream);
}

void geglu_backward(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up, std::size_t n,
                    cudaStream_t stream) {
  if (n == 0) return;
  detail::CudaDeviceGuard guard(stream);
  const bool vec = impl::aligned16(dgate) && impl::aligned16(dup) && impl::aligned16(dout) &&
                   impl::aligned16(gate) && impl::aligned16(up);
  geglu_backward_kernel<<<impl::vec_blocks_for(n), impl::kThreads, 0, stream>>>(dgate, dup, dout, gate, up, n,
                                                                                vec);
  STRATA_KERNEL_CHECK(stream);
}

void bias_forward(bf16* out, const bf16* b, int N, int OC, cudaStream_t stream) {
  if (N == 0 || OC == 0) return;
  detail::CudaDeviceGuard guard(stream);
  const std::size_t n = std::size_t(N) * std::size_t(OC);
  bias_forward_kernel<<<impl::vec_blocks_for(n), impl::kThreads, 0, stream>>>(out, b, n, OC,
                                                                              impl::aligned16(out));
  STRATA_KERNEL_CHECK(stream);
}

std::size_t bias_backward_scratch_bytes(int N, int OC) {
  return impl::column_sums_scratch_bytes(N, OC);
}

void bias_backward(float* db, const bf16* dout, int N, int OC, void* scratch, std::size_t scratch_bytes,
                   cudaStream_t stream) {
  if (N == 0 || OC == 0) return;  // nothing is added to db
  STRATA_CHECK(scratch != nullptr && scratch_bytes >= bias_backward_scratch_bytes(N, OC),
               "bias_backward: scratch of ", scratch_bytes, " bytes, needs bias_backward_scratch_bytes(", N,
               ", ", OC, ") = ", bias_backward_scratch_bytes(N, OC));
  detail::CudaDeviceGuard guard(stream);
  impl::column_sums(db, BiasGradTerm{dout, OC}, N, OC, scratch, stream);
}

void residual_forward(bf16* out, const bf16* a, const bf16* b, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  detail::CudaDeviceGuard guard(stream);
  add(out, a, b, n, stream);
}

void residual_backward(bf16* da, bf16* db, const bf16* dout, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  detail::CudaDeviceGuard guard(stream);
  for (bf16* d : {da, db})
    if (d != nullptr) add(d, d, dout, n, stream);
}

}  // namespace strata::kernels::cuda
