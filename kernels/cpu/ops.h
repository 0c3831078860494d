// strata/kernels/cpu/ops.h: every compute op of the Llama-style decoder on the CPU, fp32, and its variant
// on bf16 activations (section "bf16 activations"). These are the host backend's compute; the fp32 ones
// are the oracle every CUDA kernel (kernels/cuda/ops.h) and every bf16 variant is tested against.
//
// Example (one decoder block, forward then backward; B batch, T sequence, C model width, NH query heads,
// NKV key/value heads, HD = C / NH head width, F feed-forward width; N = B * T rows):
//   using namespace strata::kernels::cpu;
//   set_blas_threads(2);                                       // match the runtime's thread count
//   rope_cache(cos, sin, T, HD, 10000.0f);                     // once per (T, HD, theta)
//   rmsnorm_forward(xn, rstd, x, w_norm, N, C, 1e-5f);
//   linear_forward(q, xn, wq, N, C, NH * HD);                  // likewise k, v with NKV * HD outputs
//   rope_forward(q, q, cos, sin, B, T, NH, HD);                // in place is allowed
//   rope_forward(k, k, cos, sin, B, T, NKV, HD);
//   attention_forward(y, att, q, k, v, B, T, NH, NKV, HD);
//   linear_forward(o, y, wo, N, NH * HD, C);
//   residual_forward(x2, x, o, size_t(N) * C);
//   ...
//   // backward: parameter gradients are ALWAYS accumulated (+=); zero them once per step. Whether an
//   // input gradient is written (=) or accumulated (+=) is stated per function below.
//   float loss = cross_entropy_forward_backward(dlogits, nullptr, logits, targets, N, V, 1.0f);
//   linear_backward(dy, dwo, dout_o, y, wo, N, NH * HD, C);     // dy += ..., dwo += ...
//   attention_backward(dq, dk, dv, scratch, dy, q, k, v, y, att, B, T, NH, NKV, HD);  // dq, dk, dv =
//   rope_backward(dq, dq, cos, sin, B, T, NH, HD);
//
// Layouts are row-major and match Hugging Face's LlamaForCausalLM, so its weights load unchanged:
//   linear weights are (out_features, in_features) as in nn.Linear (y = x W^T); q is (B, T, NH, HD) as
//   q_proj's output before HF's view/transpose; k, v are (B, T, NKV, HD); query head h reads key/value
//   head h / (NH / NKV) (HF's repeat_kv); rotary embedding uses HF's rotate_half convention (the two
//   halves of each head, not interleaved pairs).
// All pointers are fp32 unless marked bf16_t / fp16_t (raw 16-bit patterns) or int32_t (token ids).
// Buffers must not overlap unless a function says it may alias.
//
// Threads: loops run on oneTBB, matrix products on OpenBLAS (its own pool, sized by set_blas_threads).
// Every op is deterministic: the same inputs give bit-identical outputs whatever the oneTBB thread count
// (work is split into fixed blocks, and each output element is reduced in a fixed order). The ops built
// on matrix products (linear_*, attention_*) are bit-identical for a fixed OpenBLAS thread count only:
// OpenBLAS's blocking changes with its thread count, so across counts they agree to fp32 rounding (Note
// [OpenBLAS determinism] in linear.cpp). Keep set_blas_threads() fixed for a run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace strata::kernels::cpu {

using bf16_t = std::uint16_t;  // bfloat16 bit pattern (1 sign, 8 exponent, 7 mantissa bits)
using fp16_t = std::uint16_t;  // IEEE binary16 bit pattern (1 sign, 5 exponent, 10 mantissa bits)

// ---- threads ------------------------------------------------------------------------------------------

// Sets OpenBLAS's thread count (openblas_set_num_threads) to the runtime's thread count; n >= 1.
void set_blas_threads(int n);
// OpenBLAS's current thread count.
int blas_threads();

// ---- embedding ---------------------------------------------------------------------------------------

// out[i, :] = wte[tokens[i], :]. Throws strata::Error if a token is outside [0, V).
void embedding_forward(float* out /*(N,C)*/, const std::int32_t* tokens /*(N)*/, const float* wte /*(V,C)*/,
                       int N, int C, int V);
// dwte[tokens[i], :] += dout[i, :]   (accumulates; each row sums its positions in order: deterministic).
void embedding_backward(float* dwte /*(V,C) +=*/, const float* dout /*(N,C)*/,
                        const std::int32_t* tokens /*(N)*/, int N, int C, int V);

