// The compute interface on a CUDA device: kernels/cuda behind kernels/ops.h. Activations, weights and
// activation gradients are bf16; everything is enqueued on the interface's stream. A thin mapping: each
// method checks its operands as the CPU implementation does and calls the kernel of the same name.
// Compiled in CI; it runs only where a GPU is (tests/kernels/compute_interface_test.cpp, cuda cases).
#include <cuda_runtime.h>

#include <cstring>

#include "core/cuda_check.h"
#include "core/error.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda_ops_kernels.h"
#include "kernels/ops.h"

namespace strata::kernels {
namespace {

namespace ku = kernels::cuda;

void need(const Tensor& t, DType dtype, std::size_t n, const char* what) {
  STRATA_CHECK(t.dtype == dtype, "kernels: ", what, " is ", dtype_name(t.dtype), ", expected ",
               dtype_name(dtype));
  STRATA_CHECK(t.numel >= n, "kernels: ", what, " holds ", t.numel, " elements, the shape needs ", n);
  STRATA_CHECK(n == 0 || t.data != nullptr, "kernels: ", what, " is null");
}

std::size_t sz(long a, long b = 1, long c = 1, long d = 1) {
  return std::size_t(a) * std::size_t(b) * std::size_t(c) * std::size_t(d);
}

class CudaOps final : public Ops {
 public:
  CudaOps(Device& dev, Stream& s)
      : Ops(s), dev_(dev), s_(static_cast<cudaStream_t>(s.native_handle())), gemm_(dev) {
    STRATA_CHECK(dev.caps().backend == BackendKind::cuda, "kernels: the CUDA ops need a cuda device");
    caps_.backend = BackendKind::cuda;
    caps_.name = "cuda: bf16 storage, fp32 accumulation, cuBLASLt matrix products";
    caps_.activation = DType::bf16;
    caps_.fused_attention = false;
    caps_.bit_reproducible = true;
    caps_.exact_casts = true;
  }
  // The Gemm's workspace and the scratch must outlive the work queued with them.
  ~CudaOps() override {
    try {
      stream().synchronize();
    } catch (...) {
    }
  }
  const OpsCaps& caps() const override { return caps_; }

