// strata/kernels/cuda/attention.cu: causal self-attention with grouped-query heads. Plain kernels over an
// fp32 (B,NH,T,T) score buffer: correct first, O(T^2) memory (DESIGN.md accepts this for now).
//
// Layouts as in kernels/cpu/ops.h: q (B,T,NH,HD), k and v (B,T,NKV,HD); query head h reads key/value
// head h / (NH / NKV). Scores use scale = 1 / sqrt(HD). Query t attends to keys lo(t) <= s <= t: lo(t) = 0
// (causal), or t - window + 1 with a sliding window (kernels/cpu/ops.h), or later with per-token positions:
// the start of t's document, t - pos[b, t] (kernels/cpu's Note [Document masks]); the kernels loop over
// that band only, and the score rows hold exact zeros outside it. Compiled, never run on a GPU here.
#include <cmath>

#include "kernels/cuda/common_impl.cuh"

namespace strata::kernels::cuda {
namespace {

struct Shape {
  int B, T, NH, NKV, HD;
  int window;               // 0: causal
  const std::int32_t* pos;  // (B,T) positions, or null: no documents
  __device__ int group() const { return NH / NKV; }
  // The first key query t of batch row b sees, and the last query that may see key s (the window's; a
  // query up to it may still start its document after s: lo() says).
  __device__ std::size_t lo(std::size_t b, std::size_t t) const {
    std::size_t first = window > 0 && t >= std::size_t(window) ? t - std::size_t(window) + 1 : 0;
    if (pos) {
      const std::size_t back = std::size_t(max(pos[b * std::size_t(T) + t], 0));
      first = max(first, back < t ? t - back : std::size_t(0));
    }
    return first;
  }
  __device__ std::size_t hi(std::size_t s) const {
    const std::size_t last = std::size_t(T) - 1;
    return window > 0 && s + std::size_t(window) - 1 < last ? s + std::size_t(window) - 1 : last;
  }
  __device__ std::size_t q_at(std::size_t b, std::size_t t, std::size_t h) const {
    return ((b * T + t) * NH + h) * HD;
  }
  __device__ std::size_t kv_at(std::size_t b, std::size_t s, std::size_t g) const {
    return ((b * T + s) * NKV + g) * HD;
  }
};

// att[b,h,t,s] = q[b,t,h] . k[b,s,g] * scale for s in the band (the rest is set by the softmax).
__global__ void scores_kernel(float* att, const bf16* q, const bf16* k, Shape sh, float scale) {
  const std::size_t idx = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t T = sh.T;
  if (idx >= std::size_t(sh.B) * sh.NH * T * T) return;
  const std::size_t s = idx % T, t = (idx / T) % T, h = (idx / (T * T)) % sh.NH, b = idx / (T * T * sh.NH);
  if (s > t || s < sh.lo(b, t)) return;
  const bf16* qt = q + sh.q_at(b, t, h);
  const bf16* ks = k + sh.kv_at(b, s, h / sh.group());
  float d = 0.0f;
  for (int e = 0; e < sh.HD; ++e) d += __bfloat162float(qt[e]) * __bfloat162float(ks[e]);
  att[idx] = d * scale;
}

// One block per (b,h,t) row: softmax over the band lo <= s <= t, zero outside it.
__global__ void softmax_kernel(float* att, Shape sh) {
  __shared__ float shared[impl::kThreads];
  const int T = sh.T;
  float* a = att + std::size_t(blockIdx.x) * T;
  const int t = blockIdx.x % T, lo = int(sh.lo(blockIdx.x / T / sh.NH, std::size_t(t)));
  float mx = -INFINITY;
  for (int s = lo + threadIdx.x; s <= t; s += blockDim.x) mx = fmaxf(mx, a[s]);
  mx = impl::block_max(mx, shared);
  float sum = 0.0f;
  for (int s = lo + threadIdx.x; s <= t; s += blockDim.x) {
    const float e = expf(a[s] - mx);
    a[s] = e;
    sum += e;
  }
  sum = impl::block_sum(sum, shared);
  const float inv = 1.0f / sum;
  for (int s = threadIdx.x; s < T; s += blockDim.x) a[s] = s >= lo && s <= t ? a[s] * inv : 0.0f;
}

// out[b,t,h,d] = sum_{lo(t)<=s<=t} att[b,h,t,s] v[b,s,g,d].
__global__ void weighted_values_kernel(bf16* out, const float* att, const bf16* v, Shape sh) {
  const std::size_t idx = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= std::size_t(sh.B) * sh.T * sh.NH * sh.HD) return;
  const std::size_t d = idx % sh.HD, h = (idx / sh.HD) % sh.NH,
                    t = (idx / (std::size_t(sh.HD) * sh.NH)) % sh.T,
                    b = idx / (std::size_t(sh.HD) * sh.NH * sh.T);
  const float* a = att + ((b * sh.NH + h) * sh.T + t) * sh.T;
  const std::size_t g = h / sh.group();
  float acc = 0.0f;
  for (std::size_t s = sh.lo(b, t); s <= t; ++s) acc += a[s] * __bfloat162float(v[sh.kv_at(b, s, g) + d]);
  out[idx] = impl::to_bf16(acc);
}

// scratch[b,h,t,s] = dout[b,t,h] . v[b,s,g] for s in the band, 0 outside it.
__global__ void dprobs_kernel(float* scratch, const bf16* dout, const bf16* v, Shape sh) {
  const std::size_t idx = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t T = sh.T;
  if (idx >= std::size_t(sh.B) * sh.NH * T * T) return;
  const std::size_t s = idx % T, t = (idx / T) % T, h = (idx / (T * T)) % sh.NH, b = idx / (T * T * sh.NH);
  if (s > t || s < sh.lo(b, t)) {
    scratch[idx] = 0.0f;
    return;
  }
  const bf16* gt = dout + sh.q_at(b, t, h);
  const bf16* vs = v + sh.kv_at(b, s, h / sh.group());
  float d = 0.0f;
  for (int e = 0; e < sh.HD; ++e) d += __bfloat162float(gt[e]) * __bfloat162float(vs[e]);
  scratch[idx] = d;
}

// One block per row: scratch = a (da - sum_s a da) * scale over the band, the gradient of the scaled
// scores (dprobs_kernel left zeros outside it).
__global__ void softmax_backward_kernel(float* scratch, const float* att, Shape sh, float scale) {
  __shared__ float shared[impl::kThreads];
  const int T = sh.T;
  const std::size_t row = std::size_t(blockIdx.x) * T;
  const int t = blockIdx.x % T, lo = int(sh.lo(blockIdx.x / T / sh.NH, std::size_t(t)));
  float adot = 0.0f;
  for (int s = lo + threadIdx.x; s <= t; s += blockDim.x) adot += att[row + s] * scratch[row + s];
  adot = impl::block_sum(adot, shared);
  for (int s = lo + threadIdx.x; s <= t; s += blockDim.x)
    scratch[row + s] = att[row + s] * (scratch[row + s] - adot) * scale;
}

// dq[b,t,h,d] = sum_{lo(t)<=s<=t} scratch[b,h,t,s] k[b,s,g,d].
__global__ void dq_kernel(bf16* dq, const float* scratch, const bf16* k, Shape sh) {
  const std::size_t idx = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= std::size_t(sh.B) * sh.T * sh.NH * sh.HD) return;
  const std::size_t d = idx % sh.HD, h = (idx / sh.HD) % sh.NH,
                    t = (idx / (std::size_t(sh.HD) * sh.NH)) % sh.T,
                    b = idx / (std::size_t(sh.HD) * sh.NH * sh.T);
  const float* dp = scratch + ((b * sh.NH + h) * sh.T + t) * sh.T;
  const std::size_t g = h / sh.group();
  float acc = 0.0f;
  for (std::size_t s = sh.lo(b, t); s <= t; ++s) acc += dp[s] * __bfloat162float(k[sh.kv_at(b, s, g) + d]);
  dq[idx] = impl::to_bf16(acc);
}

