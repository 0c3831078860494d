// strata/kernels/cuda/rmsnorm.cu: RMSNorm forward and backward, one block per row.
#include "kernels/cuda/common_impl.cuh"

namespace strata::kernels::cuda {
namespace {

__global__ void rmsnorm_forward_kernel(bf16* out, float* rstd, const bf16* x, const bf16* w, int C,
                                       float eps) {
  __shared__ float shared[impl::kThreads];
  const std::size_t row = std::size_t(blockIdx.x) * C;
  float ss = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float xi = impl::ld(x, row + c);
    ss += xi * xi;
  }
  ss = impl::block_sum(ss, shared);
  const float r = 1.0f / sqrtf(ss / C + eps);
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    out[row + c] = impl::to_bf16(impl::ld(x, row + c) * r * impl::ld(w, c));
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
}

// dx_c += r (dout_c w_c - x_c r^2 (1/C) sum_j dout_j w_j x_j)
__global__ void rmsnorm_backward_dx_kernel(bf16* dx, const bf16* dout, const bf16* x, const bf16* w,
                                           const float* rstd, int C) {
  __shared__ float shared[impl::kThreads];
  const std::size_t row = std::size_t(blockIdx.x) * C;
  float dot = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    dot += impl::ld(dout, row + c) * impl::ld(w, c) * impl::ld(x, row + c);
  dot = impl::block_sum(dot, shared);
  const float r = rstd[blockIdx.x], k = dot / C * r * r;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float g = r * (impl::ld(dout, row + c) * impl::ld(w, c) - impl::ld(x, row + c) * k);
    dx[row + c] = impl::to_bf16(impl::ld(dx, row + c) + g);
  }
}

// One thread per channel, rows in order: deterministic.
__global__ void rmsnorm_backward_dw_kernel(float* dw, const bf16* dout, const bf16* x, const float* rstd,
                                           int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = 0.0f;
  for (int i = 0; i < N; ++i) {
    const std::size_t idx = std::size_t(i) * C + c;
    acc += impl::ld(dout, idx) * impl::ld(x, idx) * rstd[i];
  }
  dw[c] += acc;
}

}  // namespace

void rmsnorm_forward(bf16* out, float* rstd, const bf16* x, const bf16* w, int N, int C, float eps,
                     cudaStream_t stream) {
  if (N == 0) return;
  rmsnorm_forward_kernel<<<N, impl::kThreads, 0, stream>>>(out, rstd, x, w, C, eps);
  STRATA_KERNEL_CHECK();
}

void rmsnorm_backward(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w, const float* rstd,
                      int N, int C, cudaStream_t stream) {
  if (N == 0) return;
  rmsnorm_backward_dx_kernel<<<N, impl::kThreads, 0, stream>>>(dx, dout, x, w, rstd, C);
  STRATA_KERNEL_CHECK();
  rmsnorm_backward_dw_kernel<<<impl::blocks_for(std::size_t(C)), impl::kThreads, 0, stream>>>(dw, dout, x,
                                                                                              rstd, N, C);
  STRATA_KERNEL_CHECK();
}

}  // namespace strata::kernels::cuda
