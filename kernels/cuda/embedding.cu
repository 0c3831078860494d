// strata/kernels/cuda/embedding.cu: token embedding lookup and its gradient.
#include <cmath>

#include "kernels/cuda/common_impl.cuh"

namespace strata::kernels::cuda {
namespace {

__global__ void embedding_forward_kernel(bf16* out, const std::int32_t* tokens, const bf16* wte, int N, int C,
                                         int V) {
  const std::size_t idx = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= std::size_t(N) * C) return;
  const std::size_t i = idx / C, c = idx % C;
  const int tok = tokens[i];
  out[idx] = (tok >= 0 && tok < V) ? wte[std::size_t(tok) * C + c] : impl::to_bf16(NAN);
}

// Block (x: channel block, y: vocabulary slice) adds the rows of its slice, visiting positions in order:
// every dwte element is summed in position order, whatever the grid.
__global__ void embedding_backward_kernel(float* dwte, const bf16* dout, const std::int32_t* tokens, int N,
                                          int C, int V, int slice) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int v0 = blockIdx.y * slice, v1 = min(V, v0 + slice);
  if (c >= C) return;
  for (int i = 0; i < N; ++i) {
    const int tok = tokens[i];
    if (tok >= v0 && tok < v1) dwte[std::size_t(tok) * C + c] += impl::ld(dout, std::size_t(i) * C + c);
  }
}

}  // namespace

void embedding_forward(bf16* out, const std::int32_t* tokens, const bf16* wte, int N, int C, int V,
                       cudaStream_t stream) {
  if (N == 0 || C == 0) return;
  embedding_forward_kernel<<<impl::blocks_for(std::size_t(N) * C), impl::kThreads, 0, stream>>>(out, tokens,
                                                                                                wte, N, C, V);
  STRATA_KERNEL_CHECK();
}

void embedding_backward(float* dwte, const bf16* dout, const std::int32_t* tokens, int N, int C, int V,
                        cudaStream_t stream) {
  if (N == 0 || C == 0) return;
  constexpr int kSlices = 32;
  const int slice = (V + kSlices - 1) / kSlices;
  const dim3 grid(impl::blocks_for(std::size_t(C)), unsigned((V + slice - 1) / slice));
  embedding_backward_kernel<<<grid, impl::kThreads, 0, stream>>>(dwte, dout, tokens, N, C, V, slice);
  STRATA_KERNEL_CHECK();
}

}  // namespace strata::kernels::cuda
