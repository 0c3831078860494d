// strata/kernels/cuda/ops.h: the ops of kernels/cpu/ops.h on a CUDA device: bf16 storage, fp32
// accumulation, matrix products through cuBLASLt. Built only when STRATA_WITH_CUDA. kernels/cpu is the
// oracle: tests/kernels compares every op here with it.
//
// Example (one block's attention half, forward and backward, on stream s; shapes as in kernels/cpu/ops.h):
//   namespace kc = strata::kernels::cuda;
//   auto dev = strata::open_device({.backend = "cuda"});
//   kc::Gemm gemm(*dev);                                  // cuBLASLt handle + workspace from dev, one per
//   stream strata::DeviceBuffer scratch(*dev, kc::rmsnorm_backward_scratch_bytes(N, C), "rmsnorm scratch");
//   kc::rope_cache(cos, sin, T, HD, inv_freq, s);         // device tables, the CPU's values
//   kc::rmsnorm_forward(xn, rstd, x, w_norm, N, C, 1e-5f, /*w_offset=*/0.0f, s);
//   kc::linear_forward(gemm, q, xn, wq, N, C, NH * HD, s);
//   kc::rope_forward(q, q, cos, sin, B, T, NH, HD, /*pos=*/nullptr, s);
//   kc::attention_forward(y, att, q, k, v, B, T, NH, NKV, HD, /*window=*/0, /*pos=*/nullptr, s);
//   ...
//   kc::attention_backward(dq, dk, dv, att_scratch, dy, q, k, v, y, att, B, T, NH, NKV, HD, /*window=*/0,
//                          /*pos=*/nullptr, s);
//   kc::linear_backward(gemm, dxn, dwq, dq, xn, wq, N, C, NH * HD, s);   // dxn +=, dwq += (fp32)
//   kc::rmsnorm_backward(dx, dw, dxn, x, w_norm, rstd, N, C, 0.0f, scratch.data(), scratch.size(), s);
//
// Conventions (the CPU header's, with these dtypes):
//   - activations, weights and activation gradients are bf16 (`bf16*`); every sum is accumulated in fp32;
//   - parameter gradients are fp32 and ACCUMULATED (+=), so micro-batches add into one buffer;
//   - input gradients are written or accumulated exactly as the CPU function of the same name says;
//   - saved statistics (rstd, attention probabilities, score gradients) and losses are fp32;
//   - every pointer is device memory unless it says otherwise; all work is queued on `stream`, on the
//     device the stream belongs to (whatever device the calling thread has current), and nothing
//     synchronises the host except rope_cache. Every launch is checked (STRATA_KERNEL_CHECK) and raises
//     strata::BackendError on failure; STRATA_CUDA_SYNC=1 also reports device faults at their launch;
//   - nothing here allocates device memory: an op that needs a temporary takes `scratch` (device memory,
//     at least <op>_scratch_bytes(...) bytes, overwritten, free again once the op's work on the stream
//     has run) from its caller, who allocates it through strata::Device so the device's count is complete;
//   - zero-sized shapes do what the CPU functions do (no launch with an empty grid).
// Token ids and targets are not validated on the device: a token outside [0, V) gives a NaN embedding
// row (so the loss and the overflow check show it) and a target >= V gives a NaN loss.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/device.h"
#include "kernels/cpu/ops.h"

namespace strata::kernels::cuda {

using bf16 = __nv_bfloat16;  // bf16 storage
using fp16 = __half;         // fp16 storage (casts only)
using AdamWParams = strata::kernels::cpu::AdamWParams;

inline constexpr std::size_t kGemmWorkspaceBytes = std::size_t(32) << 20;  // cuBLASLt's recommendation

// A cuBLASLt handle, its workspace (allocated from `device`, counted there) and the cuBLASLt descriptors
// and algorithm chosen for each product shape seen so far. Use one per stream (a call may run
// concurrently with calls on other Gemm objects, not with another call on the same one). Destroy it
// after the work queued through it has completed and before `device`. Throws BackendError if cuBLASLt
// fails, OutOfMemory if the workspace does not fit.
class Gemm {
 public:
  explicit Gemm(strata::Device& device, std::size_t workspace_bytes = kGemmWorkspaceBytes);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  struct Impl;
  Impl& impl() { return *impl_; }
  // Device bytes of the workspace taken at construction.
  std::size_t workspace_bytes() const;

