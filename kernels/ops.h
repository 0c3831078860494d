// strata/kernels/ops.h: the compute interface — every op the model and the engine run on the device,
// over dtype-tagged device buffers, in the order of one Stream, with a capability struct saying what an
// implementation computes in. Two implementations: kernels/cpu (the host backend: fp32, the oracle, or
// with OpsOptions.matmul = bf16 bf16 activations as on cuda) and kernels/cuda (bf16 storage, fp32
// accumulation, cuBLASLt). make_ops() is the one place that chooses between them, by the device's
// backend; nothing else tests for cuda.
//
// Example (one RMSNorm + linear, forward and backward, and the loss back on the host):
//   std::unique_ptr<strata::kernels::Ops> ops = strata::kernels::make_ops(dev, compute_stream);
//   const strata::DType A = ops->caps().activation;       // fp32 (cpu) or bf16 (cuda; cpu with bf16)
//   strata::DeviceBuffer xb(dev, N * C * dtype_bytes(A)), ...;
//   Tensor x{xb.data(), A, N * C}, xn{...}, rstd{..., DType::fp32, N}, w{...}, out{...};
//   ops->rmsnorm_forward(xn, rstd, x, w_norm, N, C, 1e-5f);
//   ops->linear_forward(out, xn, w, N, C, OC);
//   ops->cross_entropy(dlogits, losses, mean_loss, logits, targets, N, V, 1.0f);
//   float loss = ops->read_f32(mean_loss);                  // waits for the stream: the only host sync
//   ops->linear_backward(dxn, dw, dout, xn, w, N, C, OC);   // dw: fp32 parameter gradient, +=
//
// Semantics: each op computes what the kernels/cpu function of the same name computes (its comments are
// the specification: shapes, which outputs are written (=) and which accumulated (+=), aliasing), with
// these dtypes:
//   - activations, weights and activation gradients: caps().activation;
//   - parameter gradients: fp32, always accumulated; saved statistics (rstd, attention state), losses,
//     cos/sin tables: fp32; token ids and targets: i32;
//   - every buffer is device memory of the Stream's device (on the host backend that is host memory).
// Ordering: ops run in the order of `stream()`: after the work already enqueued on it, before any enqueued
// later, and the call returns at once (cuda: a kernel launch; CPU: a host function on the stream's worker
// thread, Note [CPU ops on the stream] in kernels/cpu/ops.cpp). Buffers must stay allocated, and inputs
// unchanged, until the stream has run the op: free them after an event recorded on the stream, or after
// synchronizing it. Callers write one stream-ordered program for both backends. A `cast` input may also
// be pinned host memory from the same Device (device-accessible on both backends).
// Note [Ops device memory]: an implementation may take device memory of its own besides the callers'
// buffers — the matrix products' library workspace (cuda: cuBLASLt's, taken at construction) and one
// scratch buffer for the ops that need temporary room (cuda: embedding and norm backward, squared_norm,
// cuDNN's forward workspace), grown to the largest request. Both come from the Device, so its count is
// complete, and both are planned: a caller that budgets the device asks scratch_bytes() for the shapes it
// will run, reserve_scratch()s that much before it plans, and counts device_bytes(). One workspace per
// stream is all the products need; the engine's copy streams take runtime-role objects, which hold none.
// Errors: a wrong dtype or a buffer smaller than the shape needs is a programming error (STRATA_CHECK);
// a device failure raises BackendError. Tokens outside [0, V) raise strata::Error on the CPU and give NaN
// rows on cuda (kernels/cuda/ops.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "kernels/cpu/ops.h"

namespace strata::kernels {

// A span of device memory and what it holds.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::fp32;
  std::size_t numel = 0;