// dk[b,s,g,d] = sum_{h in g} sum_{s<=t<=hi(s)} scratch[b,h,t,s] q[b,t,h,d]; dv likewise with att and dout.
// Where a document mask cut (t, s) out, both rows hold exact zeros, so the sums add nothing from there.
__global__ void dkv_kernel(bf16* dk, bf16* dv, const float* scratch, const float* att, const bf16* q,
                           const bf16* dout, Shape sh) {
  const std::size_t idx = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= std::size_t(sh.B) * sh.T * sh.NKV * sh.HD) return;
  const std::size_t d = idx % sh.HD, g = (idx / sh.HD) % sh.NKV,
                    s = (idx / (std::size_t(sh.HD) * sh.NKV)) % sh.T,
                    b = idx / (std::size_t(sh.HD) * sh.NKV * sh.T);
  float acc_k = 0.0f, acc_v = 0.0f;
  for (std::size_t h = g * sh.group(); h < (g + 1) * sh.group(); ++h) {
    const std::size_t rows = (b * sh.NH + h) * sh.T;
    for (std::size_t t = s; t <= sh.hi(s); ++t) {
      const std::size_t at = (rows + t) * sh.T + s, qi = sh.q_at(b, t, h) + d;
      acc_k += scratch[at] * __bfloat162float(q[qi]);
      acc_v += att[at] * __bfloat162float(dout[qi]);
    }
  }
  dk[idx] = impl::to_bf16(acc_k);
  dv[idx] = impl::to_bf16(acc_v);
}