// ---- RMSNorm: out = x * rstd * (w + w_offset), rstd = 1 / sqrt(mean(x^2) + eps) ----------------------
// w_offset is 0 for Llama's norm and 1 for Gemma's, whose checkpoints store w - 1 (HF GemmaRMSNorm).

// rstd is saved for the backward pass.
void rmsnorm_forward(float* out /*(N,C)*/, float* rstd /*(N)*/, const float* x /*(N,C)*/,
                     const float* w /*(C)*/, int N, int C, float eps, float w_offset = 0.0f);
// dx += d(out)/dx^T dout  (ACCUMULATES into dx: it is the residual stream's gradient);
// dw += sum over rows of dout * x * rstd  (accumulates).
void rmsnorm_backward(float* dx /*(N,C) +=*/, float* dw /*(C) +=*/, const float* dout /*(N,C)*/,
                      const float* x /*(N,C)*/, const float* w /*(C)*/, const float* rstd /*(N)*/, int N,
                      int C, float w_offset = 0.0f);

// ---- a projection's bias (nn.Linear with bias) --------------------------------------------------------

// out[i, :] += b.
void bias_forward(float* out /*(N,OC)*/, const float* b /*(OC)*/, int N, int OC);
// db += sum over rows of dout (rows summed in order: deterministic).
void bias_backward(float* db /*(OC) +=*/, const float* dout /*(N,OC)*/, int N, int OC);

// ---- linear (no bias, as in Llama): out = x W^T, through OpenBLAS cblas_sgemm --------------------------
// Also the LM head: logits = linear_forward(x, W_head) with W_head (V, C); a tied head passes the
// embedding table wte as W and its gradient dwte as dW, so both uses accumulate into one buffer.

void linear_forward(float* out /*(N,OC)*/, const float* x /*(N,IC)*/, const float* w /*(OC,IC)*/, int N,
                    int IC, int OC);
// dx += dout W   (ACCUMULATES; pass dx = nullptr to skip it);  dw += dout^T x   (accumulates).
void linear_backward(float* dx /*(N,IC) += or nullptr*/, float* dw /*(OC,IC) +=*/,
                     const float* dout /*(N,OC)*/, const float* x /*(N,IC)*/, const float* w /*(OC,IC)*/,
                     int N, int IC, int OC);

// The same products on bf16 activations and weights, as the cuda path runs them (the host backend's ops
// with bf16 activations; Note [bf16 matrix products on the CPU] in linear_bf16.cpp): fp32 accumulation,
// out and dx rounded to bf16 once (dx = bf16(dx + dout W), as a product with beta 1 into a bf16 matrix), dw
// accumulated in fp32. The fp32 functions above stay the oracle.
void linear_forward(bf16_t* out /*(N,OC)*/, const bf16_t* x /*(N,IC)*/, const bf16_t* w /*(OC,IC)*/, int N,
                    int IC, int OC);
void linear_backward(bf16_t* dx /*(N,IC) += or null*/, float* dw /*(OC,IC) fp32 +=*/,
                     const bf16_t* dout /*(N,OC)*/, const bf16_t* x /*(N,IC)*/, const bf16_t* w /*(OC,IC)*/,
                     int N, int IC, int OC);
// The oneDNN implementation the bf16 products get on this CPU ("oneDNN brg:avx512_core_amx_bf16": AMX
// tiles; "...avx512_core_bf16": AVX-512 BF16 dot products), or "" when they go through the OpenBLAS
// fallback (no oneDNN in the build, or only its reference implementation here).
std::string bf16_matmul_impl();

// ---- rotary position embedding (HF rotate_half convention) -------------------------------------------
// For head width HD (even), i in [0, HD/2), position t in [0, T):
//   inv_freq_i = fp32(theta^(-2i/HD)), angle = fp32(t * inv_freq_i)   (Hugging Face's fp32 rounding)
//   cos, sin = cos(angle), sin(angle) evaluated in double, stored as fp32
//   out[i]        = x[i] * cos - x[i + HD/2] * sin
//   out[i + HD/2] = x[i + HD/2] * cos + x[i] * sin
// The position of row (b, t) is t (sequences start at position 0), or with `pos` ((B,T) i32, each in
// [0, T): transformers' position_ids) pos[b, t]: the rows of the tables at pos (Note [Document masks]).