  std::size_t bytes() const { return numel * dtype_bytes(dtype); }
  explicit operator bool() const { return data != nullptr; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  // Elements [offset, offset + n) of this tensor.
  Tensor slice(std::size_t offset, std::size_t n) const {
    return {static_cast<char*>(data) + offset * dtype_bytes(dtype), dtype, n};
  }
};

struct OpsCaps {
  BackendKind backend = BackendKind::host;
  std::string name;                // "cpu: fp32, OpenBLAS ...", "cpu: bf16 activations, ...", "cuda: ..."
  DType activation = DType::fp32;  // activations, weights, activation gradients
  bool fused_attention = false;    // attention without a (B, NH, T, T) probability matrix
  bool bit_reproducible = true;    // same inputs and thread count: the same bits, run to run
};

// What an Ops object is for (OpsOptions.role). model: every op. runtime: the runtime helpers only (cast,
// fill, zero, add, scale, squared_norm, nonfinite_check, adamw) — what the engine's gather and gradient
// streams run. A runtime Ops holds no matrix-product workspace and no attention library handle (on cuda
// those are the 32 MiB of cuBLASLt workspace and a cuDNN handle per object); asking it for a model op is
// a programming error.
enum class OpsRole { model, runtime };

// The largest shapes a caller will run, for Ops::scratch_bytes: the rows, width and vocabulary of the
// embedding, norm and cross-entropy ops, the attention shape, and the longest squared_norm input.
struct OpShapes {
  int N = 0, C = 0, V = 0;
  int B = 0, T = 0, NH = 0, NKV = 0, HD = 0;
  std::size_t reduce_numel = 0;
  // The model normalises q and k per head (Qwen3's q_norm, k_norm): RMSNorm over N * NH rows of HD.
  bool head_norm = false;
  // The sliding window of the model's windowed layers (0: none): the scratch covers attention with it and
  // without it (a model may have both kinds of layers).
  int window = 0;
};

// Sizes of the attention buffers an implementation needs (elements, fp32).
struct AttentionSizes {
  std::size_t saved = 0;    // kept from forward to backward (CPU: the (B,NH,T,T) probabilities)
  std::size_t scratch = 0;  // backward's scratch
};

// NF4 blocks as kernels/cpu/nf4.h stores them (bitsandbytes' quantize_4bit): n values' 4-bit codes and
// their blocks' absmax, fp32 or double-quantised. The pointers are device memory or pinned host memory (a
// gather reads its source where it lives; on cuda a kernel reads pinned memory over the link).
struct Nf4Blocks {
  const void* codes = nullptr;    // (nf4_code_bytes(n)) u8: two a byte, the first value in the high nibble
  const void* absmax = nullptr;   // (nf4_blocks(n, blocksize)) fp32, or with double_quant u8 codes
  const void* absmax2 = nullptr;  // double_quant: (ceil(nblocks / kNf4AbsmaxBlocksize)) fp32
  float offset = 0;               // double_quant: added to every dequantised absmax
  bool double_quant = false;
  std::size_t blocksize = 64;
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual const OpsCaps& caps() const = 0;
  Stream& stream() { return stream_; }