Shape checked_shape(const char* op, int B, int T, int NH, int NKV, int HD, int window,
                    const std::int32_t* pos) {
  STRATA_CHECK(NKV > 0 && NH % NKV == 0, op, ": n_heads ", NH, " must be a positive multiple of n_kv_heads ",
               NKV);
  STRATA_CHECK(HD > 0, op, ": head width ", HD, " must be positive");
  STRATA_CHECK(window >= 0, op, ": sliding window ", window, " must be 0 (none) or positive");
  return Shape{B, T, NH, NKV, HD, window, pos};
}

}  // namespace

void attention_forward(bf16* out, float* att, const bf16* q, const bf16* k, const bf16* v, int B, int T,
                       int NH, int NKV, int HD, int window, const std::int32_t* pos, cudaStream_t stream) {
  const Shape sh = checked_shape("attention_forward", B, T, NH, NKV, HD, window, pos);
  const std::size_t rows = std::size_t(B) * NH * T;
  if (rows == 0) return;
  detail::CudaDeviceGuard guard(stream);
  const float scale = float(1.0 / std::sqrt(double(HD)));
  scores_kernel<<<impl::blocks_for(rows * T), impl::kThreads, 0, stream>>>(att, q, k, sh, scale);
  STRATA_KERNEL_CHECK(stream);
  softmax_kernel<<<unsigned(rows), impl::kThreads, 0, stream>>>(att, sh);
  STRATA_KERNEL_CHECK(stream);
  weighted_values_kernel<<<impl::blocks_for(rows * HD), impl::kThreads, 0, stream>>>(out, att, v, sh);
  STRATA_KERNEL_CHECK(stream);
}

void attention_backward(bf16* dq, bf16* dk, bf16* dv, float* scratch, const bf16* dout, const bf16* q,
                        const bf16* k, const bf16* v, const bf16* /*out: unread*/, const float* att, int B,
                        int T, int NH, int NKV, int HD, int window, const std::int32_t* pos,
                        cudaStream_t stream) {
  const Shape sh = checked_shape("attention_backward", B, T, NH, NKV, HD, window, pos);
  const std::size_t rows = std::size_t(B) * NH * T;
  if (rows == 0) return;
  detail::CudaDeviceGuard guard(stream);
  const float scale = float(1.0 / std::sqrt(double(HD)));
  dprobs_kernel<<<impl::blocks_for(rows * T), impl::kThreads, 0, stream>>>(scratch, dout, v, sh);
  STRATA_KERNEL_CHECK(stream);
  softmax_backward_kernel<<<unsigned(rows), impl::kThreads, 0, stream>>>(scratch, att, sh, scale);
  STRATA_KERNEL_CHECK(stream);
  dq_kernel<<<impl::blocks_for(rows * HD), impl::kThreads, 0, stream>>>(dq, scratch, k, sh);
  STRATA_KERNEL_CHECK(stream);
  const std::size_t kv = std::size_t(B) * T * NKV * HD;
  dkv_kernel<<<impl::blocks_for(kv), impl::kThreads, 0, stream>>>(dk, dv, scratch, att, q, dout, sh);
  STRATA_KERNEL_CHECK(stream);
}

}  // namespace strata::kernels::cuda