  void embedding_forward(Tensor out, Tensor tokens, Tensor wte, int N, int C, int V) override {
    need(out, A, sz(N, C), "embedding out");
    need(tokens, DType::i32, sz(N), "tokens");
    need(wte, A, sz(V, C), "wte");
    ku::embedding_forward(out.as<ku::bf16>(), tokens.as<std::int32_t>(), wte.as<ku::bf16>(), N, C, V, s_);
  }
  void embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int N, int C, int V) override {
    need(dwte, F, sz(V, C), "dwte");
    need(dout, A, sz(N, C), "embedding dout");
    need(tokens, DType::i32, sz(N), "tokens");
    const std::size_t bytes = ku::embedding_backward_scratch_bytes(N, V);
    ku::embedding_backward(dwte.as<float>(), dout.as<ku::bf16>(), tokens.as<std::int32_t>(), N, C, V,
                           scratch(bytes), bytes, s_);
  }

  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, int N, int C, float eps) override {
    need(out, A, sz(N, C), "rmsnorm out");
    need(rstd, F, sz(N), "rstd");
    need(x, A, sz(N, C), "rmsnorm x");
    need(w, A, sz(C), "rmsnorm w");
    ku::rmsnorm_forward(out.as<ku::bf16>(), rstd.as<float>(), x.as<ku::bf16>(), w.as<ku::bf16>(), N, C, eps,
                        s_);
  }
  void rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, int N,
                        int C) override {
    need(dx, A, sz(N, C), "rmsnorm dx");
    need(dw, F, sz(C), "rmsnorm dw");
    need(dout, A, sz(N, C), "rmsnorm dout");
    need(x, A, sz(N, C), "rmsnorm x");
    need(w, A, sz(C), "rmsnorm w");
    need(rstd, F, sz(N), "rstd");
    const std::size_t bytes = ku::rmsnorm_backward_scratch_bytes(N, C);
    ku::rmsnorm_backward(dx.as<ku::bf16>(), dw.as<float>(), dout.as<ku::bf16>(), x.as<ku::bf16>(),
                         w.as<ku::bf16>(), rstd.as<float>(), N, C, scratch(bytes), bytes, s_);
  }

  void linear_forward(Tensor out, Tensor x, Tensor w, int N, int IC, int OC) override {
    need(out, A, sz(N, OC), "linear out");
    need(x, A, sz(N, IC), "linear x");
    need(w, A, sz(OC, IC), "linear w");
    ku::linear_forward(gemm_, out.as<ku::bf16>(), x.as<ku::bf16>(), w.as<ku::bf16>(), N, IC, OC, s_);
  }
  void linear_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, int N, int IC,
                       int OC) override {
    if (dx) need(dx, A, sz(N, IC), "linear dx");
    need(dw, F, sz(OC, IC), "linear dw");
    need(dout, A, sz(N, OC), "linear dout");
    need(x, A, sz(N, IC), "linear x");
    need(w, A, sz(OC, IC), "linear w");
    ku::linear_backward(gemm_, dx ? dx.as<ku::bf16>() : nullptr, dw.as<float>(), dout.as<ku::bf16>(),
                        x.as<ku::bf16>(), w.as<ku::bf16>(), N, IC, OC, s_);
  }

  void rope_cache(Tensor cos, Tensor sin, int T, int HD, float theta) override {
    need(cos, F, sz(T, HD / 2), "rope cos");
    need(sin, F, sz(T, HD / 2), "rope sin");
    ku::rope_cache(cos.as<float>(), sin.as<float>(), T, HD, theta, s_);
  }
  void rope_forward(Tensor out, Tensor x, Tensor cos, Tensor sin, int B, int T, int H, int HD) override {
    rope_args(out, x, cos, sin, B, T, H, HD);
    ku::rope_forward(out.as<ku::bf16>(), x.as<ku::bf16>(), cos.as<float>(), sin.as<float>(), B, T, H, HD, s_);
  }
  void rope_backward(Tensor dx, Tensor dout, Tensor cos, Tensor sin, int B, int T, int H, int HD) override {
    rope_args(dx, dout, cos, sin, B, T, H, HD);
    ku::rope_backward(dx.as<ku::bf16>(), dout.as<ku::bf16>(), cos.as<float>(), sin.as<float>(), B, T, H, HD,
                      s_);
  }

  AttentionSizes attention_sizes(int B, int T, int NH, int, int) const override {
    return {.saved = sz(B, NH, T, T), .scratch = sz(B, NH, T, T)};
  }
  void attention_forward(Tensor out, Tensor saved, Tensor q, Tensor k, Tensor v, int B, int T, int NH,
                         int NKV, int HD) override {
    attention_args(out, q, k, v, B, T, NH, NKV, HD);
    need(saved, F, sz(B, NH, T, T), "attention probabilities");
    ku::attention_forward(out.as<ku::bf16>(), saved.as<float>(), q.as<ku::bf16>(), k.as<ku::bf16>(),
                          v.as<ku::bf16>(), B, T, NH, NKV, HD, s_);
  }
  void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor scratch, Tensor dout, Tensor q, Tensor k,
                          Tensor v, Tensor saved, int B, int T, int NH, int NKV, int HD) override {
    attention_args(dout, q, k, v, B, T, NH, NKV, HD);
    attention_args(dq, dq, dk, dv, B, T, NH, NKV, HD);
    need(saved, F, sz(B, NH, T, T), "attention probabilities");
    need(scratch, F, sz(B, NH, T, T), "attention scratch");
    ku::attention_backward(dq.as<ku::bf16>(), dk.as<ku::bf16>(), dv.as<ku::bf16>(), scratch.as<float>(),
                           dout.as<ku::bf16>(), q.as<ku::bf16>(), k.as<ku::bf16>(), v.as<ku::bf16>(),
                           saved.as<float>(), B, T, NH, NKV, HD, s_);
  }

  void swiglu_forward(Tensor out, Tensor gate, Tensor up) override {
    const std::size_t n = out.numel;
    for (const Tensor* t : {&out, &gate, &up}) need(*t, A, n, "swiglu operand");
    ku::swiglu_forward(out.as<ku::bf16>(), gate.as<ku::bf16>(), up.as<ku::bf16>(), n, s_);
  }
  void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) override {
    const std::size_t n = dout.numel;
    for (const Tensor* t : {&dgate, &dup, &dout, &gate, &up}) need(*t, A, n, "swiglu operand");
    ku::swiglu_backward(dgate.as<ku::bf16>(), dup.as<ku::bf16>(), dout.as<ku::bf16>(), gate.as<ku::bf16>(),
                        up.as<ku::bf16>(), n, s_);
  }
  void residual_forward(Tensor out, Tensor a, Tensor b) override {
    const std::size_t n = out.numel;
    for (const Tensor* t : {&out, &a, &b}) need(*t, A, n, "residual operand");
    ku::residual_forward(out.as<ku::bf16>(), a.as<ku::bf16>(), b.as<ku::bf16>(), n, s_);
  }
  void residual_backward(Tensor da, Tensor db, Tensor dout) override {
    const std::size_t n = dout.numel;
    need(dout, A, n, "residual dout");
    if (da) need(da, A, n, "residual da");
    if (db) need(db, A, n, "residual db");
    ku::residual_backward(da ? da.as<ku::bf16>() : nullptr, db ? db.as<ku::bf16>() : nullptr,
                          dout.as<ku::bf16>(), n, s_);
  }

  void cross_entropy(Tensor dlogits, Tensor losses, Tensor mean_loss, Tensor logits, Tensor targets, int N,
                     int V, float grad_scale) override {
    need(logits, A, sz(N, V), "logits");
    if (dlogits) need(dlogits, A, sz(N, V), "dlogits");
    need(losses, F, sz(N), "losses");
    need(mean_loss, F, 1, "mean loss");
    need(targets, DType::i32, sz(N), "targets");
    ku::cross_entropy_forward_backward(dlogits ? dlogits.as<ku::bf16>() : nullptr, losses.as<float>(),
                                       mean_loss.as<float>(), logits.as<ku::bf16>(),
                                       targets.as<std::int32_t>(), N, V, grad_scale, s_);
  }

  void cast(Tensor out, Tensor in) override {
    STRATA_CHECK(out.numel == in.numel, "kernels: cast of ", in.numel, " elements into ", out.numel);
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
    } else {
      STRATA_CHECK(false, "kernels: no cast from ", dtype_name(in.dtype), " to ", dtype_name(out.dtype));
    }
  }
  void fill(Tensor x, float value) override {
    need(x, F, x.numel, "fill target");
    cuda_ops::fill_f32(x.as<float>(), value, x.numel, s_);
  }
  void zero(Tensor x) override {
    STRATA_CHECK(x.numel == 0 || x.data, "kernels: zero of a null tensor");
    if (x.numel == 0) return;
    detail::CudaDeviceGuard guard(s_);
    STRATA_CUDA_CHECK(cudaMemsetAsync(x.data, 0, x.bytes(), s_));
  }
  void add(Tensor dst, Tensor src) override {
    need(dst, F, src.numel, "add dst");
    need(src, F, src.numel, "add src");
    cuda_ops::add_f32(dst.as<float>(), src.as<float>(), src.numel, s_);
  }
  void scale(Tensor x, float s) override {
    need(x, F, x.numel, "scale target");
    ku::scale(x.as<float>(), s, x.numel, s_);
  }
  void squared_norm(Tensor out, Tensor x) override {
    need(out, DType::u8, sizeof(double), "squared norm out");
    need(x, F, x.numel, "squared norm x");
    const std::size_t bytes = ku::squared_norm_scratch_bytes(x.numel);
    ku::squared_norm(static_cast<double*>(out.data), x.as<float>(), x.numel, scratch(bytes), bytes, s_);
  }
  void nonfinite_check(Tensor out, Tensor x) override {
    need(out, DType::i32, 1, "non-finite flag");
    need(x, F, x.numel, "non-finite check x");
    ku::nonfinite_check(out.as<int>(), x.as<float>(), x.numel, s_);
  }
  void adamw(Tensor p, Tensor g, Tensor m, Tensor v, Tensor p_out, const AdamW& hp, std::int64_t step,
             float grad_scale) override {
    const std::size_t n = p.numel;
    for (const Tensor* t : {&p, &g, &m, &v}) need(*t, F, n, "adamw operand");
    if (p_out) STRATA_CHECK(p_out.numel >= n, "kernels: adamw p_out holds ", p_out.numel, " of ", n);
    const ku::AdamWParams k{.lr = hp.lr,
                            .beta1 = hp.beta1,
                            .beta2 = hp.beta2,
                            .eps = hp.eps,
                            .weight_decay = hp.weight_decay,
                            .adamw_mode = hp.adamw_mode,
                            .bias_correction = hp.bias_correction};
    const bool bf16_out = p_out && p_out.dtype == DType::bf16;
    ku::adamw_update(p.as<float>(), g.as<float>(), m.as<float>(), v.as<float>(),
                     bf16_out ? p_out.as<ku::bf16>() : nullptr, n, k, step, grad_scale, s_);
    if (p_out && !bf16_out) cast(p_out.slice(0, n), p.slice(0, n));
  }

 private:
  static constexpr DType A = DType::bf16;
  static constexpr DType F = DType::fp32;

  static void rope_args(const Tensor& out, const Tensor& x, const Tensor& cos, const Tensor& sin, int B,
                        int T, int H, int HD) {
    need(out, A, sz(B, T, H, HD), "rope out");
    need(x, A, sz(B, T, H, HD), "rope x");
    need(cos, F, sz(T, HD / 2), "rope cos");
    need(sin, F, sz(T, HD / 2), "rope sin");
  }
  static void attention_args(const Tensor& out_or_q, const Tensor& q, const Tensor& k, const Tensor& v, int B,
                             int T, int NH, int NKV, int HD) {
    need(out_or_q, A, sz(B, T, NH, HD), "attention (B,T,NH,HD) operand");
    need(q, A, sz(B, T, NH, HD), "attention q");
    need(k, A, sz(B, T, NKV, HD), "attention k");
    need(v, A, sz(B, T, NKV, HD), "attention v");
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
  ku::Gemm gemm_;
  DeviceBuffer scratch_;
  OpsCaps caps_;
};

}  // namespace

std::unique_ptr<Ops> make_cuda_ops(Device& dev, Stream& stream) {
  return std::make_unique<CudaOps>(dev, stream);
}

}  // namespace strata::kernels
