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
#include <tbb/task_arena.h>

#include <cstring>
#include <memory>

#include "core/arena_pin.h"
#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/ops.h"

namespace strata::kernels {
namespace {

namespace kc = kernels::cpu;

class CpuOps final : public Ops {
 public:
  CpuOps(Device& dev, Stream& s, OpsOptions opts)
      : Ops(s, opts.role), bf16_matmul_(opts.matmul == DType::bf16) {
    STRATA_CHECK(dev.caps().host_addressable, "kernels: the CPU ops need host-addressable device memory");
    STRATA_CHECK(opts.matmul == DType::fp32 || opts.matmul == DType::bf16, "kernels: CPU matrix products in ",
                 dtype_name(opts.matmul), " are not implemented (fp32 or bf16)");
    caps_.backend = dev.caps().backend;
    if (!bf16_matmul_) {
      caps_.name = "cpu: fp32, OpenBLAS matrix products, oneTBB loops";
    } else {
      const std::string impl = kc::bf16_matmul_impl();
      caps_.name = "cpu: fp32 storage, bf16 matrix products (" +
                   (impl.empty() ? std::string("bf16-rounded through OpenBLAS") : impl) + "), oneTBB loops";
    }
    caps_.activation = DType::fp32;
    if (!opts.cpus.empty()) arena_ = std::make_shared<PinnedArena>(opts.cpus);
    // A stand-in for a library workspace (OpsOptions.workspace_bytes): taken from the device, never used.
    if (opts.role == OpsRole::model && opts.workspace_bytes.value_or(0) > 0)
      workspace_ = DeviceBuffer(dev, *opts.workspace_bytes, "matrix-product workspace");
  }
  // The work queued with this object may still be running on the stream: it ends before the object (and
  // before the stream, which its owner destroys after it).
  ~CpuOps() override {
    try {
      stream().synchronize();
    } catch (...) {
    }
  }
  const OpsCaps& caps() const override { return caps_; }
  std::size_t device_bytes() const override { return workspace_.size(); }
  std::string attention_path(int, int, int, int, int) const override {
    return bf16_matmul_ ? "kernels/cpu attention, bf16 products (B,NH,T,T) fp32 probabilities"
                        : "kernels/cpu attention, fp32 (B,NH,T,T) probabilities";
  }

  void do_embedding_forward(Tensor out, Tensor tokens, Tensor wte, int N, int C, int V) override {
    enqueue(
        [=] { kc::embedding_forward(out.as<float>(), tokens.as<std::int32_t>(), wte.as<float>(), N, C, V); });
  }
  void do_embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int N, int C, int V) override {
    enqueue([=] {
      kc::embedding_backward(dwte.as<float>(), dout.as<float>(), tokens.as<std::int32_t>(), N, C, V);
    });
  }

