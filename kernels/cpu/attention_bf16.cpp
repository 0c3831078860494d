// strata/kernels/cpu/attention_bf16.cpp: causal grouped-query attention whose four products take bf16
// operands and accumulate in fp32 (Note [bf16 matrix products on the CPU] in linear_bf16.cpp), for the
// host backend's bf16 training; attention.cpp's fp32 functions stay the oracle and the fallback. Two forms:
// on fp32 tensors (the operands rounded to bf16 here) and on bf16 tensors (bf16 activations: the operands
// are bf16 already, and out, dq, dk, dv are rounded to bf16 once).
//
// The work is split by (batch, key/value head): one oneTBB task computes every query head of its group, in
// head order, with single-threaded oneDNN products (Note [Concurrent products] in bf16_impl.h), so dk and dv
// — sums over the group's heads — are reduced in a fixed order and the result does not depend on the thread
// count. The softmax and its gradient are attention.cpp's row passes, in fp32, with the 1/sqrt(HD) scale
// applied to the scores in that pass (the fp32 path folds it into the product). The probabilities and the
// score gradients are rounded to bf16 for the products that read them, as are q, k, v and dout.
//
// Rounding points of the bf16 form: out and dq are products whose result is final, so oneDNN writes them
// as bf16 (rounded once from its fp32 sum); dk and dv add a product per head of the group, so a task sums
// them in fp32 buffers of its own and rounds them at the end. Without a native bf16 matmul, each task
// widens its group's q, k, v (and dout) into buffers of its own (exact), runs the fp32 attention on them
// and rounds its outputs once: no fp32 copy of a whole tensor either way.
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/attention_impl.h"
#include "kernels/cpu/bf16_impl.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/ops_impl.h"
#include "kernels/cpu/parallel_impl.h"

