// strata/kernels/cuda/rmsnorm.cu: RMSNorm forward and backward, out = x * rstd * (w + w_offset) (Llama:
// offset 0; Gemma: 1). Also the per-head q/k norm (Qwen3): the same kernels over N * NH rows of HD.
//
// The weight gradient dw_c = sum_i dout_ic x_ic rstd_i (the gradient of the stored w, whatever the offset)
// is a column sum over N rows, computed as Note [deterministic column sums] in common_impl.cuh says.
#include "kernels/cuda/common_impl.cuh"

namespace strata::kernels::cuda {
namespace {

__global__ void rmsnorm_forward_kernel(bf16* out, float* rstd, const bf16* x, const bf16* w, int C, float eps,
                                       float w_offset) {
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
    out[row + c] = impl::to_bf16(impl::ld(x, row + c) * r * (impl::ld(w, c) + w_offset));
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
}

// dx_c += r (dout_c w'_c - x_c r^2 (1/C) sum_j dout_j w'_j x_j), w' = w + w_offset
__global__ void rmsnorm_backward_dx_kernel(bf16* dx, const bf16* dout, const bf16* x, const bf16* w,
                                           const float* rstd, int C, float w_offset) {
  __shared__ float shared[impl::kThreads];
  const std::size_t row = std::size_t(blockIdx.x) * C;
  float dot = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    dot += impl::ld(dout, row + c) * (impl::ld(w, c) + w_offset) * impl::ld(x, row + c);
  dot = impl::block_sum(dot, shared);
  const float r = rstd[blockIdx.x], k = dot / C * r * r;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float g = r * (impl::ld(dout, row + c) * (impl::ld(w, c) + w_offset) - impl::ld(x, row + c) * k);
    dx[row + c] = impl::to_bf16(impl::ld(dx, row + c) + g);
  }
}

// The term of the weight gradient's column sum: dout_ic x_ic rstd_i.
struct RmsnormDwTerm {
  const bf16* dout;
  const bf16* x;
  const float* rstd;
  int C;
  __device__ float operator()(int i, int c) const {
    const std::size_t idx = std::size_t(i) * C + c;
    return impl::ld(dout, idx) * impl::ld(x, idx) * rstd[i];
  }
};

}  // namespace

void rmsnorm_forward(bf16* out, float* rstd, const bf16* x, const bf16* w, int N, int C, float eps,
                     float w_offset, cudaStream_t stream) {
  if (N == 0) return;
  detail::CudaDeviceGuard guard(stream);
  rmsnorm_forward_kernel<<<N, impl::kThreads, 0, stream>>>(out, rstd, x, w, C, eps, w_offset);
  STRATA_KERNEL_CHECK(stream);
}

std::size_t rmsnorm_backward_scratch_bytes(int N, int C) {
  return impl::column_sums_scratch_bytes(N, C);
}

void rmsnorm_backward(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w, const float* rstd,
                      int N, int C, float w_offset, void* scratch, std::size_t scratch_bytes,
                      cudaStream_t stream) {
  if (N == 0 || C == 0) return;  // dx and dw are empty, or nothing is added to dw
  STRATA_CHECK(scratch != nullptr && scratch_bytes >= rmsnorm_backward_scratch_bytes(N, C),
               "rmsnorm_backward: scratch of ", scratch_bytes,
               " bytes, needs rmsnorm_backward_scratch_bytes(", N, ", ", C,
               ") = ", rmsnorm_backward_scratch_bytes(N, C));
  detail::CudaDeviceGuard guard(stream);
  rmsnorm_backward_dx_kernel<<<N, impl::kThreads, 0, stream>>>(dx, dout, x, w, rstd, C, w_offset);
  STRATA_KERNEL_CHECK(stream);
  if (dw != nullptr)  // none for a frozen weight
    impl::column_sums(dw, RmsnormDwTerm{dout, x, rstd, C}, N, C, scratch, stream);
}

}  // namespace strata::kernels::cuda