  void do_rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, int N, int C, float eps,
                          float w_offset) override {
    enqueue([=] {
      kc::rmsnorm_forward(out.as<float>(), rstd.as<float>(), x.as<float>(), w.as<float>(), N, C, eps,
                          w_offset);
    });
  }
  void do_rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, int N, int C,
                           float w_offset) override {
    enqueue([=] {
      kc::rmsnorm_backward(dx.as<float>(), dw.as<float>(), dout.as<float>(), x.as<float>(), w.as<float>(),
                           rstd.as<float>(), N, C, w_offset);
    });
  }
  void do_bias_forward(Tensor out, Tensor b, int N, int OC) override {
    enqueue([=] { kc::bias_forward(out.as<float>(), b.as<float>(), N, OC); });
  }
  void do_bias_backward(Tensor db, Tensor dout, int N, int OC) override {
    enqueue([=] { kc::bias_backward(db.as<float>(), dout.as<float>(), N, OC); });
  }

  void do_linear_forward(Tensor out, Tensor x, Tensor w, int N, int IC, int OC) override {
    const auto f = bf16_matmul_ ? kc::linear_forward_bf16 : kc::linear_forward;
    enqueue([=] { f(out.as<float>(), x.as<float>(), w.as<float>(), N, IC, OC); });
  }
  void do_linear_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, int N, int IC,
                          int OC) override {
    const auto f = bf16_matmul_ ? kc::linear_backward_bf16 : kc::linear_backward;
    enqueue([=] {
      f(dx ? dx.as<float>() : nullptr, dw.as<float>(), dout.as<float>(), x.as<float>(), w.as<float>(), N, IC,
        OC);
    });
  }

  void do_rope_cache(Tensor cos, Tensor sin, int T, int HD, std::vector<float> inv_freq) override {
    enqueue(
        [=, f = std::move(inv_freq)] { kc::rope_cache(cos.as<float>(), sin.as<float>(), T, HD, f.data()); });
  }
  void do_rope_forward(Tensor out, Tensor x, Tensor cos, Tensor sin, int B, int T, int H, int HD) override {
    enqueue([=] {
      kc::rope_forward(out.as<float>(), x.as<float>(), cos.as<float>(), sin.as<float>(), B, T, H, HD);
    });
  }
  void do_rope_backward(Tensor dx, Tensor dout, Tensor cos, Tensor sin, int B, int T, int H,
                        int HD) override {
    enqueue([=] {
      kc::rope_backward(dx.as<float>(), dout.as<float>(), cos.as<float>(), sin.as<float>(), B, T, H, HD);
    });
  }

  void do_attention_forward(Tensor out, Tensor saved, Tensor q, Tensor k, Tensor v, int B, int T, int NH,
                            int NKV, int HD) override {
    const auto f = bf16_matmul_ ? kc::attention_forward_bf16 : kc::attention_forward;
    enqueue([=] {
      f(out.as<float>(), saved.as<float>(), q.as<float>(), k.as<float>(), v.as<float>(), B, T, NH, NKV, HD);
    });
  }
  void do_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor scratch, Tensor dout, Tensor q, Tensor k,
                             Tensor v, Tensor saved, int B, int T, int NH, int NKV, int HD) override {
    const auto f = bf16_matmul_ ? kc::attention_backward_bf16 : kc::attention_backward;
    enqueue([=] {
      f(dq.as<float>(), dk.as<float>(), dv.as<float>(), scratch.as<float>(), dout.as<float>(), q.as<float>(),
        k.as<float>(), v.as<float>(), saved.as<float>(), B, T, NH, NKV, HD);
    });
  }

  void do_swiglu_forward(Tensor out, Tensor gate, Tensor up) override {
    const std::size_t n = out.numel;
    enqueue([=] { kc::swiglu_forward(out.as<float>(), gate.as<float>(), up.as<float>(), n); });
  }
  void do_swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) override {
    const std::size_t n = dout.numel;
    enqueue([=] {
      kc::swiglu_backward(dgate.as<float>(), dup.as<float>(), dout.as<float>(), gate.as<float>(),
                          up.as<float>(), n);
    });
  }
  void do_geglu_forward(Tensor out, Tensor gate, Tensor up) override {
    const std::size_t n = out.numel;
    enqueue([=] { kc::geglu_forward(out.as<float>(), gate.as<float>(), up.as<float>(), n); });
  }
  void do_geglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) override {
    const std::size_t n = dout.numel;
    enqueue([=] {
      kc::geglu_backward(dgate.as<float>(), dup.as<float>(), dout.as<float>(), gate.as<float>(),
                         up.as<float>(), n);
    });
  }
  void do_residual_forward(Tensor out, Tensor a, Tensor b) override {
    const std::size_t n = out.numel;
    enqueue([=] { kc::residual_forward(out.as<float>(), a.as<float>(), b.as<float>(), n); });
  }
  void do_residual_backward(Tensor da, Tensor db, Tensor dout) override {
    const std::size_t n = dout.numel;
    enqueue([=] {
      kc::residual_backward(da ? da.as<float>() : nullptr, db ? db.as<float>() : nullptr, dout.as<float>(),
                            n);
    });
  }

  void do_cross_entropy(Tensor dlogits, Tensor losses, Tensor mean_loss, Tensor logits, Tensor targets, int N,
                        int V, float grad_scale) override {
    enqueue([=] {
      mean_loss.as<float>()[0] = kc::cross_entropy_forward_backward(
          dlogits ? dlogits.as<float>() : nullptr, losses.as<float>(), logits.as<float>(),
          targets.as<std::int32_t>(), N, V, grad_scale);
    });
  }

  void do_cast(Tensor out, Tensor in) override {
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
      } else if (in.dtype == DType::fp16 && out.dtype == DType::fp32) {
        kc::cast_f16_to_f32(out.as<float>(), in.as<kc::fp16_t>(), n);
      } else if (in.dtype == DType::fp16 && out.dtype == DType::bf16) {
        kc::cast_f16_to_bf16(out.as<kc::bf16_t>(), in.as<kc::fp16_t>(), n);
      } else {  // bf16 -> fp16, the one left (checked above)
        kc::cast_bf16_to_f16(out.as<kc::fp16_t>(), in.as<kc::bf16_t>(), n);
      }
    });
  }
  void do_fill(Tensor x, float value) override {
    enqueue([=] {
      float* p = x.as<float>();
      for (std::size_t i = 0; i < x.numel; ++i) p[i] = value;
    });
  }
  void do_zero(Tensor x) override {
    enqueue([=] {
      if (x.numel) std::memset(x.data, 0, x.bytes());
    });
  }
  void do_add(Tensor dst, Tensor src) override {
    enqueue([=] {
      float* d = dst.as<float>();
      const float* s = src.as<float>();
      for (std::size_t i = 0; i < src.numel; ++i) d[i] += s[i];
    });
  }
  void do_scale(Tensor x, float s) override {
    enqueue([=] { kc::scale(x.as<float>(), s, x.numel); });
  }
  void do_squared_norm(Tensor out, Tensor x) override {
    enqueue([=] {
      const double v = kc::squared_norm(x.as<float>(), x.numel);
      std::memcpy(out.data, &v, sizeof v);
    });
  }
  void do_nonfinite_check(Tensor out, Tensor x) override {
    enqueue([=] { out.as<std::int32_t>()[0] = kc::has_nonfinite(x.as<float>(), x.numel) ? 1 : 0; });
  }
  void do_adamw(Tensor p, Tensor g, Tensor m, Tensor v, Tensor p_out, const AdamW& hp, std::int64_t step,
                float grad_scale) override {
    const std::size_t n = p.numel;
    const bool bf16_out = p_out && p_out.dtype == DType::bf16;
    enqueue([=] {
      kc::adamw_update(p.as<float>(), g.as<float>(), m.as<float>(), v.as<float>(),
                       bf16_out ? p_out.as<kc::bf16_t>() : nullptr, n, hp, step, grad_scale);
      if (p_out && !bf16_out) {
        if (p_out.dtype == DType::fp16)
          kc::cast_f32_to_f16(p_out.as<kc::fp16_t>(), p.as<float>(), n);
        else
          std::memcpy(p_out.data, p.data, n * sizeof(float));
      }
    });
  }

 private:
  // Runs `fn` on the stream's worker thread after the work already enqueued there (Note [CPU ops on the
  // stream]). Operands were checked on the calling thread; an exception from fn surfaces at the stream's
  // next synchronize().
  template <typename Fn>
  void enqueue(Fn&& fn) {
    if (!arena_) return stream().host_fn(std::forward<Fn>(fn));
    // The op's loops in the compute arena (its cpus); the arena outlives every op that reaches the stream.
    stream().host_fn([a = arena_, f = std::forward<Fn>(fn)]() mutable { a->arena.execute(f); });
  }

  bool bf16_matmul_ = false;  // linear ops through kernels/cpu/linear_bf16.cpp
  OpsCaps caps_;
  DeviceBuffer workspace_;  // OpsOptions.workspace_bytes (model role), or empty
  // OpsOptions.cpus: an arena of that many threads pinned to them (null: oneTBB's default arena).
  struct PinnedArena {
    explicit PinnedArena(const std::vector<int>& cpus)
        : arena(int(cpus.size())), pin(arena, cpus, "compute") {}
    tbb::task_arena arena;
    ArenaPin pin;  // after the arena: unobserves first
  };
  std::shared_ptr<PinnedArena> arena_;
};

}  // namespace

std::unique_ptr<Ops> make_cpu_ops(Device& dev, Stream& stream, OpsOptions opts) {
  return std::make_unique<CpuOps>(dev, stream, opts);
}

}  // namespace strata::kernels
