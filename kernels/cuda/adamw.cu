// strata/kernels/cuda/adamw.cu: the AdamW update of kernels/cpu/ops.h on the device, bit-identical to it.
//
// Note [no contraction]: nvcc fuses a * b + c into one FMA by default, which rounds once instead of
// twice and so differs from the CPU (and cpu_optim) in the last bit. The kernel spells every operation
// with its _rn intrinsic, which the compiler never fuses; sqrt and division are the IEEE ones.
#include "kernels/cpu/adamw_impl.h"
#include "kernels/cuda/common_impl.cuh"

namespace strata::kernels::cuda {
namespace {

using Scalars = cpu::impl::AdamWScalars;

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, bf16* p_bf16, std::size_t n,
                             Scalars s, float grad_scale) {
  const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float grad = __fmul_rn(g[i], grad_scale), param = p[i];
  if (s.l2) grad = __fadd_rn(__fmul_rn(param, s.weight_decay), grad);
  const float mi = __fadd_rn(__fmul_rn(s.beta1, m[i]), __fmul_rn(s.one_minus_beta1, grad));
  const float vi = __fadd_rn(__fmul_rn(s.beta2, v[i]), __fmul_rn(s.one_minus_beta2, __fmul_rn(grad, grad)));
  const float update = __fdiv_rn(mi, __fadd_rn(__fmul_rn(__fsqrt_rn(vi), s.bias2), s.eps));
  if (s.decoupled) param = __fadd_rn(param, __fmul_rn(s.w_decay, param));
  param = __fadd_rn(param, __fmul_rn(s.step_size, update));
  m[i] = mi;
  v[i] = vi;
  p[i] = param;
  if (p_bf16 != nullptr) p_bf16[i] = __ushort_as_bfloat16(impl::f32_to_bf16_bits(param));
}

}  // namespace

void adamw_update(float* p, const float* g, float* m, float* v, bf16* p_bf16, std::size_t n,
                  const AdamWParams& hp, std::int64_t step, float grad_scale, cudaStream_t stream) {
  const Scalars s = cpu::impl::adamw_scalars(hp, step);
  if (n == 0) return;
  detail::CudaDeviceGuard guard(stream);
  adamw_kernel<<<impl::blocks_for(n), impl::kThreads, 0, stream>>>(p, g, m, v, p_bf16, n, s, grad_scale);
  STRATA_KERNEL_CHECK(stream);
}

}  // namespace strata::kernels::cuda
