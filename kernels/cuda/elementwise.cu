// strata/kernels/cuda/elementwise.cu: SwiGLU and the residual add.
#include "kernels/cuda/common_impl.cuh"

namespace strata::kernels::cuda {
namespace {

__device__ inline float sigmoid(float z) {
  return 1.0f / (1.0f + expf(-z));
}

__global__ void swiglu_forward_kernel(bf16* out, const bf16* gate, const bf16* up, std::size_t n) {
  const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float z = impl::ld(gate, i);
  out[i] = impl::to_bf16(z * sigmoid(z) * impl::ld(up, i));
}

__global__ void swiglu_backward_kernel(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate,
                                       const bf16* up, std::size_t n) {
  const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float z = impl::ld(gate, i), sg = sigmoid(z), g = impl::ld(dout, i);
  dgate[i] = impl::to_bf16(g * impl::ld(up, i) * sg * (1.0f + z * (1.0f - sg)));
  dup[i] = impl::to_bf16(g * z * sg);
}

__global__ void add_kernel(bf16* out, const bf16* a, const bf16* b, std::size_t n) {
  const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = impl::to_bf16(impl::ld(a, i) + impl::ld(b, i));
}

}  // namespace

void swiglu_forward(bf16* out, const bf16* gate, const bf16* up, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  swiglu_forward_kernel<<<impl::blocks_for(n), impl::kThreads, 0, stream>>>(out, gate, up, n);
  STRATA_KERNEL_CHECK();
}

void swiglu_backward(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up,
                     std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  swiglu_backward_kernel<<<impl::blocks_for(n), impl::kThreads, 0, stream>>>(dgate, dup, dout, gate, up, n);
  STRATA_KERNEL_CHECK();
}

void residual_forward(bf16* out, const bf16* a, const bf16* b, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<impl::blocks_for(n), impl::kThreads, 0, stream>>>(out, a, b, n);
  STRATA_KERNEL_CHECK();
}

void residual_backward(bf16* da, bf16* db, const bf16* dout, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  for (bf16* d : {da, db}) {
    if (d == nullptr) continue;
    add_kernel<<<impl::blocks_for(n), impl::kThreads, 0, stream>>>(d, d, dout, n);
    STRATA_KERNEL_CHECK();
  }
}

}  // namespace strata::kernels::cuda