void rope_cache(float* cos /*(T,HD/2)*/, float* sin /*(T,HD/2)*/, int T, int HD, float theta);
// The same tables from given inverse frequencies (HD/2 of them, e.g. a scaled rotary embedding's:
// model/rope.h): angle = fp32(t * inv_freq[i]).
void rope_cache(float* cos /*(T,HD/2)*/, float* sin /*(T,HD/2)*/, int T, int HD,
                const float* inv_freq /*(HD/2)*/);
// The unscaled inverse frequencies fp32(theta^(-2i/HD)), i in [0, HD/2).
void rope_inv_freq(float* inv_freq /*(HD/2)*/, int HD, float theta);
// x is q (NH heads) or k (NKV heads): pass the head count as H. out may alias x.
void rope_forward(float* out /*(B,T,H,HD)*/, const float* x /*(B,T,H,HD)*/, const float* cos /*(T,HD/2)*/,
                  const float* sin /*(T,HD/2)*/, int B, int T, int H, int HD,
                  const std::int32_t* pos /*(B,T) or null*/ = nullptr);
// dx = R^T dout  (WRITES dx; the inverse rotation). dx may alias dout.
void rope_backward(float* dx /*(B,T,H,HD)*/, const float* dout /*(B,T,H,HD)*/, const float* cos /*(T,HD/2)*/,
                   const float* sin /*(T,HD/2)*/, int B, int T, int H, int HD,
                   const std::int32_t* pos /*(B,T) or null*/ = nullptr);

// ---- causal self-attention with grouped-query heads ----------------------------------------------------
// att[b,h,t,s] = softmax over s in band(t) of (q[b,t,h,:] . k[b,s,g,:] / sqrt(HD)), g = h / (NH / NKV); zero
// for s outside band(t). out[b,t,h,:] = sum_s att[b,h,t,s] v[b,s,g,:]. NH must be a multiple of NKV. O(T^2)
// memory for att.
// band(t): the keys query t attends to. window 0: every s <= t (causal). window w >= 1 (a sliding window,
// transformers' sliding_window_causal_mask_function): t - w < s <= t, the w latest positions, itself
// included; w = 1 sees only itself, w >= T is causal. With `pos` ((B,T) i32, per-token positions) the band
// is also cut at the start of t's document: s >= t - pos[b, t] (Note [Document masks]).
//
// Note [Document masks]: packed rows hold several documents back to back, and a document must not see
// the one before it. The caller says where each starts by per-token positions, transformers' position_ids
// of padding-free packing (DataCollatorWithFlattening): 0 at a document's first token, then 1, 2, ... So
// that one mask serves windows and documents alike, query t of row b sees key s iff
//   s <= t,  t - s < window (with a window),  s >= t - pos[b, t]   (t's document began pos[b, t] back),
// and the rotary embedding rotates row (b, t) by position pos[b, t]. That is transformers' mask exactly when
// every pos[b, t] is 0 or pos[b, t-1] + 1 (its find_packed_sequence_indices starts a sequence wherever
// position_ids do not go up by one; positions that do not restart at 0 are not packed documents, and the
// model refuses them before they get here). A position above t reads as t (the row's first key). Every
// query sees itself, so no row of the softmax is empty. The kernels skip what lies outside the band: the
// fused CPU attention and cuda's own kernel whole key blocks and keys, the unfused CPU one only in its
// row passes (its products cover the square).

void attention_forward(float* out /*(B,T,NH,HD)*/, float* att /*(B,NH,T,T) saved for backward*/,
                       const float* q /*(B,T,NH,HD)*/, const float* k /*(B,T,NKV,HD)*/,
                       const float* v /*(B,T,NKV,HD)*/, int B, int T, int NH, int NKV, int HD, int window = 0,
                       const std::int32_t* pos /*(B,T) or null*/ = nullptr);
// WRITES dq, dk, dv (=). scratch is overwritten (it holds the score gradients); it may not alias att. out is
// the forward's output, taken as every attention backward takes it (kernels/ops.h) and not read here: the
// saved probabilities give rowsum(att * datt) directly.
void attention_backward(float* dq /*(B,T,NH,HD)*/, float* dk /*(B,T,NKV,HD)*/, float* dv /*(B,T,NKV,HD)*/,
                        float* scratch /*(B,NH,T,T)*/, const float* dout /*(B,T,NH,HD)*/,
                        const float* q /*(B,T,NH,HD)*/, const float* k /*(B,T,NKV,HD)*/,
                        const float* v /*(B,T,NKV,HD)*/, const float* out /*(B,T,NH,HD) unread*/,
                        const float* att /*(B,NH,T,T)*/, int B, int T, int NH, int NKV, int HD,
                        int window = 0, const std::int32_t* pos /*(B,T) or null*/ = nullptr);
