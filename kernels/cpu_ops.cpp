// The compute interface on the CPU: kernels/cpu's fp32 ops behind kernels/ops.h.
//
// Note [CPU ops on the stream]: on the host backend a Stream is a worker thread. Each op checks its
// operands on the calling thread, then is enqueued on the stream as a host function: it runs after the
// work already there (a copy, a wait on another stream's event) and before anything enqueued later, and
// the call returns at once — exactly what a cuda stream does with a kernel launch. So the model and the
// engine issue one stream-ordered program for both backends, the host backend has the same overlap (a
// gather cast on the gather stream runs while the compute stream computes) and the same ordering bugs
// a GPU would have, and the results are those of calling kernels/cpu directly, bit for bit (the same
// functions in the same order; the threads they run on do not change their arithmetic).
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/ops.h"

namespace strata::kernels {
namespace {

namespace kc = kernels::cpu;

// Checks that `t` holds at least `n` elements of `dtype` (a programming error otherwise).
void need(const Tensor& t, DType dtype, std::size_t n, const char* what) {
  STRATA_CHECK(t.dtype == dtype, "kernels: ", what, " is ", dtype_name(t.dtype), ", expected ",
               dtype_name(dtype));
  STRATA_CHECK(t.numel >= n, "kernels: ", what, " holds ", t.numel, " elements, the shape needs ", n);
  STRATA_CHECK(n == 0 || t.data != nullptr, "kernels: ", what, " is null");
}

std::size_t sz(long a, long b = 1, long c = 1, long d = 1) {
  return std::size_t(a) * std::size_t(b) * std::size_t(c) * std::size_t(d);
}

class CpuOps final : public Ops {
 public:
  explicit CpuOps(Device& dev, Stream& s) : Ops(s) {
    STRATA_CHECK(dev.caps().host_addressable, "kernels: the CPU ops need host-addressable device memory");
    caps_.backend = dev.caps().backend;
    caps_.name = "cpu: fp32, OpenBLAS matrix products, oneTBB loops";
    caps_.activation = DType::fp32;
    caps_.fused_attention = false;
    caps_.bit_reproducible = true;
    caps_.exact_casts = true;
  }
  const OpsCaps& caps() const override { return caps_; }