namespace strata::kernels::cpu {
namespace {

void check_heads(const char* op, int NH, int NKV, int HD) {
  STRATA_CHECK(NKV > 0 && NH % NKV == 0 && HD > 0, op, ": heads ", NH, "/", NKV, " x ", HD);
}

// Element offsets of one head in q / dout (B, T, NH, HD), k / v (B, T, NKV, HD) and att (B, NH, T, T).
struct Shape {
  int B, T, NH, NKV, HD;
  std::size_t G() const { return std::size_t(NH / NKV); }  // query heads per key/value head
  std::size_t q_at(std::size_t b, std::size_t h) const { return b * T * NH * HD + h * HD; }
  std::size_t kv_at(std::size_t b, std::size_t g) const { return b * T * NKV * HD + g * HD; }
  std::size_t att_at(std::size_t b, std::size_t h) const { return (b * NH + h) * std::size_t(T) * T; }
  std::size_t q_numel() const { return std::size_t(B) * T * NH * HD; }
  std::size_t kv_numel() const { return std::size_t(B) * T * NKV * HD; }
};

// ---- without a native bf16 matmul: the fp32 attention on one group's widened operands ----

// A group's rows of a (B, T, H, HD) tensor — `heads` heads from `at`, a row every `ld` elements — and the
// (T, heads, HD) dense fp32 copy a task works on.
struct GroupRows {
  std::size_t at, ld, width;  // width = heads * HD
  void widen(float* dst, const bf16_t* src, int T) const {
    for (std::size_t t = 0; t < std::size_t(T); ++t)
      impl::widen_bf16(dst + t * width, src + at + t * ld, width);
  }
  void narrow(bf16_t* dst, const float* src, int T) const {
    for (std::size_t t = 0; t < std::size_t(T); ++t)
      impl::narrow_bf16(dst + at + t * ld, src + t * width, width);
  }
};

GroupRows q_rows(const Shape& sh, std::size_t b, std::size_t g) {
  return {sh.q_at(b, g * sh.G()), std::size_t(sh.NH) * sh.HD, sh.G() * sh.HD};
}
GroupRows kv_rows(const Shape& sh, std::size_t b, std::size_t g) {
  return {sh.kv_at(b, g), std::size_t(sh.NKV) * sh.HD, std::size_t(sh.HD)};
}

// Buffers are the task's own (not the thread's): the fp32 attention runs oneTBB loops, during which this
// thread may start another task.
void forward_widened(bf16_t* out, float* att, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                     const Shape& sh) {
  impl::parallel_for_each_index(std::size_t(sh.B) * sh.NKV, 1, [&](std::size_t task) {
    const std::size_t b = task / std::size_t(sh.NKV), g = task % std::size_t(sh.NKV);
    const GroupRows qr = q_rows(sh, b, g), kr = kv_rows(sh, b, g);
    std::vector<float> qf(sh.T * qr.width), of(qf.size()), kf(sh.T * kr.width), vf(kf.size());
    qr.widen(qf.data(), q, sh.T);
    kr.widen(kf.data(), k, sh.T);
    kr.widen(vf.data(), v, sh.T);
    attention_forward(of.data(), att + sh.att_at(b, g * sh.G()), qf.data(), kf.data(), vf.data(), 1, sh.T,
                      int(sh.G()), 1, sh.HD);
    qr.narrow(out, of.data(), sh.T);
  });
}

void backward_widened(bf16_t* dq, bf16_t* dk, bf16_t* dv, float* scratch, const bf16_t* dout, const bf16_t* q,
                      const bf16_t* k, const bf16_t* v, const float* att, const Shape& sh) {
  impl::parallel_for_each_index(std::size_t(sh.B) * sh.NKV, 1, [&](std::size_t task) {
    const std::size_t b = task / std::size_t(sh.NKV), g = task % std::size_t(sh.NKV);
    const GroupRows qr = q_rows(sh, b, g), kr = kv_rows(sh, b, g);
    std::vector<float> qf(sh.T * qr.width), df(qf.size()), dqf(qf.size()), kf(sh.T * kr.width), vf(kf.size()),
        dkf(kf.size()), dvf(kf.size());
    qr.widen(qf.data(), q, sh.T);
    qr.widen(df.data(), dout, sh.T);
    kr.widen(kf.data(), k, sh.T);
    kr.widen(vf.data(), v, sh.T);
    const std::size_t h0 = g * sh.G();
    attention_backward(dqf.data(), dkf.data(), dvf.data(), scratch + sh.att_at(b, h0), df.data(), qf.data(),
                       kf.data(), vf.data(), att + sh.att_at(b, h0), 1, sh.T, int(sh.G()), 1, sh.HD);
    qr.narrow(dq, dqf.data(), sh.T);
    kr.narrow(dk, dkf.data(), sh.T);
    kr.narrow(dv, dvf.data(), sh.T);
  });
}

#ifdef STRATA_WITH_DNNL

using dim = dnnl::memory::dim;
using dims = dnnl::memory::dims;
using dt = dnnl::memory::data_type;
using impl::Product;

// A (rows, cols) matrix at stride ld (row-major), or its transpose: (cols, rows) read column-wise.
dnnl::memory::desc view(dim rows, dim cols, dim ld, bool transposed, dt type) {
  return transposed ? dnnl::memory::desc({cols, rows}, type, dims{1, ld})
                    : dnnl::memory::desc({rows, cols}, type, dims{ld, 1});
}

// The (T, HD) views of one head of q / dout (stride NH * HD) and of k / v (stride NKV * HD), a dense
// (T, HD) buffer, and a (T, T) block; `transposed` reads the view column-wise.
dnnl::memory::desc q_head(const Shape& sh, dt type) {
  return view(sh.T, sh.HD, dim(sh.NH) * sh.HD, false, type);
}
dnnl::memory::desc kv_head(const Shape& sh, bool transposed, dt type = dt::bf16) {
  return view(sh.T, sh.HD, dim(sh.NKV) * sh.HD, transposed, type);
}
dnnl::memory::desc dense_head(const Shape& sh, dt type) {
  return view(sh.T, sh.HD, sh.HD, false, type);
}
dnnl::memory::desc block(const Shape& sh, bool transposed, dt type) {
  return view(sh.T, sh.T, sh.T, transposed, type);
}

// The operands every product reads, rounded to bf16 once per call: q, k, v and (backward) dout.
struct Rounded {
  std::vector<bf16_t> q, k, v, dout;
  Rounded(const Shape& sh, const float* q_, const float* k_, const float* v_, const float* dout_ = nullptr)
      : q(sh.q_numel()), k(sh.kv_numel()), v(sh.kv_numel()), dout(dout_ ? sh.q_numel() : 0) {
    impl::round_to_bf16(q.data(), q_, q.size());
    impl::round_to_bf16(k.data(), k_, k.size());
    impl::round_to_bf16(v.data(), v_, v.size());
    if (dout_) impl::round_to_bf16(dout.data(), dout_, dout.size());
  }
};

// The row passes over one (T, T) block (attention_impl.h), with the 1/sqrt(HD) scale applied here.
void softmax_rows(float* att, int T, float scale) {
  for (std::size_t t = 0; t < std::size_t(T); ++t)
    impl::causal_softmax_row(att + t * T, t, std::size_t(T), scale);
}

void softmax_grad_rows(float* dp, const float* att, int T, float scale) {
  for (std::size_t t = 0; t < std::size_t(T); ++t)
    impl::causal_softmax_grad_row(dp + t * T, att + t * T, t, std::size_t(T), scale);
}

// dst (n) = bf16(src), on the calling thread (one task's block).
void round_block(std::vector<bf16_t>& dst, const float* src, std::size_t n) {
  dst.resize(n);
  impl::narrow_bf16(dst.data(), src, n);
}

// The product C [+]= A B for these views, if oneDNN has a native one (else the caller falls back).
std::optional<Product> native_product(const dnnl::memory::desc& a, const dnnl::memory::desc& b,
                                      const dnnl::memory::desc& c, bool accumulate) {
  try {
    std::optional<Product> p(std::in_place, a, b, c, accumulate);
    if (p->native()) return p;
  } catch (const dnnl::error&) {
  }
  return std::nullopt;
}

// The forward's two products per head: scores (T, T) = q_h (T, HD) k_g^T; out_h (T, HD) = att (T, T) v_g
// (out fp32 or bf16, as `out_type`). Null when either is not native.
struct ForwardProducts {
  std::optional<Product> scores, weighted;
  ForwardProducts(const Shape& sh, dt out_type)
      : scores(native_product(q_head(sh, dt::bf16), kv_head(sh, true), block(sh, false, dt::f32), false)),
        weighted(
            native_product(block(sh, false, dt::bf16), kv_head(sh, false), q_head(sh, out_type), false)) {}
  explicit operator bool() const { return scores && weighted; }
};

// Every head of each (batch, key/value head) task: att = softmax(scale q k^T) (fp32, saved), out = att v.
template <typename Out>
void forward_heads(const ForwardProducts& p, Out* out, float* att, const bf16_t* q, const bf16_t* k,
                   const bf16_t* v, const Shape& sh) {
  const float scale = float(1.0 / std::sqrt(double(sh.HD)));
  impl::parallel_for_each_index(std::size_t(sh.B) * sh.NKV, 1, [&](std::size_t task) {
    const std::size_t b = task / std::size_t(sh.NKV), g = task % std::size_t(sh.NKV);
    thread_local std::vector<bf16_t> ab;
    for (std::size_t h = g * sh.G(); h < (g + 1) * sh.G(); ++h) {
      float* a = att + sh.att_at(b, h);
      p.scores->run(q + sh.q_at(b, h), k + sh.kv_at(b, g), a);
      softmax_rows(a, sh.T, scale);
      round_block(ab, a, std::size_t(sh.T) * sh.T);
      p.weighted->run(ab.data(), v + sh.kv_at(b, g), out + sh.q_at(b, h));
    }
  });
}

// The backward's products per head: da (T, T) = dout_h v_g^T; dq_h = dp (T, T) k_g (dq fp32 or bf16, as
// `dq_type`); dk_g += dp^T q_h; dv_g += a^T dout_h (into `dkv`: dk, dv in place, or a task's dense buffer).
struct BackwardProducts {
  std::optional<Product> da, dq, dkv;
  BackwardProducts(const Shape& sh, dt dq_type, const dnnl::memory::desc& dkv_desc)
      : da(native_product(q_head(sh, dt::bf16), kv_head(sh, true), block(sh, false, dt::f32), false)),
        dq(native_product(block(sh, false, dt::bf16), kv_head(sh, false), q_head(sh, dq_type), false)),
        dkv(native_product(block(sh, true, dt::bf16), q_head(sh, dt::bf16), dkv_desc, true)) {}
  explicit operator bool() const { return da && dq && dkv; }
};

// One head h of group g, batch b: the score gradients into scratch, dq_h written, dk_g and dv_g added to.
void backward_head(const BackwardProducts& p, void* dq, float* dk, float* dv, float* scratch,
                   const bf16_t* dout, const bf16_t* q, const bf16_t* k, const bf16_t* v, const float* att,
                   const Shape& sh, std::size_t b, std::size_t g, std::size_t h) {
  const float scale = float(1.0 / std::sqrt(double(sh.HD)));
  thread_local std::vector<bf16_t> pb, ab;
  const float* a = att + sh.att_at(b, h);
  float* dp = scratch + sh.att_at(b, h);
  p.da->run(dout + sh.q_at(b, h), v + sh.kv_at(b, g), dp);
  softmax_grad_rows(dp, a, sh.T, scale);
  round_block(pb, dp, std::size_t(sh.T) * sh.T);
  round_block(ab, a, std::size_t(sh.T) * sh.T);
  p.dq->run(pb.data(), k + sh.kv_at(b, g), dq);
  p.dkv->run(pb.data(), q + sh.q_at(b, h), dk);
  p.dkv->run(ab.data(), dout + sh.q_at(b, h), dv);
}

#endif  // STRATA_WITH_DNNL

}  // namespace

// ---- fp32 tensors, operands rounded to bf16 here ----

#ifdef STRATA_WITH_DNNL

void attention_forward_bf16(float* out, float* att, const float* q, const float* k, const float* v, int B,
                            int T, int NH, int NKV, int HD) {
  check_heads("attention_forward_bf16", NH, NKV, HD);
  if (bf16_matmul_impl().empty()) return attention_forward(out, att, q, k, v, B, T, NH, NKV, HD);
  const Shape sh{B, T, NH, NKV, HD};
  const ForwardProducts p(sh, dt::f32);
  if (!p) return attention_forward(out, att, q, k, v, B, T, NH, NKV, HD);
  const Rounded r(sh, q, k, v);
  forward_heads(p, out, att, r.q.data(), r.k.data(), r.v.data(), sh);
}

void attention_backward_bf16(float* dq, float* dk, float* dv, float* scratch, const float* dout,
                             const float* q, const float* k, const float* v, const float* att, int B, int T,
                             int NH, int NKV, int HD) {
  check_heads("attention_backward_bf16", NH, NKV, HD);
  if (bf16_matmul_impl().empty())
    return attention_backward(dq, dk, dv, scratch, dout, q, k, v, att, B, T, NH, NKV, HD);
  const Shape sh{B, T, NH, NKV, HD};
  const BackwardProducts p(sh, dt::f32, kv_head(sh, false, dt::f32));
  if (!p) return attention_backward(dq, dk, dv, scratch, dout, q, k, v, att, B, T, NH, NKV, HD);
  const Rounded r(sh, q, k, v, dout);
  const std::size_t ldkv = std::size_t(NKV) * HD;
  impl::parallel_for_each_index(std::size_t(B) * NKV, 1, [&](std::size_t task) {
    const std::size_t b = task / std::size_t(NKV), g = task % std::size_t(NKV);
    // dk_g and dv_g are written: clear them, then add the group's heads in head order.
    for (std::size_t row = 0; row < std::size_t(T); ++row) {
      std::memset(dk + sh.kv_at(b, g) + row * ldkv, 0, std::size_t(HD) * sizeof(float));
      std::memset(dv + sh.kv_at(b, g) + row * ldkv, 0, std::size_t(HD) * sizeof(float));
    }
    for (std::size_t h = g * sh.G(); h < (g + 1) * sh.G(); ++h)
      backward_head(p, dq + sh.q_at(b, h), dk + sh.kv_at(b, g), dv + sh.kv_at(b, g), scratch, r.dout.data(),
                    r.q.data(), r.k.data(), r.v.data(), att, sh, b, g, h);
  });
}

#else  // without oneDNN: the fp32 attention (the OpenBLAS fallback of the bf16 products covers linear only)

void attention_forward_bf16(float* out, float* att, const float* q, const float* k, const float* v, int B,
                            int T, int NH, int NKV, int HD) {
  attention_forward(out, att, q, k, v, B, T, NH, NKV, HD);
}
void attention_backward_bf16(float* dq, float* dk, float* dv, float* scratch, const float* dout,
                             const float* q, const float* k, const float* v, const float* att, int B, int T,
                             int NH, int NKV, int HD) {
  attention_backward(dq, dk, dv, scratch, dout, q, k, v, att, B, T, NH, NKV, HD);
}

#endif

// ---- bf16 tensors (bf16 activations) ----

void attention_forward_bf16(bf16_t* out, float* att, const bf16_t* q, const bf16_t* k, const bf16_t* v, int B,
                            int T, int NH, int NKV, int HD) {
  check_heads("attention_forward_bf16", NH, NKV, HD);
  const Shape sh{B, T, NH, NKV, HD};
#ifdef STRATA_WITH_DNNL
  if (!bf16_matmul_impl().empty()) {
    const ForwardProducts p(sh, dt::bf16);
    if (p) return forward_heads(p, out, att, q, k, v, sh);
  }
#endif
  forward_widened(out, att, q, k, v, sh);
}

void attention_backward_bf16(bf16_t* dq, bf16_t* dk, bf16_t* dv, float* scratch, const bf16_t* dout,
                             const bf16_t* q, const bf16_t* k, const bf16_t* v, const float* att, int B,
                             int T, int NH, int NKV, int HD) {
  check_heads("attention_backward_bf16", NH, NKV, HD);
  const Shape sh{B, T, NH, NKV, HD};
#ifdef STRATA_WITH_DNNL
  if (!bf16_matmul_impl().empty()) {
    const BackwardProducts p(sh, dt::bf16, dense_head(sh, dt::f32));
    if (p) {
      const std::size_t n = std::size_t(T) * HD;
      impl::parallel_for_each_index(std::size_t(B) * NKV, 1, [&](std::size_t task) {
        const std::size_t b = task / std::size_t(NKV), g = task % std::size_t(NKV);
        // dk_g and dv_g: the group's heads added in head order into fp32 buffers, rounded once.
        thread_local std::vector<float> dkf, dvf;
        dkf.assign(n, 0.0f);
        dvf.assign(n, 0.0f);
        for (std::size_t h = g * sh.G(); h < (g + 1) * sh.G(); ++h)
          backward_head(p, dq + sh.q_at(b, h), dkf.data(), dvf.data(), scratch, dout, q, k, v, att, sh, b, g,
                        h);
        const GroupRows kr = kv_rows(sh, b, g);
        kr.narrow(dk, dkf.data(), T);
        kr.narrow(dv, dvf.data(), T);
      });
      return;
    }
  }
#endif
  backward_widened(dq, dk, dv, scratch, dout, q, k, v, att, sh);
}

}  // namespace strata::kernels::cpu