// On bf16 activations the host backend runs the fused attention instead (attention_fused.h).

// ---- SwiGLU: out = silu(gate) * up, silu(z) = z / (1 + exp(-z)) ------------------------------------

void swiglu_forward(float* out /*(n)*/, const float* gate /*(n)*/, const float* up /*(n)*/, std::size_t n);
// WRITES dgate and dup (=).
void swiglu_backward(float* dgate /*(n)*/, float* dup /*(n)*/, const float* dout /*(n)*/,
                     const float* gate /*(n)*/, const float* up /*(n)*/, std::size_t n);

// ---- GeGLU: out = gelu_tanh(gate) * up (Gemma's MLP) ----------------------------------------------------
// gelu_tanh(z) = 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3))), PyTorch's gelu(approximate="tanh").

void geglu_forward(float* out /*(n)*/, const float* gate /*(n)*/, const float* up /*(n)*/, std::size_t n);
// WRITES dgate and dup (=); may run in place.
void geglu_backward(float* dgate /*(n)*/, float* dup /*(n)*/, const float* dout /*(n)*/,
                    const float* gate /*(n)*/, const float* up /*(n)*/, std::size_t n);

// ---- residual add: out = a + b ------------------------------------------------------------------------

// out may alias a or b.
void residual_forward(float* out /*(n)*/, const float* a /*(n)*/, const float* b /*(n)*/, std::size_t n);
// da += dout; db += dout  (ACCUMULATES both; either may be nullptr to skip it).
void residual_backward(float* da /*(n) +=*/, float* db /*(n) +=*/, const float* dout /*(n)*/, std::size_t n);

// ---- dropout: nn.Dropout in training mode, its mask drawn from a key (dropout.cpp) ----------------------
// out[i] = in[i] * m_i, with m_i = 1 / (1 - p) where element i is kept and 0 where it is dropped (PyTorch's
// input * mask: a dropped element is +-0, or NaN for a non-finite input). Element i is kept when the top
// 32 bits of splitmix64(key ^ splitmix64(i)) are at least floor(p * 2^32), so P(keep) = 1 - p to within
// 2^-32, and the mask is a pure function of (key, i): the same key gives the same mask on every backend,
// thread count and call (a backward recomputes its forward's), another key an independent one. Rounding:
// 1 / (1 - p) is fp32(1) / fp32(1 - p) with 1 - p taken in double (PyTorch's kernels' factor), the product
// in[i] * m_i is one fp32 multiply (rounded once to bf16 in the bf16 variant). p in [0, 1); p = 0 is a
// copy (the identity bit for bit). out may alias in.
void dropout(float* out /*(n)*/, const float* in /*(n)*/, std::size_t n, double p, std::uint64_t key);
// A key of its own for each use of one key (a layer, a site): splitmix64(key ^ splitmix64(value)).
std::uint64_t dropout_key(std::uint64_t key, std::uint64_t value);

// ---- cross-entropy fused with its logits gradient ------------------------------------------------------
// Over the rows whose target is >= 0 (a target < 0, e.g. -1, is ignored: no loss, zero gradient), with
// n_valid such rows:  loss = (1/n_valid) sum_i -log softmax(logits[i])[targets[i]].
// If dlogits is not null it is WRITTEN: dlogits[i] = grad_scale * (softmax(logits[i]) - onehot) / n_valid
// (zero rows for ignored targets); dlogits may alias logits to save the (N,V) buffer. grad_scale carries
// a loss scale or 1/gradient_accumulation_steps. losses, if not null, gets each row's loss (0 if ignored).
// Returns the mean loss (0 when n_valid is 0), summed in row order in double: deterministic.
// Throws strata::Error if a target is >= V.
// `n_valid` >= 0 gives the divisor instead of counting these rows: a chunk of a longer batch (the loss
// over row chunks, Note [The loss in row chunks] in model/llama.cpp), each row's loss and gradient then
// those of the whole batch's call bit for bit; the result is this chunk's share of the mean, its sum /
// n_valid.
float cross_entropy_forward_backward(float* dlogits /*(N,V) or nullptr*/, float* losses /*(N) or nullptr*/,
                                     const float* logits /*(N,V)*/, const std::int32_t* targets /*(N)*/,
                                     int N, int V, float grad_scale, int n_valid = -1);

