// The compute interface on the CPU: kernels/cpu's ops behind kernels/ops.h — the fp32 ones (the oracle),
// or with OpsOptions.matmul = bf16 their variants on bf16 activations (kernels/cpu/ops.h, "bf16
// activations"): bf16 activations, weights and activation gradients, fp32 parameter gradients and
// statistics, each bf16 output rounded once from fp32 — the dtypes and rounding points of the cuda path.
// Attention on bf16 is the fused one (attention_fused.h): no (B,NH,T,T) buffer, as cuDNN's on cuda.
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

#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

#include "core/arena_pin.h"
#include "core/error.h"
#include "kernels/cpu/attention_fused.h"
#include "kernels/cpu/nf4.h"
#include "kernels/cpu/ops.h"
#include "kernels/ops.h"
#include "kernels/workspace_standin.h"

namespace strata::kernels {
namespace {

// Note [Workspace stand-in] in kernels/workspace_standin.h: 0 unless a test binary sets it.
std::atomic<std::size_t> g_workspace_standin{0};

namespace kc = kernels::cpu;

// Attention by activation type: fp32 (attention.cpp, the (B,NH,T,T) probabilities saved) or bf16 (the fused
// one of attention_fused.h). Every other op is one kernels/cpu name overloaded on the activation type.
namespace typed {

void attention_forward(float* out, float* att, const float* q, const float* k, const float* v, int B, int T,
                       int NH, int NKV, int HD, int window, const std::int32_t* pos) {
  kc::attention_forward(out, att, q, k, v, B, T, NH, NKV, HD, window, pos);
}
// bf16: the fused attention (attention_fused.h): `saved` holds its row statistics (the lse).
void attention_forward(kc::bf16_t* out, float* saved, const kc::bf16_t* q, const kc::bf16_t* k,
                       const kc::bf16_t* v, int B, int T, int NH, int NKV, int HD, int window,
                       const std::int32_t* pos) {
  kc::attention_fused_forward(out, saved, q, k, v, B, T, NH, NKV, HD, window, pos);
}
void attention_backward(float* dq, float* dk, float* dv, float* scratch, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* att, int B, int T,
                        int NH, int NKV, int HD, int window, const std::int32_t* pos) {
  kc::attention_backward(dq, dk, dv, scratch, dout, q, k, v, out, att, B, T, NH, NKV, HD, window, pos);
}
// bf16: D = rowsum(dout * out) from the forward's out, which the caller keeps (kernels/ops.h).
void attention_backward(kc::bf16_t* dq, kc::bf16_t* dk, kc::bf16_t* dv, float* scratch,
                        const kc::bf16_t* dout, const kc::bf16_t* q, const kc::bf16_t* k, const kc::bf16_t* v,
                        const kc::bf16_t* out, const float* saved, int B, int T, int NH, int NKV, int HD,
                        int window, const std::int32_t* pos) {
  kc::attention_fused_backward(dq, dk, dv, scratch, dout, q, k, v, out, saved, B, T, NH, NKV, HD, window,
                               pos);
}

}  // namespace typed

class CpuOps final : public Ops {
 public:
  CpuOps(Device& dev, Stream& s, OpsOptions opts) : Ops(s, opts.role), bf16_(opts.matmul == DType::bf16) {
    STRATA_CHECK(dev.caps().host_addressable, "kernels: the CPU ops need host-addressable device memory");
    STRATA_CHECK(opts.matmul == DType::fp32 || opts.matmul == DType::bf16, "kernels: CPU matrix products in ",
                 dtype_name(opts.matmul), " are not implemented (fp32 or bf16)");
    caps_.backend = dev.caps().backend;
    if (!bf16_) {
      caps_.name = "cpu: fp32, OpenBLAS matrix products, oneTBB loops";
    } else {
      const std::string impl = kc::bf16_matmul_impl();
      caps_.name = "cpu: bf16 activations, fp32 accumulation, bf16 matrix products (" +
                   (impl.empty() ? std::string("widened to fp32 through OpenBLAS") : impl) +
                   "), oneTBB loops";
    }
    caps_.activation = bf16_ ? DType::bf16 : DType::fp32;
    caps_.fused_attention = bf16_;  // attention_fused.h on bf16 activations
    if (!opts.cpus.empty()) arena_ = std::make_shared<PinnedArena>(opts.cpus);
    // A stand-in for a library workspace (OpsOptions.workspace_bytes, else the process's, Note [Workspace
    // stand-in] in kernels/workspace_standin.h): taken from the device, never read or written.
    const std::size_t ws = opts.workspace_bytes.value_or(cpu_workspace_standin());
    if (opts.role == OpsRole::model && ws > 0) workspace_ = DeviceBuffer(dev, ws, "matrix-product workspace");
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
  std::string attention_path(int, int T, int, int, int, int window, bool documents) const override {
    const std::string band = (window > 0 && window < T ? detail::cat(", sliding window ", window) : "") +
                             (documents ? ", documents kept apart" : "");
    if (!bf16_) return "kernels/cpu attention, fp32, (B,NH,T,T) fp32 probabilities" + band;
    const char* products = kc::bf16_matmul_impl().empty()
                               ? "fp32 loops over bf16 values (no native bf16 matmul)"
                               : "oneDNN bf16 products";
    return std::string("kernels/cpu fused attention, bf16 activations, ") + products +
           ", no (B,NH,T,T) buffer" + band + (band.empty() ? "" : " (key blocks outside it skipped)");
  }
  // bf16: the fused attention's row statistics (saved), and its fp32 dk, dv sums for as many (batch,
  // kv head) tasks at once as the default budget holds (scratch). The window and documents change neither.
  AttentionSizes attention_sizes(int B, int T, int NH, int NKV, int HD, int window,
                                 bool documents) const override {
    if (!bf16_) return Ops::attention_sizes(B, T, NH, NKV, HD, window, documents);
    return {kc::attention_fused_saved(B, T, NH, HD), kc::attention_fused_scratch(B, T, NKV, HD)};
  }

  // Each model op is the kernels/cpu function for the activation type A (float or bf16_t).
  void do_embedding_forward(Tensor out, Tensor tokens, Tensor wte, int N, int C, int V) override {
    enqueue_typed([=]<typename A>(A*) {
      kc::embedding_forward(out.as<A>(), tokens.as<std::int32_t>(), wte.as<A>(), N, C, V);
    });
  }
  void do_embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int N, int C, int V) override {
    enqueue_typed([=]<typename A>(A*) {
      kc::embedding_backward(dwte.as<float>(), dout.as<A>(), tokens.as<std::int32_t>(), N, C, V);
    });
  }

