// The compute interface on a CUDA device: kernels/cuda behind kernels/ops.h. Activations, weights and
// activation gradients are bf16; everything is enqueued on the interface's stream. A thin mapping: each
// method checks its operands as the CPU implementation does and calls the kernel of the same name.
// Compiled in CI; it runs only where a GPU is (tests/kernels/compute_interface_test.cpp, cuda cases).
//
// Note [attention paths]: attention runs on cuDNN's fused attention (kernels/cuda/attention_cudnn.h) for
// every shape cuDNN accepts on this GPU — built in (STRATA_WITH_CUDNN), bf16/fp16 activations, compute
// capability 8.0 or newer, and the frontend's support check and plan build pass for both graphs — and on
// kernels/cuda's own unfused kernel otherwise. The choice is made once per shape (the cuDNN plan is cached)
// and attention_sizes() reports the chosen path's buffers, so forward, backward and the engine's memory
// plan always agree. caps().fused_attention is true when cuDNN runs on this GPU at all: a shape it still
// refuses (a head dimension past its limits, say) takes the unfused kernel, with its (B,NH,T,T) buffers.
// A sliding window is part of the shape (AttentionShape::window; 0 for one no shorter than T, which is
// causal): cuDNN's windowed graphs where it has them, the own kernel with the same window where not, with
// the reason in attention_path(). A model with full and windowed layers may so run two paths, and sizes
// its buffers for the larger (model/llama.cpp). The cuDNN path is compiled, never run on a GPU.
// Documents (positions given: kernels/cpu's Note [Document masks]) take the own kernel, whose band takes
// them, whatever the shape: the cuDNN graphs here have no per-token document mask (cuDNN's ragged,
// variable-length form would make every document a sequence of its own, a graph per packing), so
// attention_sizes(..., documents) reports the own kernel's (B,NH,T,T) buffers and attention_path says why.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "core/cuda_check.h"
#include "core/error.h"
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/nf4_cuda.h"
#include "kernels/cuda/ops.h"
#include "kernels/ops.h"
#include "kernels/workspace_standin.h"

namespace strata::kernels {
namespace {

namespace ku = kernels::cuda;

// The CPU ops' stand-in takes what a model-role object takes here (Note [Workspace stand-in]).
static_assert(ku::kGemmWorkspaceBytes == kCudaWorkspaceBytes, "the stand-in must be cuBLASLt's workspace");

class CudaOps final : public Ops {
 public:
  CudaOps(Device& dev, Stream& s, const OpsOptions& opts)
      : Ops(s, opts.role), dev_(dev), s_(static_cast<cudaStream_t>(s.native_handle())) {
    STRATA_CHECK(dev.caps().backend == BackendKind::cuda, "kernels: the CUDA ops need a cuda device");
    STRATA_CHECK(s_ != nullptr, "kernels: the CUDA ops need a cuda stream");
    caps_.backend = BackendKind::cuda;
    caps_.activation = DType::bf16;
    if (opts.role == OpsRole::runtime) {  // the runtime helpers: no workspace, no handle (OpsRole)
      caps_.name = "cuda: runtime helpers";
      return;
    }
    gemm_ = std::make_unique<ku::Gemm>(dev, opts.workspace_bytes.value_or(ku::kGemmWorkspaceBytes));
    cudnn_ = std::make_unique<CudnnAttention>(s_, opts.deterministic_attention);
    caps_.fused_attention = cudnn_->available();  // Note [attention paths]
    caps_.bit_reproducible = opts.deterministic_attention || !caps_.fused_attention;
    caps_.name =
        caps_.fused_attention
            ? "cuda: bf16 storage, fp32 accumulation, cuBLASLt matrix products, cuDNN fused attention"
            : "cuda: bf16 storage, fp32 accumulation, cuBLASLt matrix products";
  }
  // The Gemm's workspace and the scratch must outlive the work queued with them.
  ~CudaOps() override {
    try {
      stream().synchronize();
    } catch (...) {
    }
  }
  const OpsCaps& caps() const override { return caps_; }