  void embedding_forward(Tensor out, Tensor tokens, Tensor wte, int N, int C, int V) override {
    need(out, F, sz(N, C), "embedding out");
    need(tokens, DType::i32, sz(N), "tokens");
    need(wte, F, sz(V, C), "wte");
    enqueue(
        [=] { kc::embedding_forward(out.as<float>(), tokens.as<std::int32_t>(), wte.as<float>(), N, C, V); });
  }
  void embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int N, int C, int V) override {
    need(dwte, F, sz(V, C), "dwte");
    need(dout, F, sz(N, C), "embedding dout");
    need(tokens, DType::i32, sz(N), "tokens");
    enqueue([=] {
      kc::embedding_backward(dwte.as<float>(), dout.as<float>(), tokens.as<std::int32_t>(), N, C, V);
    });
  }

  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, int N, int C, float eps) override {
    need(out, F, sz(N, C), "rmsnorm out");
    need(rstd, F, sz(N), "rstd");
    need(x, F, sz(N, C), "rmsnorm x");
    need(w, F, sz(C), "rmsnorm w");
    enqueue([=] {
      kc::rmsnorm_forward(out.as<float>(), rstd.as<float>(), x.as<float>(), w.as<float>(), N, C, eps);
    });
  }
  void rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, int N,
                        int C) override {
    need(dx, F, sz(N, C), "rmsnorm dx");
    need(dw, F, sz(C), "rmsnorm dw");
    need(dout, F, sz(N, C), "rmsnorm dout");
    need(x, F, sz(N, C), "rmsnorm x");
    need(w, F, sz(C), "rmsnorm w");
    need(rstd, F, sz(N), "rstd");
    enqueue([=] {
      kc::rmsnorm_backward(dx.as<float>(), dw.as<float>(), dout.as<float>(), x.as<float>(), w.as<float>(),
                           rstd.as<float>(), N, C);
    });
  }

  void linear_forward(Tensor out, Tensor x, Tensor w, int N, int IC, int OC) override {
    need(out, F, sz(N, OC), "linear out");
    need(x, F, sz(N, IC), "linear x");
    need(w, F, sz(OC, IC), "linear w");
    enqueue([=] { kc::linear_forward(out.as<float>(), x.as<float>(), w.as<float>(), N, IC, OC); });
  }
  void linear_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, int N, int IC,
                       int OC) override {
    if (dx) need(dx, F, sz(N, IC), "linear dx");
    need(dw, F, sz(OC, IC), "linear dw");
    need(dout, F, sz(N, OC), "linear dout");
    need(x, F, sz(N, IC), "linear x");
    need(w, F, sz(OC, IC), "linear w");
    enqueue([=] {
      kc::linear_backward(dx ? dx.as<float>() : nullptr, dw.as<float>(), dout.as<float>(), x.as<float>(),
                          w.as<float>(), N, IC, OC);
    });
  }

  void rope_cache(Tensor cos, Tensor sin, int T, int HD, float theta) override {
    need(cos, F, sz(T, HD / 2), "rope cos");
    need(sin, F, sz(T, HD / 2), "rope sin");
    enqueue([=] { kc::rope_cache(cos.as<float>(), sin.as<float>(), T, HD, theta); });
  }
  void rope_forward(Tensor out, Tensor x, Tensor cos, Tensor sin, int B, int T, int H, int HD) override {
    rope_args(out, x, cos, sin, B, T, H, HD);
    enqueue([=] {
      kc::rope_forward(out.as<float>(), x.as<float>(), cos.as<float>(), sin.as<float>(), B, T, H, HD);
    });
  }
  void rope_backward(Tensor dx, Tensor dout, Tensor cos, Tensor sin, int B, int T, int H, int HD) override {
    rope_args(dx, dout, cos, sin, B, T, H, HD);
    enqueue([=] {
      kc::rope_backward(dx.as<float>(), dout.as<float>(), cos.as<float>(), sin.as<float>(), B, T, H, HD);
    });
  }

  AttentionSizes attention_sizes(int B, int T, int NH, int, int) const override {
    return {.saved = sz(B, NH, T, T), .scratch = sz(B, NH, T, T)};
  }
  void attention_forward(Tensor out, Tensor saved, Tensor q, Tensor k, Tensor v, int B, int T, int NH,
                         int NKV, int HD) override {
    attention_args(out, q, k, v, B, T, NH, NKV, HD);
    need(saved, F, sz(B, NH, T, T), "attention probabilities");
    enqueue([=] {
      kc::attention_forward(out.as<float>(), saved.as<float>(), q.as<float>(), k.as<float>(), v.as<float>(),
                            B, T, NH, NKV, HD);
    });
  }
  void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor scratch, Tensor dout, Tensor q, Tensor k,
                          Tensor v, Tensor saved, int B, int T, int NH, int NKV, int HD) override {
    attention_args(dout, q, k, v, B, T, NH, NKV, HD);
    attention_args(dq, dq, dk, dv, B, T, NH, NKV, HD);
    need(saved, F, sz(B, NH, T, T), "attention probabilities");
    need(scratch, F, sz(B, NH, T, T), "attention scratch");
    enqueue([=] {
      kc::attention_backward(dq.as<float>(), dk.as<float>(), dv.as<float>(), scratch.as<float>(),
                             dout.as<float>(), q.as<float>(), k.as<float>(), v.as<float>(), saved.as<float>(),
                             B, T, NH, NKV, HD);
    });
  }

  void swiglu_forward(Tensor out, Tensor gate, Tensor up) override {
    const std::size_t n = out.numel;
    need(gate, F, n, "swiglu gate");
    need(up, F, n, "swiglu up");
    need(out, F, n, "swiglu out");
    enqueue([=] { kc::swiglu_forward(out.as<float>(), gate.as<float>(), up.as<float>(), n); });
  }
  void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) override {
    const std::size_t n = dout.numel;
    for (const Tensor* t : {&dgate, &dup, &dout, &gate, &up}) need(*t, F, n, "swiglu operand");
    enqueue([=] {
      kc::swiglu_backward(dgate.as<float>(), dup.as<float>(), dout.as<float>(), gate.as<float>(),
                          up.as<float>(), n);
    });
  }
  void residual_forward(Tensor out, Tensor a, Tensor b) override {
    const std::size_t n = out.numel;
    for (const Tensor* t : {&out, &a, &b}) need(*t, F, n, "residual operand");
    enqueue([=] { kc::residual_forward(out.as<float>(), a.as<float>(), b.as<float>(), n); });
  }
  void residual_backward(Tensor da, Tensor db, Tensor dout) override {
    const std::size_t n = dout.numel;
    need(dout, F, n, "residual dout");
    if (da) need(da, F, n, "residual da");
    if (db) need(db, F, n, "residual db");
    enqueue([=] {
      kc::residual_backward(da ? da.as<float>() : nullptr, db ? db.as<float>() : nullptr, dout.as<float>(),
                            n);
    });
  }

  void cross_entropy(Tensor dlogits, Tensor losses, Tensor mean_loss, Tensor logits, Tensor targets, int N,
                     int V, float grad_scale) override {
    need(logits, F, sz(N, V), "logits");
    if (dlogits) need(dlogits, F, sz(N, V), "dlogits");
    need(losses, F, sz(N), "losses");
    need(mean_loss, F, 1, "mean loss");
    need(targets, DType::i32, sz(N), "targets");
    enqueue([=] {
      mean_loss.as<float>()[0] = kc::cross_entropy_forward_backward(
          dlogits ? dlogits.as<float>() : nullptr, losses.as<float>(), logits.as<float>(),
          targets.as<std::int32_t>(), N, V, grad_scale);
    });
  }

  void cast(Tensor out, Tensor in) override {
    STRATA_CHECK(out.numel == in.numel, "kernels: cast of ", in.numel, " elements into ", out.numel);
    const bool known = out.dtype == in.dtype || (in.dtype == DType::fp32 && dtype_is_float(out.dtype)) ||
                       (out.dtype == DType::fp32 && dtype_is_float(in.dtype));
    STRATA_CHECK(known, "kernels: no cast from ", dtype_name(in.dtype), " to ", dtype_name(out.dtype));
    const std::size_t n = in.numel;
    enqueue([=] {
      if (out.dtype == in.dtype) {
        std::memmove(out.data, in.data, in.bytes());
      } else if (in.dtype == DType::fp32 && out.dtype == DType::bf16) {
        kc::cast_f32_to_bf16(out.as<kc::bf16_t>(), in.as<float>(), n);
      } else if (in.dtype == DType::fp32 && out.dtype == DType::fp16) {
        kc::cast_f32_to_f16(out.as<kc::fp16_t>(), in.as<float>(), n);
      } else if (in.dtype == DType::bf16 && out.dtype == DType::fp32) {
        kc::cast_bf16_to_f32(out.as<float>(), in.as<kc::bf16_t>(), n);
      } else {  // fp16 -> fp32, the one left (checked above)
        kc::cast_f16_to_f32(out.as<float>(), in.as<kc::fp16_t>(), n);
      }
    });
  }
  void fill(Tensor x, float value) override {
    need(x, F, x.numel, "fill target");
    enqueue([=] {
      float* p = x.as<float>();
      for (std::size_t i = 0; i < x.numel; ++i) p[i] = value;
    });
  }
  void zero(Tensor x) override {
    STRATA_CHECK(x.numel == 0 || x.data, "kernels: zero of a null tensor");
    enqueue([=] {
      if (x.numel) std::memset(x.data, 0, x.bytes());
    });
  }
  void add(Tensor dst, Tensor src) override {
    need(dst, F, src.numel, "add dst");
    need(src, F, src.numel, "add src");
    enqueue([=] {
      float* d = dst.as<float>();
      const float* s = src.as<float>();
      for (std::size_t i = 0; i < src.numel; ++i) d[i] += s[i];
    });
  }
  void scale(Tensor x, float s) override {
    need(x, F, x.numel, "scale target");
    enqueue([=] { kc::scale(x.as<float>(), s, x.numel); });
  }
  void squared_norm(Tensor out, Tensor x) override {
    need(out, DType::u8, sizeof(double), "squared norm out");
    need(x, F, x.numel, "squared norm x");
    enqueue([=] {
      const double v = kc::squared_norm(x.as<float>(), x.numel);
      std::memcpy(out.data, &v, sizeof v);
    });
  }
  void nonfinite_check(Tensor out, Tensor x) override {
    need(out, DType::i32, 1, "non-finite flag");
    need(x, F, x.numel, "non-finite check x");
    enqueue([=] { out.as<std::int32_t>()[0] = kc::has_nonfinite(x.as<float>(), x.numel) ? 1 : 0; });
  }
  void adamw(Tensor p, Tensor g, Tensor m, Tensor v, Tensor p_out, const AdamW& hp, std::int64_t step,
             float grad_scale) override {
    const std::size_t n = p.numel;
    for (const Tensor* t : {&p, &g, &m, &v}) need(*t, F, n, "adamw operand");
    kc::AdamWParams k{.lr = hp.lr,
                      .beta1 = hp.beta1,
                      .beta2 = hp.beta2,
                      .eps = hp.eps,
                      .weight_decay = hp.weight_decay,
                      .adamw_mode = hp.adamw_mode,
                      .bias_correction = hp.bias_correction};
    const bool bf16_out = p_out && p_out.dtype == DType::bf16;
    if (p_out) STRATA_CHECK(p_out.numel >= n, "kernels: adamw p_out holds ", p_out.numel, " of ", n);
    enqueue([=] {
      kc::adamw_update(p.as<float>(), g.as<float>(), m.as<float>(), v.as<float>(),
                       bf16_out ? p_out.as<kc::bf16_t>() : nullptr, n, k, step, grad_scale);
      if (p_out && !bf16_out) {
        if (p_out.dtype == DType::fp16)
          kc::cast_f32_to_f16(p_out.as<kc::fp16_t>(), p.as<float>(), n);
        else
          std::memcpy(p_out.data, p.data, n * sizeof(float));
      }
    });
  }

 private:
  static constexpr DType F = DType::fp32;

  // Runs `fn` on the stream's worker thread after the work already enqueued there (Note [CPU ops on the
  // stream]). Operands were checked on the calling thread; an exception from fn surfaces at the stream's
  // next synchronize().
  template <typename Fn>
  void enqueue(Fn&& fn) {
    stream().host_fn(std::forward<Fn>(fn));
  }
  void rope_args(const Tensor& out, const Tensor& x, const Tensor& cos, const Tensor& sin, int B, int T,
                 int H, int HD) {
    need(out, F, sz(B, T, H, HD), "rope out");
    need(x, F, sz(B, T, H, HD), "rope x");
    need(cos, F, sz(T, HD / 2), "rope cos");
    need(sin, F, sz(T, HD / 2), "rope sin");
    enqueue([=] {});
  }
  static void attention_args(const Tensor& out_or_q, const Tensor& q, const Tensor& k, const Tensor& v, int B,
                             int T, int NH, int NKV, int HD) {
    need(out_or_q, F, sz(B, T, NH, HD), "attention (B,T,NH,HD) operand");
    need(q, F, sz(B, T, NH, HD), "attention q");
    need(k, F, sz(B, T, NKV, HD), "attention k");
    need(v, F, sz(B, T, NKV, HD), "attention v");
  }

  OpsCaps caps_;
};

}  // namespace

std::unique_ptr<Ops> make_cpu_ops(Device& dev, Stream& stream) {
  return std::make_unique<CpuOps>(dev, stream);
}

}  // namespace strata::kernels
