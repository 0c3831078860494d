// strata/kernels/cpu/attention_bf16.cpp: causal grouped-query attention whose four products take bf16
// operands and accumulate in fp32 (Note [bf16 matrix products on the CPU] in linear_bf16.cpp), for the
// host backend's bf16 training; attention.cpp's fp32 functions stay the oracle and the fallback.
//
// The work is split by (batch, key/value head): one oneTBB task computes every query head of its group, in
// head order, with single-threaded oneDNN products (Note [Concurrent products] in bf16_impl.h), so dk and dv
// — sums over the group's heads — are reduced in a fixed order and the result does not depend on the thread
// count. The softmax and its gradient are attention.cpp's row passes, in fp32, with the 1/sqrt(HD) scale
// applied to the scores in that pass (the fp32 path folds it into the product). The probabilities and the
// score gradients are rounded to bf16 for the products that read them, as are q, k, v and dout.
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/attention_impl.h"
#include "kernels/cpu/bf16_impl.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/parallel_impl.h"

namespace strata::kernels::cpu {

#ifdef STRATA_WITH_DNNL
namespace {

using dim = dnnl::memory::dim;
using dims = dnnl::memory::dims;
using dt = dnnl::memory::data_type;
using impl::Product;

// A (rows, cols) matrix at stride ld (row-major), or its transpose: (cols, rows) read column-wise.
dnnl::memory::desc view(dim rows, dim cols, dim ld, bool transposed, dt type) {
  return transposed ? dnnl::memory::desc({cols, rows}, type, dims{1, ld})
                    : dnnl::memory::desc({rows, cols}, type, dims{ld, 1});
}

struct Shape {
  int B, T, NH, NKV, HD;
  std::size_t q_at(std::size_t b, std::size_t h) const { return b * T * NH * HD + h * HD; }
  std::size_t kv_at(std::size_t b, std::size_t g) const { return b * T * NKV * HD + g * HD; }
  std::size_t att_at(std::size_t b, std::size_t h) const { return (b * NH + h) * std::size_t(T) * T; }
  std::size_t q_numel() const { return std::size_t(B) * T * NH * HD; }
  std::size_t kv_numel() const { return std::size_t(B) * T * NKV * HD; }
  // The (T, HD) views of one head of q / dout (stride NH * HD) and of k / v (stride NKV * HD), and a
  // (T, T) block; `transposed` reads the view column-wise.
  dnnl::memory::desc q_head(dt type) const { return view(T, HD, dim(NH) * HD, false, type); }
  dnnl::memory::desc kv_head(bool transposed, dt type = dt::bf16) const {
    return view(T, HD, dim(NKV) * HD, transposed, type);
  }
  dnnl::memory::desc block(bool transposed, dt type) const { return view(T, T, T, transposed, type); }
};

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
  for (std::size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

}  // namespace

void attention_forward_bf16(float* out, float* att, const float* q, const float* k, const float* v, int B,
                            int T, int NH, int NKV, int HD) {
  STRATA_CHECK(NKV > 0 && NH % NKV == 0 && HD > 0, "attention_forward_bf16: heads ", NH, "/", NKV, " x ", HD);
  if (bf16_matmul_impl().empty()) return attention_forward(out, att, q, k, v, B, T, NH, NKV, HD);
  const Shape sh{B, T, NH, NKV, HD};
  const Rounded r(sh, q, k, v);
  // scores (T, T) = q_h (T, HD) k_g^T; out_h (T, HD) = att (T, T) v_g (T, HD).
  const Product scores(sh.q_head(dt::bf16), sh.kv_head(true), sh.block(false, dt::f32), false);
  const Product weighted(sh.block(false, dt::bf16), sh.kv_head(false), sh.q_head(dt::f32), false);
  const float scale = float(1.0 / std::sqrt(double(HD)));
  const std::size_t G = std::size_t(NH / NKV);
  impl::parallel_for_each_index(std::size_t(B) * NKV, 1, [&](std::size_t task) {
    const std::size_t b = task / std::size_t(NKV), g = task % std::size_t(NKV);
    thread_local std::vector<bf16_t> ab;
    for (std::size_t h = g * G; h < (g + 1) * G; ++h) {
      float* a = att + sh.att_at(b, h);
      scores.run(r.q.data() + sh.q_at(b, h), r.k.data() + sh.kv_at(b, g), a);
      softmax_rows(a, T, scale);
      round_block(ab, a, std::size_t(T) * T);
      weighted.run(ab.data(), r.v.data() + sh.kv_at(b, g), out + sh.q_at(b, h));
    }
  });
}

void attention_backward_bf16(float* dq, float* dk, float* dv, float* scratch, const float* dout,
                             const float* q, const float* k, const float* v, const float* att, int B, int T,
                             int NH, int NKV, int HD) {
  STRATA_CHECK(NKV > 0 && NH % NKV == 0 && HD > 0, "attention_backward_bf16: heads ", NH, "/", NKV, " x ",
               HD);
  if (bf16_matmul_impl().empty())
    return attention_backward(dq, dk, dv, scratch, dout, q, k, v, att, B, T, NH, NKV, HD);
  const Shape sh{B, T, NH, NKV, HD};
  const Rounded r(sh, q, k, v, dout);
  // da (T, T) = dout_h v_g^T; dq_h = dp (T, T) k_g; dk_g += dp^T q_h; dv_g += a^T dout_h.
  const Product da(sh.q_head(dt::bf16), sh.kv_head(true), sh.block(false, dt::f32), false);
  const Product dq_p(sh.block(false, dt::bf16), sh.kv_head(false), sh.q_head(dt::f32), false);
  const Product dkv_p(sh.block(true, dt::bf16), sh.q_head(dt::bf16), sh.kv_head(false, dt::f32), true);
  const float scale = float(1.0 / std::sqrt(double(HD)));
  const std::size_t G = std::size_t(NH / NKV), ldkv = std::size_t(NKV) * HD;
  impl::parallel_for_each_index(std::size_t(B) * NKV, 1, [&](std::size_t task) {
    const std::size_t b = task / std::size_t(NKV), g = task % std::size_t(NKV);
    // dk_g and dv_g are written: clear them, then add the group's heads in head order.
    for (std::size_t row = 0; row < std::size_t(T); ++row) {
      std::memset(dk + sh.kv_at(b, g) + row * ldkv, 0, std::size_t(HD) * sizeof(float));
      std::memset(dv + sh.kv_at(b, g) + row * ldkv, 0, std::size_t(HD) * sizeof(float));
    }
    thread_local std::vector<bf16_t> pb, ab;
    for (std::size_t h = g * G; h < (g + 1) * G; ++h) {
      const float* a = att + sh.att_at(b, h);
      float* dp = scratch + sh.att_at(b, h);
      da.run(r.dout.data() + sh.q_at(b, h), r.v.data() + sh.kv_at(b, g), dp);
      softmax_grad_rows(dp, a, T, scale);
      round_block(pb, dp, std::size_t(T) * T);
      round_block(ab, a, std::size_t(T) * T);
      dq_p.run(pb.data(), r.k.data() + sh.kv_at(b, g), dq + sh.q_at(b, h));
      dkv_p.run(pb.data(), r.q.data() + sh.q_at(b, h), dk + sh.kv_at(b, g));
      dkv_p.run(ab.data(), r.dout.data() + sh.q_at(b, h), dv + sh.kv_at(b, g));
    }
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

}  // namespace strata::kernels::cpu
