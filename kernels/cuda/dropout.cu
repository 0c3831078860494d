// strata/kernels/cuda/dropout.cu: dropout with a counter-based mask, 8 bf16 per thread with 16-byte loads
// (Note [vectorised element-wise kernels] in common_impl.cuh). The mask and factor are the CPU's
// (kernels/cpu/dropout_impl.h, the same integer arithmetic and one fp32 multiply), so the output is
// kernels/cpu's bf16 dropout bit for bit.
#include "kernels/cpu/dropout_impl.h"
#include "kernels/cuda/common_impl.cuh"

namespace strata::kernels::cuda {
namespace {

namespace kci = kernels::cpu::impl;

__global__ void dropout_kernel(bf16* out, const bf16* in, std::size_t n, std::uint64_t key,
                               std::uint64_t threshold, float scale, bool vec) {
  const std::size_t i = impl::group_start();
  if (i >= n) return;
  const impl::Pack8<bf16> x = impl::load8(in, i, n, vec);
  impl::Pack8<bf16> o;
#pragma unroll
  for (int k = 0; k < impl::kVec; ++k)
    o.v[k] = impl::to_bf16(__bfloat162float(x.v[k]) * kci::dropout_factor(key, i + k, threshold, scale));
  impl::store8(out, i, n, vec, o);
}

}  // namespace

void dropout(bf16* out, const bf16* in, std::size_t n, double p, std::uint64_t key, cudaStream_t stream) {
  if (n == 0) return;
  detail::CudaDeviceGuard guard(stream);
  if (p == 0) {  // the identity (kernels/cpu's dropout copies)
    if (out != in)
      STRATA_CUDA_CHECK(cudaMemcpyAsync(out, in, n * sizeof(bf16), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  const kci::DropoutScalars d = kci::dropout_scalars(p);
  const bool vec = impl::aligned16(out) && impl::aligned16(in);
  dropout_kernel<<<impl::vec_blocks_for(n), impl::kThreads, 0, stream>>>(out, in, n, key, d.threshold,
                                                                         d.scale, vec);
  STRATA_KERNEL_CHECK(stream);
}

}  // namespace strata::kernels::cuda