  std::size_t device_bytes() const override {
    return (gemm_ ? gemm_->workspace_bytes() : 0) + scratch_.size();
  }
  std::size_t scratch_bytes(const OpShapes& sh) const override {
    std::size_t b = ku::squared_norm_scratch_bytes(sh.reduce_numel);
    if (role() == OpsRole::runtime) return b;
    if (sh.N > 0 && sh.V > 0) b = std::max(b, ku::embedding_backward_scratch_bytes(sh.N, sh.V));
    if (sh.N > 0 && sh.C > 0) {
      b = std::max(b, ku::rmsnorm_backward_scratch_bytes(sh.N, sh.C));
      b = std::max(b, ku::bias_backward_scratch_bytes(sh.N, sh.C));  // the o projection's bias
    }
    // The k and v heads (NKV <= NH) need no more than the q heads, so NH stands for both below.
    if (sh.N > 0 && sh.NH > 0 && sh.HD > 0) {
      // The q, k, v projections' biases (OC = NH * HD, NKV * HD). OpShapes does not say whether the model
      // has them, so they are always counted (ceil(N / 64) * NH * HD floats, as a norm of width NH * HD).
      b = std::max(b, ku::bias_backward_scratch_bytes(sh.N, sh.NH * sh.HD));
      // Per-head q/k norm: RMSNorm over N * NH rows of HD (q) and N * NKV rows (k).
      if (sh.head_norm) b = std::max(b, ku::rmsnorm_backward_scratch_bytes(sh.N * sh.NH, sh.HD));
    }
    if (sh.B > 0 && sh.T > 0 && sh.NH > 0 && sh.NKV > 0 && sh.HD > 0)
      for (int window : {0, sh.window})  // the full layers' attention and the windowed ones'
        if (const CudnnAttention::Plan& p = cudnn_->plan(shape(sh.B, sh.T, sh.NH, sh.NKV, sh.HD, window));
            p.supported)
          b = std::max(b, p.forward_workspace_bytes);
    return b;
  }
  void reserve_scratch(std::size_t bytes) override {
    if (bytes > 0) scratch(bytes);
  }
  std::string attention_path(int B, int T, int NH, int NKV, int HD, int window,
                             bool documents) const override {
    check_model_role("attention_path");
    const AttentionShape sh = shape(B, T, NH, NKV, HD, window);
    const std::string band = sh.window > 0 ? detail::cat(", sliding window ", sh.window) : "";
    if (documents)
      return detail::cat("kernels/cuda's own unfused attention, (B,NH,T,T) fp32 scores", band,
                         ", documents kept apart (cuDNN's graphs here have no per-token document mask)");
    const CudnnAttention::Plan& p = cudnn_->plan(sh);
    if (p.supported) return cudnn_->describe_path() + band;
    return detail::cat("kernels/cuda's own unfused attention, (B,NH,T,T) fp32 scores", band,
                       " (cuDNN: ", p.why_not, ")");
  }

  void do_embedding_forward(Tensor out, Tensor tokens, Tensor wte, int N, int C, int V) override {
    ku::embedding_forward(out.as<ku::bf16>(), tokens.as<std::int32_t>(), wte.as<ku::bf16>(), N, C, V, s_);
  }
  void do_embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int N, int C, int V) override {
    const std::size_t bytes = ku::embedding_backward_scratch_bytes(N, V);
    ku::embedding_backward(dwte.as<float>(), dout.as<ku::bf16>(), tokens.as<std::int32_t>(), N, C, V,
                           scratch(bytes), bytes, s_);
  }