// ---- bf16 activations (bf16_ops.cpp; the embedding's in embedding.cpp, bias_backward in elementwise.cpp,
// dropout in dropout.cpp)
// The ops above on bf16 activations, weights (the embedding table, norm weights, biases) and activation
// gradients, as the cuda path stores them: the host backend's ops with bf16 activations run these (with
// linear_forward / linear_backward on bf16_t above, and the fused attention of attention_fused.h). Same
// arguments and contracts (aliasing included) as the fp32 function of the same name; parameter gradients,
// rstd, losses and the rope tables stay fp32. Rounding points: each computes exactly what the fp32 function
// computes from its bf16 inputs widened to fp32 (exact), and rounds each bf16 output once (f32_to_bf16); an
// accumulated bf16 output (dx +=, da +=) is widened, added to in fp32 and rounded once. fp32 outputs (rstd,
// dw, db, dwte, losses, the mean) are the fp32 function's bits. So each equals "widen, call the fp32
// function, round", bit for bit, and is as deterministic whatever the oneTBB thread count. They run over
// fixed blocks of rows or elements, each widened into a small per-thread fp32 buffer: no fp32 copy of a whole
// tensor is made.

// A copy of the rows (a bf16 value widened and rounded again is itself).
void embedding_forward(bf16_t* out /*(N,C)*/, const std::int32_t* tokens /*(N)*/, const bf16_t* wte /*(V,C)*/,
                       int N, int C, int V);
void embedding_backward(float* dwte /*(V,C) fp32 +=*/, const bf16_t* dout /*(N,C)*/,
                        const std::int32_t* tokens /*(N)*/, int N, int C, int V);
void rmsnorm_forward(bf16_t* out /*(N,C)*/, float* rstd /*(N) fp32*/, const bf16_t* x /*(N,C)*/,
                     const bf16_t* w /*(C)*/, int N, int C, float eps, float w_offset = 0.0f);
void rmsnorm_backward(bf16_t* dx /*(N,C) +=*/, float* dw /*(C) fp32 +=*/, const bf16_t* dout /*(N,C)*/,
                      const bf16_t* x /*(N,C)*/, const bf16_t* w /*(C)*/, const float* rstd /*(N) fp32*/,
                      int N, int C, float w_offset = 0.0f);
void bias_forward(bf16_t* out /*(N,OC) +=*/, const bf16_t* b /*(OC)*/, int N, int OC);
void bias_backward(float* db /*(OC) fp32 +=*/, const bf16_t* dout /*(N,OC)*/, int N, int OC);
void rope_forward(bf16_t* out /*(B,T,H,HD)*/, const bf16_t* x /*(B,T,H,HD)*/, const float* cos /*(T,HD/2)*/,
                  const float* sin /*(T,HD/2)*/, int B, int T, int H, int HD,
                  const std::int32_t* pos /*(B,T) or null*/ = nullptr);
void rope_backward(bf16_t* dx /*(B,T,H,HD)*/, const bf16_t* dout /*(B,T,H,HD)*/, const float* cos,
                   const float* sin, int B, int T, int H, int HD, const std::int32_t* pos = nullptr);
void swiglu_forward(bf16_t* out /*(n)*/, const bf16_t* gate /*(n)*/, const bf16_t* up /*(n)*/, std::size_t n);
void swiglu_backward(bf16_t* dgate /*(n)*/, bf16_t* dup /*(n)*/, const bf16_t* dout /*(n)*/,
                     const bf16_t* gate /*(n)*/, const bf16_t* up /*(n)*/, std::size_t n);
void geglu_forward(bf16_t* out /*(n)*/, const bf16_t* gate /*(n)*/, const bf16_t* up /*(n)*/, std::size_t n);
void geglu_backward(bf16_t* dgate /*(n)*/, bf16_t* dup /*(n)*/, const bf16_t* dout /*(n)*/,
                    const bf16_t* gate /*(n)*/, const bf16_t* up /*(n)*/, std::size_t n);
void residual_forward(bf16_t* out /*(n)*/, const bf16_t* a /*(n)*/, const bf16_t* b /*(n)*/, std::size_t n);
void residual_backward(bf16_t* da /*(n) += or null*/, bf16_t* db /*(n) += or null*/,
                       const bf16_t* dout /*(n)*/, std::size_t n);
