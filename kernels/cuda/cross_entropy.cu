// strata/kernels/cuda/cross_entropy.cu: mean cross-entropy over the tokens fused with its logits gradient.
//
// Note [cross-entropy count and mean]: the gradient of every row needs n_valid, the number of targets >= 0.
// It is counted once, in integers, by a one-block kernel before the row kernel, and parked as int bits in
// the *mean_loss slot (the only device word the caller gives us); the row kernel reads it from there, and
// the last kernel reads it again and overwrites the slot with the mean. The mean sums the per-row losses
// in double in a fixed tree order, as exact and deterministic as the CPU's double sum (not bit-identical
// to it: the order differs). The gradient scale is float(double(grad_scale) / n_valid), the CPU's.
#include <cmath>

#include "kernels/cuda/common_impl.cuh"

namespace strata::kernels::cuda {
namespace {

// One block: *slot = the int bits of the number of targets >= 0, or of `given` when it is >= 0.
__global__ void count_valid_kernel(float* slot, const std::int32_t* targets, int N, int given) {
  __shared__ int shared[impl::kThreads];
  int c = 0;
  for (int i = threadIdx.x; i < N; i += blockDim.x) c += targets[i] >= 0 ? 1 : 0;
  c = impl::block_sum(c, shared);
  if (threadIdx.x == 0) *slot = __int_as_float(given >= 0 ? given : c);
}

// One block per row. dlogits may alias logits: every logit a thread writes it has read itself, and the
// target's logit is read before the barrier that precedes any write.
__global__ void cross_entropy_kernel(bf16* dlogits, float* losses, const float* count_slot,
                                     const bf16* logits, const std::int32_t* targets, int V,
                                     float grad_scale) {
  __shared__ float shared[impl::kThreads];
  const std::size_t row = std::size_t(blockIdx.x) * V;
  const int target = targets[blockIdx.x];
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
  const int n_valid = __float_as_int(*count_slot);  // >= 1 whenever target >= 0
  const float gscale = target < 0 ? 0.0f : float(double(grad_scale) / n_valid);
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const float p = expf(impl::ld(logits, row + j) - mx) / sum;
    dlogits[row + j] = impl::to_bf16(gscale * (p - (j == target ? 1.0f : 0.0f)));
  }
}

// One block: the mean of the per-row losses over the valid rows, summed in double in a fixed order. Reads
// the count from *mean_loss before overwriting it.
__global__ void mean_loss_kernel(float* mean_loss, const float* losses, int N) {
  __shared__ double shared[impl::kThreads];
  const int n_valid = __float_as_int(*mean_loss);
  double s = 0.0;
  for (int i = threadIdx.x; i < N; i += blockDim.x) s += double(losses[i]);
  s = impl::block_sum(s, shared);  // ends with a barrier: every thread has read the count
  if (threadIdx.x == 0) *mean_loss = n_valid > 0 ? float(s / n_valid) : 0.0f;
}

}  // namespace

void cross_entropy_forward_backward(bf16* dlogits, float* losses, float* mean_loss, const bf16* logits,
                                    const std::int32_t* targets, int N, int V, float grad_scale,
                                    cudaStream_t stream, int n_valid) {
  detail::CudaDeviceGuard guard(stream);
  if (N == 0) {
    STRATA_CUDA_CHECK(cudaMemsetAsync(mean_loss, 0, sizeof(float), stream));
    return;
  }
  count_valid_kernel<<<1, impl::kThreads, 0, stream>>>(mean_loss, targets, N, n_valid);
  STRATA_KERNEL_CHECK(stream);
  cross_entropy_kernel<<<N, impl::kThreads, 0, stream>>>(dlogits, losses, mean_loss, logits, targets, V,
                                                         grad_scale);
  STRATA_KERNEL_CHECK(stream);
  mean_loss_kernel<<<1, impl::kThreads, 0, stream>>>(mean_loss, losses, N);
  STRATA_KERNEL_CHECK(stream);
}

}  // namespace strata::kernels::cuda