 private:
  std::unique_ptr<Impl> impl_;
};

// ---- embedding ---------------------------------------------------------------------------------------
void embedding_forward(bf16* out /*(N,C)*/, const std::int32_t* tokens /*(N)*/, const bf16* wte /*(V,C)*/,
                       int N, int C, int V, cudaStream_t stream);
// dwte[tokens[i], :] += dout[i, :] (fp32, accumulates; each row summed in position order, as on the CPU:
// deterministic). Positions are grouped by token with a stable radix sort in `scratch`; tokens outside
// [0, V) are skipped.
std::size_t embedding_backward_scratch_bytes(int N, int V);
void embedding_backward(float* dwte /*(V,C) +=*/, const bf16* dout /*(N,C)*/,
                        const std::int32_t* tokens /*(N)*/, int N, int C, int V, void* scratch,
                        std::size_t scratch_bytes, cudaStream_t stream);

// ---- RMSNorm: out = x * rstd * (w + w_offset) (Llama: w_offset 0; Gemma: 1) ---------------------------
// Per-head q/k norm (Qwen3) is the same call over N * NH rows of HD.
void rmsnorm_forward(bf16* out /*(N,C)*/, float* rstd /*(N)*/, const bf16* x /*(N,C)*/, const bf16* w /*(C)*/,
                     int N, int C, float eps, float w_offset, cudaStream_t stream);
// dx += (bf16, accumulates), dw += (fp32, accumulates: the gradient of the stored w, whatever the offset;
// deterministic: fixed blocks of rows summed in order into `scratch`, then the blocks in order).
std::size_t rmsnorm_backward_scratch_bytes(int N, int C);
void rmsnorm_backward(bf16* dx /*(N,C) +=*/, float* dw /*(C) +=*/, const bf16* dout /*(N,C)*/,
                      const bf16* x /*(N,C)*/, const bf16* w /*(C)*/, const float* rstd /*(N)*/, int N, int C,
                      float w_offset, void* scratch, std::size_t scratch_bytes, cudaStream_t stream);

// ---- linear (no bias): out = x W^T, cuBLASLt, fp32 accumulation -------------------------------------------
// IC = 0 writes out = 0, as the CPU's sgemm with k = 0 does.
void linear_forward(Gemm& gemm, bf16* out /*(N,OC)*/, const bf16* x /*(N,IC)*/, const bf16* w /*(OC,IC)*/,
                    int N, int IC, int OC, cudaStream_t stream);
// dx += dout W (bf16, accumulates; nullptr skips it); dw += dout^T x (fp32, accumulates).
void linear_backward(Gemm& gemm, bf16* dx /*(N,IC) += or nullptr*/, float* dw /*(OC,IC) +=*/,
                     const bf16* dout /*(N,OC)*/, const bf16* x /*(N,IC)*/, const bf16* w /*(OC,IC)*/, int N,
                     int IC, int OC, cudaStream_t stream);

// ---- a projection's bias (nn.Linear with bias) -----------------------------------------------------
// out[i, :] += b (bf16, rounded once per element).
void bias_forward(bf16* out /*(N,OC) +=*/, const bf16* b /*(OC)*/, int N, int OC, cudaStream_t stream);
// db += the column sums of dout (fp32, accumulates; deterministic: fixed blocks of rows summed in order into
// `scratch`, then the blocks in order, as rmsnorm's dw).
std::size_t bias_backward_scratch_bytes(int N, int OC);
void bias_backward(float* db /*(OC) +=*/, const bf16* dout /*(N,OC)*/, int N, int OC, void* scratch,
                   std::size_t scratch_bytes, cudaStream_t stream);

// ---- rotary position embedding (Hugging Face rotate_half) ----------------------------------------------
// Fills device tables with kernels/cpu's rope_cache values (computed on the host, copied, and waited for).
void rope_cache(float* cos /*(T,HD/2)*/, float* sin /*(T,HD/2)*/, int T, int HD,
                const float* inv_freq /*(HD/2) host*/, cudaStream_t stream);
// out may alias x. pos: null, or (B,T) positions (kernels/cpu's Note [Document masks]).
void rope_forward(bf16* out /*(B,T,H,HD)*/, const bf16* x /*(B,T,H,HD)*/, const float* cos /*(T,HD/2)*/,
                  const float* sin /*(T,HD/2)*/, int B, int T, int H, int HD, const std::int32_t* pos,
                  cudaStream_t stream);
// dx = R^T dout (writes; may alias dout).
void rope_backward(bf16* dx /*(B,T,H,HD)*/, const bf16* dout /*(B,T,H,HD)*/, const float* cos /*(T,HD/2)*/,
                   const float* sin /*(T,HD/2)*/, int B, int T, int H, int HD, const std::int32_t* pos,
                   cudaStream_t stream);

// ---- causal self-attention, grouped-query heads (O(T^2) fp32 scores) ------------------------------------
// window: 0 causal, w >= 1 a sliding window (query t sees keys t - w < s <= t), as kernels/cpu's; pos:
// null, or (B,T) positions whose documents cut the band too (kernels/cpu's Note [Document masks]).
void attention_forward(bf16* out /*(B,T,NH,HD)*/, float* att /*(B,NH,T,T) saved*/,
                       const bf16* q /*(B,T,NH,HD)*/, const bf16* k /*(B,T,NKV,HD)*/,
                       const bf16* v /*(B,T,NKV,HD)*/, int B, int T, int NH, int NKV, int HD, int window,
                       const std::int32_t* pos, cudaStream_t stream);
// Writes dq, dk, dv; scratch is overwritten. out, the forward's output, is taken as kernels/cpu's
// attention_backward takes it and not read: the saved probabilities give rowsum(att * datt) directly.
void attention_backward(bf16* dq /*(B,T,NH,HD)*/, bf16* dk /*(B,T,NKV,HD)*/, bf16* dv /*(B,T,NKV,HD)*/,
                        float* scratch /*(B,NH,T,T)*/, const bf16* dout /*(B,T,NH,HD)*/,
                        const bf16* q /*(B,T,NH,HD)*/, const bf16* k /*(B,T,NKV,HD)*/,
                        const bf16* v /*(B,T,NKV,HD)*/, const bf16* out /*(B,T,NH,HD) unread*/,
                        const float* att /*(B,NH,T,T)*/, int B, int T, int NH, int NKV, int HD, int window,
                        const std::int32_t* pos, cudaStream_t stream);

// ---- SwiGLU, GeGLU and residual add ----------------------------------------------------------------------
void swiglu_forward(bf16* out /*(n)*/, const bf16* gate /*(n)*/, const bf16* up /*(n)*/, std::size_t n,
                    cudaStream_t stream);
// Writes dgate, dup.
void swiglu_backward(bf16* dgate /*(n)*/, bf16* dup /*(n)*/, const bf16* dout /*(n)*/,
                     const bf16* gate /*(n)*/, const bf16* up /*(n)*/, std::size_t n, cudaStream_t stream);
// out = gelu_tanh(gate) * up, PyTorch's gelu(approximate="tanh") (kernels/cpu's formula, in fp32).
void geglu_forward(bf16* out /*(n)*/, const bf16* gate /*(n)*/, const bf16* up /*(n)*/, std::size_t n,
                   cudaStream_t stream);
// Writes dgate, dup; may run in place (dgate == gate, dup == up).
void geglu_backward(bf16* dgate /*(n)*/, bf16* dup /*(n)*/, const bf16* dout /*(n)*/,
                    const bf16* gate /*(n)*/, const bf16* up /*(n)*/, std::size_t n, cudaStream_t stream);
// out may alias a or b.
void residual_forward(bf16* out /*(n)*/, const bf16* a /*(n)*/, const bf16* b /*(n)*/, std::size_t n,
                      cudaStream_t stream);
// da += dout; db += dout (either may be nullptr).
void residual_backward(bf16* da /*(n) +=*/, bf16* db /*(n) +=*/, const bf16* dout /*(n)*/, std::size_t n,
                       cudaStream_t stream);

// ---- dropout ------------------------------------------------------------------------------------------
// kernels/cpu's bf16 dropout bit for bit: the mask of (key, element index) and the factor 1 / (1 - p) of
// kernels/cpu/dropout_impl.h, one fp32 multiply rounded to nearest even (NaN aside). p in [0, 1); p = 0 is
// a copy; out may alias in.
void dropout(bf16* out /*(n)*/, const bf16* in /*(n)*/, std::size_t n, double p, std::uint64_t key,
             cudaStream_t stream);

// ---- cross-entropy fused with its logits gradient --------------------------------------------------------
// The CPU definition (targets < 0 ignored, mean over the others, dlogits = grad_scale (softmax - onehot) /
// n_valid). losses (fp32, per row, 0 if ignored) is required; mean_loss receives the mean, summed in a
// fixed order (deterministic). dlogits may be nullptr (forward only) or alias logits. As on the CPU, the
// valid targets are counted in integers and the mean is summed in double; *mean_loss also serves as the
// count's slot between the kernels, so it must not alias the other buffers.
// n_valid >= 0: the divisor given instead of the count (a chunk of a longer batch; kernels/cpu's).
void cross_entropy_forward_backward(bf16* dlogits /*(N,V) or nullptr*/, float* losses /*(N)*/,
                                    float* mean_loss /*(1)*/, const bf16* logits /*(N,V)*/,
                                    const std::int32_t* targets /*(N)*/, int N, int V, float grad_scale,
                                    cudaStream_t stream, int n_valid = -1);

// ---- runtime helpers ------------------------------------------------------------------------------------
// The CPU's conversions bit for bit (round to nearest even; NaN stays NaN with its sign).
void cast_f32_to_bf16(bf16* out /*(n)*/, const float* in /*(n)*/, std::size_t n, cudaStream_t stream);
void cast_bf16_to_f32(float* out /*(n)*/, const bf16* in /*(n)*/, std::size_t n, cudaStream_t stream);
void cast_f32_to_f16(fp16* out /*(n)*/, const float* in /*(n)*/, std::size_t n, cudaStream_t stream);
void cast_f16_to_f32(float* out /*(n)*/, const fp16* in /*(n)*/, std::size_t n, cudaStream_t stream);
// fp16 <-> bf16 through fp32: widened exactly, rounded once (the CPU's cast_f16_to_bf16 / cast_bf16_to_f16).
void cast_f16_to_bf16(bf16* out /*(n)*/, const fp16* in /*(n)*/, std::size_t n, cudaStream_t stream);
void cast_bf16_to_f16(fp16* out /*(n)*/, const bf16* in /*(n)*/, std::size_t n, cudaStream_t stream);
// x[i] = value (fp32).
void fill_f32(float* x /*(n)*/, float value, std::size_t n, cudaStream_t stream);
// dst[i] += src[i] (fp32, one rounded add per element: the CPU's result bit for bit).
void add_f32(float* dst /*(n)*/, const float* src /*(n)*/, std::size_t n, cudaStream_t stream);
// x *= s (fp32).
void scale(float* x /*(n)*/, float s, std::size_t n, cudaStream_t stream);
// x = bf16(float(x) * s), rounded to nearest even (core/dtype.h's f32_to_bf16 bit for bit, NaN aside).
void scale(bf16* x /*(n)*/, float s, std::size_t n, cudaStream_t stream);
// *found = 1 if any x is NaN or +-inf, else 0 (written, not accumulated).
void nonfinite_check(int* found /*(1)*/, const float* x /*(n)*/, std::size_t n, cudaStream_t stream);
// *out = sum x^2 in double: fixed blocks of 4096 elements, each reduced in a fixed tree into `scratch`,
// then the block sums in a fixed tree. Deterministic run to run; equal to the CPU's value to double
// rounding, not bit for bit (the order differs).
std::size_t squared_norm_scratch_bytes(std::size_t n);
void squared_norm(double* out /*(1)*/, const float* x /*(n)*/, std::size_t n, void* scratch,
                  std::size_t scratch_bytes, cudaStream_t stream);
// The CPU AdamW (kernels/cpu/ops.h), same fp32 operations with no FMA contraction: bit-identical to it.
void adamw_update(float* p /*(n)*/, const float* g /*(n)*/, float* m /*(n)*/, float* v /*(n)*/,
                  bf16* p_bf16 /*(n) or nullptr*/, std::size_t n, const AdamWParams& hp, std::int64_t step,
                  float grad_scale, cudaStream_t stream);

}  // namespace strata::kernels::cuda