// dlogits (bf16, may alias logits) rounded once from the fp32 gradient; losses and the mean fp32.
float cross_entropy_forward_backward(bf16_t* dlogits /*(N,V) or nullptr*/, float* losses /*(N) or nullptr*/,
                                     const bf16_t* logits /*(N,V)*/, const std::int32_t* targets /*(N)*/,
                                     int N, int V, float grad_scale, int n_valid = -1);
// x = bf16(x * s).
void scale(bf16_t* x /*(n)*/, float s, std::size_t n);
// The fp32 dropout's mask and factor, the product rounded once to bf16 (dropout.cpp).
void dropout(bf16_t* out /*(n)*/, const bf16_t* in /*(n)*/, std::size_t n, double p, std::uint64_t key);

// ---- runtime helpers ------------------------------------------------------------------------------------

// fp32 -> 16-bit: round to nearest, ties to even; overflow gives +-inf; NaN stays NaN (sign kept, quiet
// bit set); fp16 subnormals are produced exactly. 16-bit -> fp32 is exact.
void cast_f32_to_bf16(bf16_t* out /*(n)*/, const float* in /*(n)*/, std::size_t n);
void cast_bf16_to_f32(float* out /*(n)*/, const bf16_t* in /*(n)*/, std::size_t n);
void cast_f32_to_f16(fp16_t* out /*(n)*/, const float* in /*(n)*/, std::size_t n);
void cast_f16_to_f32(float* out /*(n)*/, const fp16_t* in /*(n)*/, std::size_t n);
// 16-bit -> the other 16-bit format: widened to fp32 (exact), then rounded as above. fp16 -> bf16 loses
// mantissa bits and keeps the range; bf16 -> fp16 may overflow to +-inf or round to a subnormal or zero.
void cast_f16_to_bf16(bf16_t* out /*(n)*/, const fp16_t* in /*(n)*/, std::size_t n);
void cast_bf16_to_f16(fp16_t* out /*(n)*/, const bf16_t* in /*(n)*/, std::size_t n);
// Single-value forms of the same conversions (the oracle for the bulk forms and the CUDA kernels): the
// one implementation, core/dtype.h's.
using strata::bf16_to_f32;
using strata::f16_to_f32;
using strata::f32_to_bf16;
using strata::f32_to_f16;

// x *= s.
void scale(float* x /*(n)*/, float s, std::size_t n);
// True if any element is NaN or +-inf.
bool has_nonfinite(const float* x /*(n)*/, std::size_t n);
// sum of x[i]^2, accumulated in double over fixed blocks of 4096 elements whose partial sums are added
// in block order: bit-identical whatever the thread count.
double squared_norm(const float* x /*(n)*/, std::size_t n);

// ---- AdamW (the arithmetic of DeepSpeed's CPU Adam; cpu_optim/ uses the same, bit for bit) ------------
// step is 1-based (the count including this update). With b1 = beta1, b2 = beta2, every element in fp32,
// in this order, with only correctly rounded operations (no FMA contraction):
//   g = grad * grad_scale
//   if (!adamw_mode && weight_decay != 0) g = p * weight_decay + g          (L2, classic Adam)
//   m = b1 * m + (1 - b1) * g
//   v = b2 * v + (1 - b2) * (g * g)
//   u = m / (sqrt(v) * bc2 + eps)            bc2 = 1 / sqrt(1 - b2^step), so the denominator is sqrt(v_hat) +
//   eps if (adamw_mode && weight_decay != 0) p = p + w_decay * p                w_decay = -lr * weight_decay
//   p = p + step_size * u                    step_size = -lr / bc1,  bc1 = 1 - b1^step
// i.e. p -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p) in AdamW mode. bc1 = bc2 = 1 without
// bias correction; bc2, step_size and w_decay are computed once per call in double and rounded to fp32;
// (1 - b1) and (1 - b2) are computed in fp32.
struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool adamw_mode = true;  // decoupled weight decay (AdamW); false: L2 added to the gradient (Adam)
  bool bias_correction = true;
};
// Updates p, m, v in place from g * grad_scale (grad_scale folds loss-scale unscaling and clipping). If
// p_bf16 is not null it receives the new p rounded to bf16 (the working copy of the parameters).
void adamw_update(float* p /*(n)*/, const float* g /*(n)*/, float* m /*(n)*/, float* v /*(n)*/,
                  bf16_t* p_bf16 /*(n) or nullptr*/, std::size_t n, const AdamWParams& hp, std::int64_t step,
                  float grad_scale = 1.0f);

}  // namespace strata::kernels::cpu