  void do_rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, int N, int C, float eps,
                          float w_offset) override {
    enqueue_typed([=]<typename A>(A*) {
      kc::rmsnorm_forward(out.as<A>(), rstd.as<float>(), x.as<A>(), w.as<A>(), N, C, eps, w_offset);
    });
  }
  void do_rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, int N, int C,
                           float w_offset) override {
    enqueue_typed([=]<typename A>(A*) {
      kc::rmsnorm_backward(dx.as<A>(), dw ? dw.as<float>() : nullptr, dout.as<A>(), x.as<A>(), w.as<A>(),
                           rstd.as<float>(), N, C, w_offset);
    });
  }
  void do_bias_forward(Tensor out, Tensor b, int N, int OC) override {
    enqueue_typed([=]<typename A>(A*) { kc::bias_forward(out.as<A>(), b.as<A>(), N, OC); });
  }
  void do_bias_backward(Tensor db, Tensor dout, int N, int OC) override {
    enqueue_typed([=]<typename A>(A*) { kc::bias_backward(db.as<float>(), dout.as<A>(), N, OC); });
  }

  void do_linear_forward(Tensor out, Tensor x, Tensor w, int N, int IC, int OC) override {
    enqueue_typed([=]<typename A>(A*) { kc::linear_forward(out.as<A>(), x.as<A>(), w.as<A>(), N, IC, OC); });
  }
  void do_linear_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, int N, int IC,
                          int OC) override {
    enqueue_typed([=]<typename A>(A*) {
      kc::linear_backward(dx ? dx.as<A>() : nullptr, dw ? dw.as<float>() : nullptr, dout.as<A>(), x.as<A>(),
                          w.as<A>(), N, IC, OC);
    });
  }

  void do_rope_cache(Tensor cos, Tensor sin, int T, int HD, std::vector<float> inv_freq) override {
    enqueue(
        [=, f = std::move(inv_freq)] { kc::rope_cache(cos.as<float>(), sin.as<float>(), T, HD, f.data()); });
  }
  void do_rope_forward(Tensor out, Tensor x, Tensor cos, Tensor sin, int B, int T, int H, int HD,
                       Tensor pos) override {
    enqueue_typed([=]<typename A>(A*) {
      kc::rope_forward(out.as<A>(), x.as<A>(), cos.as<float>(), sin.as<float>(), B, T, H, HD,
                       pos.as<std::int32_t>());
    });
  }
  void do_rope_backward(Tensor dx, Tensor dout, Tensor cos, Tensor sin, int B, int T, int H, int HD,
                        Tensor pos) override {
    enqueue_typed([=]<typename A>(A*) {
      kc::rope_backward(dx.as<A>(), dout.as<A>(), cos.as<float>(), sin.as<float>(), B, T, H, HD,
                        pos.as<std::int32_t>());
    });
  }

  void do_attention_forward(Tensor out, Tensor saved, Tensor q, Tensor k, Tensor v, int B, int T, int NH,
                            int NKV, int HD, int window, Tensor pos) override {
    enqueue_typed([=]<typename A>(A*) {
      typed::attention_forward(out.as<A>(), saved.as<float>(), q.as<A>(), k.as<A>(), v.as<A>(), B, T, NH, NKV,
                               HD, window, pos.as<std::int32_t>());
    });
  }
  void do_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor scratch, Tensor dout, Tensor q, Tensor k,
                             Tensor v, Tensor out, Tensor saved, int B, int T, int NH, int NKV, int HD,
                             int window, Tensor pos) override {
    enqueue_typed([=]<typename A>(A*) {
      typed::attention_backward(dq.as<A>(), dk.as<A>(), dv.as<A>(), scratch.as<float>(), dout.as<A>(),
                                q.as<A>(), k.as<A>(), v.as<A>(), out.as<A>(), saved.as<float>(), B, T, NH,
                                NKV, HD, window, pos.as<std::int32_t>());
    });
  }

  void do_swiglu_forward(Tensor out, Tensor gate, Tensor up) override {
    const std::size_t n = out.numel;
    enqueue_typed([=]<typename A>(A*) { kc::swiglu_forward(out.as<A>(), gate.as<A>(), up.as<A>(), n); });
  }
  void do_swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) override {
    const std::size_t n = dout.numel;
    enqueue_typed([=]<typename A>(A*) {
      kc::swiglu_backward(dgate.as<A>(), dup.as<A>(), dout.as<A>(), gate.as<A>(), up.as<A>(), n);
    });
  }
  void do_geglu_forward(Tensor out, Tensor gate, Tensor up) override {
    const std::size_t n = out.numel;
    enqueue_typed([=]<typename A>(A*) { kc::geglu_forward(out.as<A>(), gate.as<A>(), up.as<A>(), n); });
  }
  void do_geglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) override {
    const std::size_t n = dout.numel;
    enqueue_typed([=]<typename A>(A*) {
      kc::geglu_backward(dgate.as<A>(), dup.as<A>(), dout.as<A>(), gate.as<A>(), up.as<A>(), n);
    });
  }
  void do_residual_forward(Tensor out, Tensor a, Tensor b) override {
    const std::size_t n = out.numel;
    enqueue_typed([=]<typename A>(A*) { kc::residual_forward(out.as<A>(), a.as<A>(), b.as<A>(), n); });
  }
  void do_residual_backward(Tensor da, Tensor db, Tensor dout) override {
    const std::size_t n = dout.numel;
    enqueue_typed([=]<typename A>(A*) {
      kc::residual_backward(da ? da.as<A>() : nullptr, db ? db.as<A>() : nullptr, dout.as<A>(), n);
    });
  }

  void do_dropout(Tensor out, Tensor in, double p, std::uint64_t key) override {
    const std::size_t n = in.numel;
    enqueue_typed([=]<typename A>(A*) { kc::dropout(out.as<A>(), in.as<A>(), n, p, key); });
  }

  void do_cross_entropy(Tensor dlogits, Tensor losses, Tensor mean_loss, Tensor logits, Tensor targets, int N,
                        int V, float grad_scale, int n_valid) override {
    enqueue_typed([=]<typename A>(A*) {
      mean_loss.as<float>()[0] = kc::cross_entropy_forward_backward(
          dlogits ? dlogits.as<A>() : nullptr, losses.as<float>(), logits.as<A>(), targets.as<std::int32_t>(),
          N, V, grad_scale, n_valid);
    });
  }

  void do_dequantize_nf4(Tensor out, const Nf4Blocks& q) override {
    enqueue([=] {
      const std::size_t n = out.numel, nblocks = kc::nf4_blocks(n, q.blocksize);
      std::vector<float> absmax(nblocks);
      if (q.double_quant)
        kc::dequantize_nf4_absmax(static_cast<const std::uint8_t*>(q.absmax),
                                  static_cast<const float*>(q.absmax2), q.offset, nblocks, absmax.data());
      else
        std::memcpy(absmax.data(), q.absmax, nblocks * sizeof(float));
      const auto* codes = static_cast<const std::uint8_t*>(q.codes);
      if (out.dtype == DType::fp32) {
        kc::dequantize_nf4(codes, absmax.data(), n, q.blocksize, out.as<float>());
        return;
      }
      // bf16: tiles of whole block pairs (a tile starts on a byte and a block), each through fp32.
      const std::size_t tile = 64 * 2 * q.blocksize;
      std::vector<float> f(std::min(n, tile));
      for (std::size_t i = 0; i < n; i += tile) {
        const std::size_t len = std::min(tile, n - i);
        kc::dequantize_nf4(codes + i / 2, absmax.data() + i / q.blocksize, len, q.blocksize, f.data());
        kc::cast_f32_to_bf16(out.as<kc::bf16_t>() + i, f.data(), len);
      }
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
  // x is fp32, or bf16 in the activation dtype (Ops::scale): rounded once to it.
  void do_scale(Tensor x, float s) override {
    if (x.dtype == DType::bf16)
      enqueue([=] { kc::scale(x.as<kc::bf16_t>(), s, x.numel); });
    else
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
  // Enqueues fn(static_cast<A*>(nullptr)) with A the activation type: float, or bf16_t with bf16
  // activations.
  template <typename Fn>
  void enqueue_typed(Fn&& fn) {
    if (bf16_)
      enqueue([f = std::forward<Fn>(fn)] { f(static_cast<kc::bf16_t*>(nullptr)); });
    else
      enqueue([f = std::forward<Fn>(fn)] { f(static_cast<float*>(nullptr)); });
  }

  bool bf16_ = false;  // bf16 activations (OpsOptions.matmul == bf16): kernels/cpu's bf16 variants
  OpsCaps caps_;
  DeviceBuffer workspace_;  // the stand-in workspace (model role), or empty
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

void set_cpu_workspace_standin(std::size_t bytes) {
  g_workspace_standin.store(bytes, std::memory_order_relaxed);
}

std::size_t cpu_workspace_standin() {
  return g_workspace_standin.load(std::memory_order_relaxed);
}

}  // namespace strata::kernels
