// strata/kernels/cuda/cross_entropy.cu: mean cross-entropy over the tokens fused with its logits gradient.
#include <cmath>

#include "kernels/cuda/common_impl.cuh"

namespace strata::kernels::cuda {
namespace {

// Rows with a target >= 0, counted by the whole block (every block counts the same way).
__device__ int count_valid(const std::int32_t* targets, int N, float* shared) {
  float c = 0.0f;
  for (int i = threadIdx.x; i < N; i += blockDim.x) c += targets[i] >= 0 ? 1.0f : 0.0f;
  return int(impl::block_sum(c, shared));
}

// One block per row. dlogits may alias logits: every logit a thread writes it has read itself, and the
// target's logit is read before the barrier that precedes any write.
__global__ void cross_entropy_kernel(bf16* dlogits, float* losses, const bf16* logits,
                                     const std::int32_t* targets, int N, int V, float grad_scale) {
  __shared__ float shared[impl::kThreads];
  const std::size_t row = std::size_t(blockIdx.x) * V;
  const int target = targets[blockIdx.x];
  const int n_valid = count_valid(targets, N, shared);
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, impl::ld(logits, row + j));
  mx = impl::block_max(mx, shared);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < V; j += blockDim.x) sum += expf(impl::ld(logits, row + j) - mx);
  const float target_logit = (target >= 0 && target < V) ? impl::ld(logits, row + target) : 0.0f;
  sum = impl::block_sum(sum, shared);  // ends with a barrier: every read above is done
  if (threadIdx.x == 0)
    losses[blockIdx.x] = target < 0 ? 0.0f : target >= V ? NAN : logf(sum) - (target_logit - mx);
  if (dlogits == nullptr) return;
  const float gscale = target < 0 ? 0.0f : grad_scale / float(n_valid);
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const float p = expf(impl::ld(logits, row + j) - mx) / sum;
    dlogits[row + j] = impl::to_bf16(gscale * (p - (j == target ? 1.0f : 0.0f)));
  }
}

// One block: the mean of the per-row losses over the valid rows, in a fixed order.
__global__ void mean_loss_kernel(float* mean_loss, const float* losses, const std::int32_t* targets, int N) {
  __shared__ float shared[impl::kThreads];
  const int n_valid = count_valid(targets, N, shared);
  float s = 0.0f;
  for (int i = threadIdx.x; i < N; i += blockDim.x) s += losses[i];
  s = impl::block_sum(s, shared);
  if (threadIdx.x == 0) *mean_loss = n_valid > 0 ? s / float(n_valid) : 0.0f;
}

}  // namespace

void cross_entropy_forward_backward(bf16* dlogits, float* losses, float* mean_loss, const bf16* logits,
                                    const std::int32_t* targets, int N, int V, float grad_scale,
                                    cudaStream_t stream) {
  if (N == 0) {
    STRATA_CUDA_CHECK(cudaMemsetAsync(mean_loss, 0, sizeof(float), stream));
    return;
  }
  cross_entropy_kernel<<<N, impl::kThreads, 0, stream>>>(dlogits, losses, logits, targets, N, V, grad_scale);
  STRATA_KERNEL_CHECK();
  mean_loss_kernel<<<1, impl::kThreads, 0, stream>>>(mean_loss, losses, targets, N);
  STRATA_KERNEL_CHECK();
}

}  // namespace strata::kernels::cuda
