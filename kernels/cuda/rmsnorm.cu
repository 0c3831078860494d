// strata/kernels/cuda/rmsnorm.cu: RMSNorm forward and backward.
//
// Note [RMSNorm weight gradient]: dw_c = sum_i dout_ic x_ic rstd_i is a column sum over N rows. It runs in
// two passes: (1) a grid of (row blocks of kRowsPerBlock rows) x (channel blocks), each thread summing one
// channel over its block's rows in row order into scratch (N / kRowsPerBlock, C); (2) one thread per
// channel summing those partials in row-block order and adding the total to dw. Loads are coalesced
// across channels, the work spreads over N * C / kRowsPerBlock threads, and the summation order is fixed
// by the shape alone (not the GPU), so the result is deterministic.
#include "kernels/cuda/common_impl.cuh"

namespace strata::kernels::cuda {
namespace {

constexpr int kRowsPerBlock = 64;

int row_blocks(int N) {
  return (N + kRowsPerBlock - 1) / kRowsPerBlock;
}

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
  const float r = 1.0f / sqrtf(ss / C + eps);  // C = 0: NaN, as on the CPU
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

// Pass 1 of Note [RMSNorm weight gradient]: partial[b, c] = sum over the rows of row block b.
__global__ void rmsnorm_dw_partial_kernel(float* partial, const bf16* dout, const bf16* x, const float* rstd,
                                          int N, int C) {
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int i0 = blockIdx.x * kRowsPerBlock, i1 = min(N, i0 + kRowsPerBlock);
  float acc = 0.0f;
  for (int i = i0; i < i1; ++i) {
    const std::size_t idx = std::size_t(i) * C + c;
    acc += impl::ld(dout, idx) * impl::ld(x, idx) * rstd[i];
  }
  partial[std::size_t(blockIdx.x) * C + c] = acc;
}

// Pass 2: dw[c] += the partials of channel c in row-block order.
__global__ void rmsnorm_dw_total_kernel(float* dw, const float* partial, int blocks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = 0.0f;
  for (int b = 0; b < blocks; ++b) acc += partial[std::size_t(b) * C + c];
  dw[c] += acc;
}

}  // namespace

void rmsnorm_forward(bf16* out, float* rstd, const bf16* x, const bf16* w, int N, int C, float eps,
                     cudaStream_t stream) {
  if (N == 0) return;
  detail::CudaDeviceGuard guard(stream);
  rmsnorm_forward_kernel<<<N, impl::kThreads, 0, stream>>>(out, rstd, x, w, C, eps);
  STRATA_KERNEL_CHECK(stream);
}

std::size_t rmsnorm_backward_scratch_bytes(int N, int C) {
  return std::size_t(row_blocks(N)) * std::size_t(C) * sizeof(float);
}

void rmsnorm_backward(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w, const float* rstd,
                      int N, int C, void* scratch, std::size_t scratch_bytes, cudaStream_t stream) {
  if (N == 0 || C == 0) return;  // dx and dw are empty, or nothing is added to dw
  STRATA_CHECK(scratch != nullptr && scratch_bytes >= rmsnorm_backward_scratch_bytes(N, C),
               "rmsnorm_backward: scratch of ", scratch_bytes,
               " bytes, needs rmsnorm_backward_scratch_bytes(", N, ", ", C,
               ") = ", rmsnorm_backward_scratch_bytes(N, C));
  detail::CudaDeviceGuard guard(stream);
  rmsnorm_backward_dx_kernel<<<N, impl::kThreads, 0, stream>>>(dx, dout, x, w, rstd, C);
  STRATA_KERNEL_CHECK(stream);
  const int blocks = row_blocks(N);
  float* partial = static_cast<float*>(scratch);
  const dim3 grid(unsigned(blocks), impl::blocks_for(std::size_t(C)));  // row blocks in x: no 65535 limit
  rmsnorm_dw_partial_kernel<<<grid, impl::kThreads, 0, stream>>>(partial, dout, x, rstd, N, C);
  STRATA_KERNEL_CHECK(stream);
  rmsnorm_dw_total_kernel<<<impl::blocks_for(std::size_t(C)), impl::kThreads, 0, stream>>>(dw, partial,
                                                                                           blocks, C);
  STRATA_KERNEL_CHECK(stream);
}

}  // namespace strata::kernels::cuda
