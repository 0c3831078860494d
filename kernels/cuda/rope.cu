// strata/kernels/cuda/rope.cu: rotary position embedding, Hugging Face's rotate_half convention.
#include <vector>

#include "kernels/cuda/common_impl.cuh"

namespace strata::kernels::cuda {
namespace {

// One thread per (row, head, i < HD/2): rotates the pair (i, i + HD/2) by sign * angle, the angle of
// position t or, with pos ((B,T)), pos[b, t]. Both elements are read before either is written, so out may
// alias x.
__global__ void rope_kernel(bf16* out, const bf16* x, const float* cos, const float* sin,
                            const std::int32_t* pos, int T, int H, int HD, std::size_t pairs, float sign) {
  const std::size_t idx = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= pairs) return;
  const int half = HD / 2;
  const std::size_t i = idx % half, bth = idx / half;  // bth = (b * T + t) * H + h
  const std::size_t t = pos ? std::size_t(pos[bth / H]) : (bth / H) % T;
  const std::size_t base = bth * HD;
  const float x1 = impl::ld(x, base + i), x2 = impl::ld(x, base + i + half);
  const float c = cos[t * half + i], s = sign * sin[t * half + i];
  out[base + i] = impl::to_bf16(x1 * c - x2 * s);
  out[base + i + half] = impl::to_bf16(x2 * c + x1 * s);
}

void rotate(bf16* out, const bf16* x, const float* cos, const float* sin, const std::int32_t* pos, int B,
            int T, int H, int HD, float sign, cudaStream_t stream) {
  STRATA_CHECK(HD % 2 == 0, "rotary embedding: head width ", HD, " must be even");
  const std::size_t pairs = std::size_t(B) * T * H * (HD / 2);
  if (pairs == 0) return;
  detail::CudaDeviceGuard guard(stream);
  rope_kernel<<<impl::blocks_for(pairs), impl::kThreads, 0, stream>>>(out, x, cos, sin, pos, T, H, HD, pairs,
                                                                      sign);
  STRATA_KERNEL_CHECK(stream);
}

}  // namespace

void rope_cache(float* cos, float* sin, int T, int HD, const float* inv_freq, cudaStream_t stream) {
  const std::size_t n = std::size_t(T) * (HD / 2);
  std::vector<float> hc(n), hs(n);
  cpu::rope_cache(hc.data(), hs.data(), T, HD, inv_freq);
  if (n == 0) return;
  detail::CudaDeviceGuard guard(stream);
  STRATA_CUDA_CHECK(cudaMemcpyAsync(cos, hc.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream));
  STRATA_CUDA_CHECK(cudaMemcpyAsync(sin, hs.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream));
  STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));  // the host tables die here
}

void rope_forward(bf16* out, const bf16* x, const float* cos, const float* sin, int B, int T, int H, int HD,
                  const std::int32_t* pos, cudaStream_t stream) {
  rotate(out, x, cos, sin, pos, B, T, H, HD, 1.0f, stream);
}

void rope_backward(bf16* dx, const bf16* dout, const float* cos, const float* sin, int B, int T, int H,
                   int HD, const std::int32_t* pos, cudaStream_t stream) {
  rotate(dx, dout, cos, sin, pos, B, T, H, HD, -1.0f, stream);
}

}  // namespace strata::kernels::cuda