  // ---- embedding ----
  void embedding_forward(Tensor out /*(N,C)*/, Tensor tokens /*(N) i32*/, Tensor wte /*(V,C)*/, int N, int C,
                         int V);
  void embedding_backward(Tensor dwte /*(V,C) fp32 +=*/, Tensor dout /*(N,C)*/, Tensor tokens, int N, int C,
                          int V);
  // ---- RMSNorm ----
  // out = x * rstd * (w + w_offset): w_offset 0 is Llama's norm, 1 Gemma's (whose checkpoints store w - 1).
  // dw is the gradient of the stored w (the same for either offset).
  void rmsnorm_forward(Tensor out /*(N,C)*/, Tensor rstd /*(N) fp32*/, Tensor x /*(N,C)*/, Tensor w /*(C)*/,
                       int N, int C, float eps, float w_offset = 0.0f);
  // An empty dw skips the weight's gradient (a frozen weight).
  void rmsnorm_backward(Tensor dx /*(N,C) +=*/, Tensor dw /*(C) fp32 +=*/, Tensor dout, Tensor x, Tensor w,
                        Tensor rstd, int N, int C, float w_offset = 0.0f);
  // ---- linear (no bias): out = x W^T ----
  void linear_forward(Tensor out /*(N,OC)*/, Tensor x /*(N,IC)*/, Tensor w /*(OC,IC)*/, int N, int IC,
                      int OC);
  // dx += dout W (an empty dx skips it); dw += dout^T x (fp32; an empty dw skips it: a frozen weight).
  void linear_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, int N, int IC, int OC);
  // ---- a projection's bias ----
  // out[i, :] += b for every row i (after linear_forward: nn.Linear with bias).
  void bias_forward(Tensor out /*(N,OC)*/, Tensor b /*(OC)*/, int N, int OC);
  // db += the column sums of dout, rows summed in order (deterministic).
  void bias_backward(Tensor db /*(OC) fp32 +=*/, Tensor dout /*(N,OC)*/, int N, int OC);
  // ---- rotary embedding ----
  // The (T, HD/2) cos and sin tables for inverse frequencies `inv_freq` (HD/2, host memory, copied before
  // the call returns); the theta form uses the unscaled fp32(theta^(-2i/HD)).
  void rope_cache(Tensor cos /*(T,HD/2) fp32*/, Tensor sin, int T, int HD, std::span<const float> inv_freq);
  void rope_cache(Tensor cos, Tensor sin, int T, int HD, float theta);
  // `positions` ((B,T) i32, each in [0, T), or empty): row (b, t) takes the tables' row positions[b, t]
  // instead of t — transformers' position_ids, restarting at every packed document (Note [Document masks]
  // in kernels/cpu/ops.h).
  void rope_forward(Tensor out, Tensor x /*(B,T,H,HD)*/, Tensor cos, Tensor sin, int B, int T, int H, int HD,
                    Tensor positions = {});
  void rope_backward(Tensor dx, Tensor dout, Tensor cos, Tensor sin, int B, int T, int H, int HD,
                     Tensor positions = {});
  // ---- causal attention, grouped-query heads, optionally in a sliding window ----
  // `window`: 0 (the default) plain causal attention; w >= 1 a sliding window, query t attending to keys
  // t - w < s <= t only (kernels/cpu/ops.h; transformers' sliding_window_causal_mask_function), so w >= T
  // is plain causal. `positions` ((B,T) i32 or empty): packed documents, each query seeing only its own
  // document's keys, s >= t - positions[b, t] (Note [Document masks] in kernels/cpu/ops.h: one mask with
  // the window). A forward and its backward take the same window and positions, and the buffers are sized
  // for them (`documents`: positions will be given).
  // What the attention ops need. The default is the unfused algorithm's (kernels/cpu and kernels/cuda):
  // (B, NH, T, T) probabilities saved and as much scratch; a fused implementation overrides it. The sizes
  // may depend on the window where an implementation takes another path for it (cuda: Note [attention
  // paths]).
  virtual AttentionSizes attention_sizes(int B, int T, int NH, int NKV, int HD, int window = 0,
                                         bool documents = false) const;
  void attention_forward(Tensor out /*(B,T,NH,HD)*/, Tensor saved /*attention_sizes().saved*/, Tensor q,
                         Tensor k, Tensor v, int B, int T, int NH, int NKV, int HD, int window = 0,
                         Tensor positions = {});
  // `out` is the forward's output (B,T,NH,HD), unchanged since: a fused backward reads it (its rowsum with
  // dout) rather than keeping a copy in `saved`.
  void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor scratch, Tensor dout, Tensor q, Tensor k,
                          Tensor v, Tensor out, Tensor saved, int B, int T, int NH, int NKV, int HD,
                          int window = 0, Tensor positions = {});
  // ---- SwiGLU, GeGLU, residual ----
  void swiglu_forward(Tensor out, Tensor gate, Tensor up);
  // May run in place (dgate == gate, dup == up): every implementation reads an element's inputs first.
  void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up);
  // out = gelu_tanh(gate) * up, with PyTorch's gelu(approximate="tanh") (Gemma's MLP); backward as swiglu's,
  // in place allowed.
  void geglu_forward(Tensor out, Tensor gate, Tensor up);
  void geglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up);
  void residual_forward(Tensor out, Tensor a, Tensor b);
  void residual_backward(Tensor da /*+= or empty*/, Tensor db /*+= or empty*/, Tensor dout);
  // ---- dropout (LoRA's, on A's input) ----
  // out = in * mask / (1 - p), nn.Dropout in training mode, in the activation dtype; out may alias in.
  // The mask is kernels/cpu's dropout(): a pure function of (key, element index), so the same key draws the
  // same mask on every implementation (bit for bit) and again in a backward; p in [0, 1), 0 the identity.
  void dropout(Tensor out, Tensor in, double p, std::uint64_t key);
  // ---- cross-entropy fused with its logits gradient ----
  // losses (N, fp32) and mean_loss (1, fp32) are written; dlogits may be empty (forward only) or alias
  // logits.
  // n_valid >= 0: the divisor given, for a chunk of a longer batch (kernels/cpu's; mean_loss then receives
  // this chunk's share, its sum / n_valid).
  void cross_entropy(Tensor dlogits, Tensor losses, Tensor mean_loss, Tensor logits,
                     Tensor targets /*(N) i32*/, int N, int V, float grad_scale, int n_valid = -1);

  // ---- runtime helpers (the engine's device-side work) ----
  // out = in converted (fp32 <-> bf16 / fp16, and fp16 <-> bf16 through fp32, core/dtype.h's rounding;
  // same dtype: a copy). Same numel.
  void cast(Tensor out, Tensor in);
  // out (n = out.numel, fp32 or bf16) = the NF4 values kernels/cpu's dequantize_nf4 computes (double
  // quantisation: the absmax first, as dequantize_nf4_absmax), a bf16 output that fp32 value rounded to
  // nearest even: bit for bit on every implementation. An NF4 base's gathers (model/nf4_chunk.h).
  void dequantize_nf4(Tensor out, const Nf4Blocks& q);
  void fill(Tensor x /*fp32*/, float value);
  // x = 0, any dtype (all bits zero).
  void zero(Tensor x);
  // dst += src (fp32), element by element: the gradient add.
  void add(Tensor dst, Tensor src);
  // x *= s; fp32, or the activation dtype (Gemma's embedding scale on the residual stream), rounded to it.
  void scale(Tensor x /*fp32 or activation*/, float s);
  // out (1 element of 8 bytes: a double) = sum of x^2 in double, in a fixed order (deterministic).
  void squared_norm(Tensor out /*u8 (8)*/, Tensor x /*fp32*/);
  // out (1, i32) = 1 if any element of x is NaN or +-inf, else 0.
  void nonfinite_check(Tensor out, Tensor x /*fp32*/);
  // The device optimizer: kernels/cpu's AdamW (bit-identical on both implementations). p_out, if not empty,
  // receives the new p rounded to its dtype (bf16, fp16 or fp32).
  using AdamW = kernels::cpu::AdamWParams;  // lr, betas, eps, weight_decay, adamw_mode, bias_correction
  void adamw(Tensor p, Tensor g, Tensor m, Tensor v, Tensor p_out, const AdamW& hp, std::int64_t step,
             float grad_scale);

  // ---- device memory the implementation takes (Note [Ops device memory]) ----
  // Bytes of device memory this object holds now, beyond the callers' buffers: its library workspace
  // (taken at construction) and its scratch.
  virtual std::size_t device_bytes() const { return 0; }
  // The scratch every op needs for shapes up to `s` (bytes): the largest single request, as one buffer
  // serves every op on the stream.
  virtual std::size_t scratch_bytes(const OpShapes& s) const;
  // Takes scratch of at least `bytes` now, so that later calls within the shapes it was sized for take no
  // device memory.
  virtual void reserve_scratch(std::size_t bytes);
  // Which attention runs for this shape and window (and with `documents`, a document mask), in words
  // ("cuDNN fused attention", or the fallback and why), so that a run can say what it computed with.
  virtual std::string attention_path(int B, int T, int NH, int NKV, int HD, int window = 0,
                                     bool documents = false) const;

  // ---- results back to the host (these wait for the stream) ----
  float read_f32(Tensor x);   // x[0] of an fp32 tensor
  double read_f64(Tensor x);  // x[0] of an 8-byte u8 tensor written by squared_norm
  std::int32_t read_i32(Tensor x);

 protected:
  explicit Ops(Stream& s, OpsRole role = OpsRole::model) : stream_(s), role_(role) {}
  void rope_operands(const Tensor& out, const Tensor& x, const Tensor& cos, const Tensor& sin, int B, int T,
                     int H, int HD, const Tensor& positions) const;
  void attention_operands(const Tensor& q_shaped, const Tensor& k, const Tensor& v, const Tensor& saved,
                          int B, int T, int NH, int NKV, int HD, int window, const Tensor& positions) const;
  // What an implementation provides: the op, on operands the public method above has checked (dtypes
  // against caps(), sizes against the shape, null pointers). Each enqueues on stream() and returns.
  virtual void do_embedding_forward(Tensor out, Tensor tokens, Tensor wte, int N, int C, int V) = 0;
  virtual void do_embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int N, int C, int V) = 0;
  virtual void do_rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, int N, int C, float eps,
                                  float w_offset) = 0;
  virtual void do_rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, int N,
                                   int C, float w_offset) = 0;
  virtual void do_linear_forward(Tensor out, Tensor x, Tensor w, int N, int IC, int OC) = 0;
  virtual void do_linear_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, int N, int IC,
                                  int OC) = 0;
  virtual void do_bias_forward(Tensor out, Tensor b, int N, int OC) = 0;
  virtual void do_bias_backward(Tensor db, Tensor dout, int N, int OC) = 0;
  virtual void do_rope_cache(Tensor cos, Tensor sin, int T, int HD, std::vector<float> inv_freq) = 0;
  // `positions` may be empty (no documents) in the rope and attention ops.
  virtual void do_rope_forward(Tensor out, Tensor x, Tensor cos, Tensor sin, int B, int T, int H, int HD,
                               Tensor positions) = 0;
  virtual void do_rope_backward(Tensor dx, Tensor dout, Tensor cos, Tensor sin, int B, int T, int H, int HD,
                                Tensor positions) = 0;
  virtual void do_attention_forward(Tensor out, Tensor saved, Tensor q, Tensor k, Tensor v, int B, int T,
                                    int NH, int NKV, int HD, int window, Tensor positions) = 0;
  virtual void do_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor scratch, Tensor dout, Tensor q,
                                     Tensor k, Tensor v, Tensor out, Tensor saved, int B, int T, int NH,
                                     int NKV, int HD, int window, Tensor positions) = 0;
  virtual void do_swiglu_forward(Tensor out, Tensor gate, Tensor up) = 0;
  virtual void do_swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) = 0;
  virtual void do_geglu_forward(Tensor out, Tensor gate, Tensor up) = 0;
  virtual void do_geglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) = 0;
  virtual void do_residual_forward(Tensor out, Tensor a, Tensor b) = 0;
  virtual void do_residual_backward(Tensor da, Tensor db, Tensor dout) = 0;
  virtual void do_dropout(Tensor out, Tensor in, double p, std::uint64_t key) = 0;
  virtual void do_cross_entropy(Tensor dlogits, Tensor losses, Tensor mean_loss, Tensor logits,
                                Tensor targets, int N, int V, float grad_scale, int n_valid) = 0;
  virtual void do_cast(Tensor out, Tensor in) = 0;
  virtual void do_dequantize_nf4(Tensor out, const Nf4Blocks& q) = 0;
  virtual void do_fill(Tensor x, float value) = 0;
  virtual void do_zero(Tensor x) = 0;
  virtual void do_add(Tensor dst, Tensor src) = 0;
  virtual void do_scale(Tensor x, float s) = 0;
  virtual void do_squared_norm(Tensor out, Tensor x) = 0;
  virtual void do_nonfinite_check(Tensor out, Tensor x) = 0;
  virtual void do_adamw(Tensor p, Tensor g, Tensor m, Tensor v, Tensor p_out, const AdamW& hp,
                        std::int64_t step, float grad_scale) = 0;

  // Copies `bytes` from device memory to the host and waits for them.
  void read(void* host, const void* device, std::size_t bytes);
  // A model op called on an Ops of OpsRole::runtime: a programming error.
  void check_model_role(const char* op) const;
  OpsRole role() const { return role_; }

 private:
  Stream& stream_;
  OpsRole role_;
};