  void do_rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, int N, int C, float eps,
                          float w_offset) override {
    ku::rmsnorm_forward(out.as<ku::bf16>(), rstd.as<float>(), x.as<ku::bf16>(), w.as<ku::bf16>(), N, C, eps,
                        w_offset, s_);
  }
  void do_rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, int N, int C,
                           float w_offset) override {
    const std::size_t bytes = ku::rmsnorm_backward_scratch_bytes(N, C);
    ku::rmsnorm_backward(dx.as<ku::bf16>(), dw ? dw.as<float>() : nullptr, dout.as<ku::bf16>(),
                         x.as<ku::bf16>(), w.as<ku::bf16>(), rstd.as<float>(), N, C, w_offset, scratch(bytes),
                         bytes, s_);
  }

  void do_linear_forward(Tensor out, Tensor x, Tensor w, int N, int IC, int OC) override {
    ku::linear_forward(*gemm_, out.as<ku::bf16>(), x.as<ku::bf16>(), w.as<ku::bf16>(), N, IC, OC, s_);
  }
  void do_linear_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, int N, int IC,
                          int OC) override {
    ku::linear_backward(*gemm_, dx ? dx.as<ku::bf16>() : nullptr, dw ? dw.as<float>() : nullptr,
                        dout.as<ku::bf16>(), x.as<ku::bf16>(), w.as<ku::bf16>(), N, IC, OC, s_);
  }

  void do_bias_forward(Tensor out, Tensor b, int N, int OC) override {
    ku::bias_forward(out.as<ku::bf16>(), b.as<ku::bf16>(), N, OC, s_);
  }
  void do_bias_backward(Tensor db, Tensor dout, int N, int OC) override {
    const std::size_t bytes = ku::bias_backward_scratch_bytes(N, OC);
    ku::bias_backward(db.as<float>(), dout.as<ku::bf16>(), N, OC, scratch(bytes), bytes, s_);
  }

  void do_rope_cache(Tensor cos, Tensor sin, int T, int HD, std::vector<float> inv_freq) override {
    ku::rope_cache(cos.as<float>(), sin.as<float>(), T, HD, inv_freq.data(), s_);
  }
  void do_rope_forward(Tensor out, Tensor x, Tensor cos, Tensor sin, int B, int T, int H, int HD,
                       Tensor pos) override {
    ku::rope_forward(out.as<ku::bf16>(), x.as<ku::bf16>(), cos.as<float>(), sin.as<float>(), B, T, H, HD,
                     pos.as<std::int32_t>(), s_);
  }
  void do_rope_backward(Tensor dx, Tensor dout, Tensor cos, Tensor sin, int B, int T, int H, int HD,
                        Tensor pos) override {
    ku::rope_backward(dx.as<ku::bf16>(), dout.as<ku::bf16>(), cos.as<float>(), sin.as<float>(), B, T, H, HD,
                      pos.as<std::int32_t>(), s_);
  }

  // Note [attention paths]: documents take the own kernel.
  AttentionSizes attention_sizes(int B, int T, int NH, int NKV, int HD, int window,
                                 bool documents) const override {
    check_model_role("attention_sizes");
    if (documents) return Ops::attention_sizes(B, T, NH, NKV, HD, window, documents);
    const CudnnAttention::Plan& p = cudnn_->plan(shape(B, T, NH, NKV, HD, window));
    return p.supported ? p.sizes : Ops::attention_sizes(B, T, NH, NKV, HD, window);
  }
  void do_attention_forward(Tensor out, Tensor saved, Tensor q, Tensor k, Tensor v, int B, int T, int NH,
                            int NKV, int HD, int window, Tensor pos) override {
    const AttentionShape sh = shape(B, T, NH, NKV, HD, window);
    if (const CudnnAttention::Plan& p = cudnn_->plan(sh); !pos && p.supported) {
      cudnn_->forward(sh, out, saved, q, k, v, scratch(p.forward_workspace_bytes));
      return;
    }
    ku::attention_forward(out.as<ku::bf16>(), saved.as<float>(), q.as<ku::bf16>(), k.as<ku::bf16>(),
                          v.as<ku::bf16>(), B, T, NH, NKV, HD, sh.window, pos.as<std::int32_t>(), s_);
  }
  void do_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor scratch, Tensor dout, Tensor q, Tensor k,
                             Tensor v, Tensor out, Tensor saved, int B, int T, int NH, int NKV, int HD,
                             int window, Tensor pos) override {
    const AttentionShape sh = shape(B, T, NH, NKV, HD, window);
    if (!pos && cudnn_->plan(sh).supported) {
      cudnn_->backward(sh, dq, dk, dv, scratch, dout, q, k, v, out, saved);
      return;
    }
    ku::attention_backward(dq.as<ku::bf16>(), dk.as<ku::bf16>(), dv.as<ku::bf16>(), scratch.as<float>(),
                           dout.as<ku::bf16>(), q.as<ku::bf16>(), k.as<ku::bf16>(), v.as<ku::bf16>(),
                           out.as<ku::bf16>(), saved.as<float>(), B, T, NH, NKV, HD, sh.window,
                           pos.as<std::int32_t>(), s_);
  }

  void do_swiglu_forward(Tensor out, Tensor gate, Tensor up) override {
    const std::size_t n = out.numel;
    ku::swiglu_forward(out.as<ku::bf16>(), gate.as<ku::bf16>(), up.as<ku::bf16>(), n, s_);
  }
  void do_swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) override {
    const std::size_t n = dout.numel;
    ku::swiglu_backward(dgate.as<ku::bf16>(), dup.as<ku::bf16>(), dout.as<ku::bf16>(), gate.as<ku::bf16>(),
                        up.as<ku::bf16>(), n, s_);
  }
  void do_geglu_forward(Tensor out, Tensor gate, Tensor up) override {
    const std::size_t n = out.numel;
    ku::geglu_forward(out.as<ku::bf16>(), gate.as<ku::bf16>(), up.as<ku::bf16>(), n, s_);
  }
  void do_geglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) override {
    const std::size_t n = dout.numel;
    ku::geglu_backward(dgate.as<ku::bf16>(), dup.as<ku::bf16>(), dout.as<ku::bf16>(), gate.as<ku::bf16>(),
                       up.as<ku::bf16>(), n, s_);
  }
  void do_residual_forward(Tensor out, Tensor a, Tensor b) override {
    const std::size_t n = out.numel;
    ku::residual_forward(out.as<ku::bf16>(), a.as<ku::bf16>(), b.as<ku::bf16>(), n, s_);
  }
  void do_residual_backward(Tensor da, Tensor db, Tensor dout) override {
    const std::size_t n = dout.numel;
    ku::residual_backward(da ? da.as<ku::bf16>() : nullptr, db ? db.as<ku::bf16>() : nullptr,
                          dout.as<ku::bf16>(), n, s_);
  }
  void do_dropout(Tensor out, Tensor in, double p, std::uint64_t key) override {
    ku::dropout(out.as<ku::bf16>(), in.as<ku::bf16>(), in.numel, p, key, s_);
  }

  void do_cross_entropy(Tensor dlogits, Tensor losses, Tensor mean_loss, Tensor logits, Tensor targets, int N,
                        int V, float grad_scale, int n_valid) override {
    ku::cross_entropy_forward_backward(dlogits ? dlogits.as<ku::bf16>() : nullptr, losses.as<float>(),
                                       mean_loss.as<float>(), logits.as<ku::bf16>(),
                                       targets.as<std::int32_t>(), N, V, grad_scale, s_, n_valid);
  }

  void do_cast(Tensor out, Tensor in) override {
    const std::size_t n = in.numel;
    if (out.dtype == in.dtype) {
      if (n == 0) return;
      detail::CudaDeviceGuard guard(s_);
      STRATA_CUDA_CHECK(cudaMemcpyAsync(out.data, in.data, in.bytes(), cudaMemcpyDefault, s_));
    } else if (in.dtype == F && out.dtype == DType::bf16) {
      ku::cast_f32_to_bf16(out.as<ku::bf16>(), in.as<float>(), n, s_);
    } else if (in.dtype == F && out.dtype == DType::fp16) {
      ku::cast_f32_to_f16(out.as<ku::fp16>(), in.as<float>(), n, s_);
    } else if (in.dtype == DType::bf16 && out.dtype == F) {
      ku::cast_bf16_to_f32(out.as<float>(), in.as<ku::bf16>(), n, s_);
    } else if (in.dtype == DType::fp16 && out.dtype == F) {
      ku::cast_f16_to_f32(out.as<float>(), in.as<ku::fp16>(), n, s_);
    } else if (in.dtype == DType::fp16 && out.dtype == DType::bf16) {
      ku::cast_f16_to_bf16(out.as<ku::bf16>(), in.as<ku::fp16>(), n, s_);
    } else {  // bf16 -> fp16, the one left (Ops::cast checked the pair)
      ku::cast_bf16_to_f16(out.as<ku::fp16>(), in.as<ku::bf16>(), n, s_);
    }
  }
  void do_dequantize_nf4(Tensor out, const Nf4Blocks& q) override {
    const auto* codes = static_cast<const std::uint8_t*>(q.codes);
    const std::size_t n = out.numel;
    if (q.double_quant) {
      const ku::Nf4DoubleQuantDevice dq{.codes = static_cast<const std::uint8_t*>(q.absmax),
                                        .absmax2 = static_cast<const float*>(q.absmax2),
                                        .offset = q.offset};
      if (out.dtype == DType::bf16)
        ku::dequantize_nf4(out.as<ku::bf16>(), codes, dq, n, q.blocksize, s_);
      else
        ku::dequantize_nf4(out.as<float>(), codes, dq, n, q.blocksize, s_);
    } else {
      const auto* absmax = static_cast<const float*>(q.absmax);
      if (out.dtype == DType::bf16)
        ku::dequantize_nf4(out.as<ku::bf16>(), codes, absmax, n, q.blocksize, s_);
      else
        ku::dequantize_nf4(out.as<float>(), codes, absmax, n, q.blocksize, s_);
    }
  }
  void do_fill(Tensor x, float value) override { ku::fill_f32(x.as<float>(), value, x.numel, s_); }
  void do_zero(Tensor x) override {
    if (x.numel == 0) return;
    detail::CudaDeviceGuard guard(s_);
    STRATA_CUDA_CHECK(cudaMemsetAsync(x.data, 0, x.bytes(), s_));
  }
  void do_add(Tensor dst, Tensor src) override {
    ku::add_f32(dst.as<float>(), src.as<float>(), src.numel, s_);
  }
  void do_scale(Tensor x, float s) override {
    if (x.dtype == DType::bf16)  // the activation dtype (Ops::scale checked it)
      ku::scale(x.as<ku::bf16>(), s, x.numel, s_);
    else
      ku::scale(x.as<float>(), s, x.numel, s_);
  }
  void do_squared_norm(Tensor out, Tensor x) override {
    const std::size_t bytes = ku::squared_norm_scratch_bytes(x.numel);
    ku::squared_norm(static_cast<double*>(out.data), x.as<float>(), x.numel, scratch(bytes), bytes, s_);
  }
  void do_nonfinite_check(Tensor out, Tensor x) override {
    ku::nonfinite_check(out.as<int>(), x.as<float>(), x.numel, s_);
  }
  void do_adamw(Tensor p, Tensor g, Tensor m, Tensor v, Tensor p_out, const AdamW& hp, std::int64_t step,
                float grad_scale) override {
    const std::size_t n = p.numel;
    const bool bf16_out = p_out && p_out.dtype == DType::bf16;
    ku::adamw_update(p.as<float>(), g.as<float>(), m.as<float>(), v.as<float>(),
                     bf16_out ? p_out.as<ku::bf16>() : nullptr, n, hp, step, grad_scale, s_);
    if (p_out && !bf16_out) cast(p_out.slice(0, n), p.slice(0, n));
  }

 private:
  static constexpr DType A = DType::bf16;
  static constexpr DType F = DType::fp32;

  // A window no shorter than T is causal attention: 0, so that both share one plan.
  AttentionShape shape(int B, int T, int NH, int NKV, int HD, int window) const {
    return {.B = B,
            .T = T,
            .NH = NH,
            .NKV = NKV,
            .HD = HD,
            .window = window > 0 && window < T ? window : 0,
            .dtype = caps_.activation};
  }

  // Scratch for the kernels that need it, grown to the largest request and reused: calls on one stream run
  // in order, so one buffer serves them all. Device memory, counted against the cap.
  void* scratch(std::size_t bytes) {
    if (scratch_.size() < bytes) {
      stream().synchronize();  // the old buffer may still be in use by an earlier call
      scratch_ = DeviceBuffer();
      scratch_ = DeviceBuffer(dev_, bytes, "compute scratch");
    }
    return scratch_.data();
  }

  Device& dev_;
  cudaStream_t s_;
  std::unique_ptr<ku::Gemm> gemm_;         // model role only
  std::unique_ptr<CudnnAttention> cudnn_;  // model role only; Note [attention paths]
  DeviceBuffer scratch_;
  OpsCaps caps_;
};

}  // namespace

std::unique_ptr<Ops> make_cuda_ops(Device& dev, Stream& stream, OpsOptions opts) {
  return std::make_unique<CudaOps>(dev, stream, opts);
}

}  // namespace strata::kernels