// The key of `value` under `key` (a layer's, a site's), for dropout's masks: kernels/cpu's dropout_key.
using cpu::dropout_key;

// What a caller asks of the implementation beyond the backend.
struct OpsOptions {
  // The precision the CPU computes in. fp32 (the default): the fp32 oracle, caps().activation fp32. bf16:
  // bf16 activations, as the cuda path always has — what bf16 training asks for: caps().activation is
  // bf16; activations, weights and activation gradients are bf16, parameter gradients and saved
  // statistics fp32; the matrix products take bf16 operands and accumulate in fp32 (oneDNN), the other ops
  // compute in fp32, and each bf16 output is rounded once (kernels/cpu/ops.h, "bf16 activations"). cuda
  // computes in bf16 whatever this says.
  DType matmul = DType::fp32;
  // The cpus the CPU ops compute on (host backend; strata.cpu_optim.cores keeps the optimizer's apart):
  // each op runs in a oneTBB arena of that many threads pinned to them. Empty: oneTBB's default arena,
  // every cpu. cuda ignores it.
  std::vector<int> cpus = {};
  // model: every op; runtime: the runtime helpers only, with no workspace or handle (OpsRole).
  OpsRole role = OpsRole::model;
  // Device memory the matrix products take at construction for their library's workspace (model role
  // only). No value: the implementation's own (cuda: 32 MiB of cuBLASLt workspace; the CPU: the process's
  // stand-in, 0 unless a test binary sets cuda's size: Note [Workspace stand-in] in
  // kernels/workspace_standin.h). The CPU ops take what is given here from the device as a stand-in, never
  // touched, so that a test holds the engine's memory plan to every byte an implementation takes.
  std::optional<std::size_t> workspace_bytes = std::nullopt;
  // Attention's backward on cuda: true (the default) asks cuDNN for its deterministic algorithm, so the
  // interface is bit-reproducible run to run (strata.deterministic_attention); false lets cuDNN pick its
  // faster non-deterministic one (caps().bit_reproducible is then false). The CPU is deterministic always.
  bool deterministic_attention = true;
};

// The implementation for `dev`'s backend, enqueuing on `stream` (a stream of `dev`). Throws BackendError
// when the backend's compute is not built (cuda without STRATA_WITH_CUDA).
std::unique_ptr<Ops> make_ops(Device& dev, Stream& stream, OpsOptions opts = {});

// Implementations (make_ops calls one of these).
std::unique_ptr<Ops> make_cpu_ops(Device& dev, Stream& stream, OpsOptions opts = {});
#ifdef STRATA_WITH_CUDA
std::unique_ptr<Ops> make_cuda_ops(Device& dev, Stream& stream, OpsOptions opts = {});
#endif

}  // namespace strata::kernels
