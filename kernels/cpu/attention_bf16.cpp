// strata/kernels/cpu/attention_bf16.cpp: causal grouped-query attention whose four products take bf16
// operands and accumulate in fp32 (Note [bf16 matrix products on the CPU] in linear_bf16.cpp), for the
// host backend's bf16 training; attention.cpp's fp32 functions stay the oracle and the fallback.
//
// The work is split by (batch, key/value head): one oneTBB task computes every query head of its group, in
// head order, with single-threaded oneDNN products (Note [Row blocks]), so dk and dv — sums over the
// group's heads — are reduced in a fixed order and the result does not depend on the thread count. The
// softmax and its gradient are attention.cpp's row passes, in fp32, with the 1/sqrt(HD) scale applied to
// the scores in that pass (the fp32 path folds it into the product). The probabilities and the score
// gradients are rounded to bf16 for the products that read them, as are q, k, v and dout.
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/attention_impl.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/parallel_impl.h"

#ifdef STRATA_WITH_DNNL
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace strata::kernels::cpu {

#ifdef STRATA_WITH_DNNL
namespace {

using dim = dnnl::memory::dim;
using dims = dnnl::memory::dims;
using dt = dnnl::memory::data_type;

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// A (rows, cols) matrix at stride ld (row-major), or its transpose: (cols, rows) read column-wise.
dnnl::memory::desc view(dim rows, dim cols, dim ld, bool transposed, dt type) {
  return transposed ? dnnl::memory::desc({cols, rows}, type, dims{1, ld})
                    : dnnl::memory::desc({rows, cols}, type, dims{ld, 1});
}

// One product shape of the attention: C (M, N) fp32 [+]= A B, A and B bf16 views.
struct Product {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  Product(const dnnl::memory::desc& a, const dnnl::memory::desc& b, const dnnl::memory::desc& c,
          bool accumulate) {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // Note [Concurrent products] in linear_bf16.cpp
    if (accumulate) {
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, engine());
    prim = dnnl::matmul(pd);
  }
  bool native() const { return std::strncmp(pd.impl_info_str(), "ref", 3) != 0; }
  void run(dnnl::stream& s, const bf16_t* a, const bf16_t* b, float* c) const {
    dnnl::memory am(pd.src_desc(), engine(), const_cast<bf16_t*>(a)),
        bm(pd.weights_desc(), engine(), const_cast<bf16_t*>(b)), cm(pd.dst_desc(), engine(), c);
    thread_local std::vector<char> pad;
    pad.resize(pd.scratchpad_desc().get_size());
    dnnl::memory sm(pd.scratchpad_desc(), engine(), pad.data());
    prim.execute(s,
                 {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}, {DNNL_ARG_SCRATCHPAD, sm}});
  }
};

void round_all(std::vector<bf16_t>& dst, const float* src, std::size_t n) {
  dst.resize(n);
  impl::parallel_for_range(n, impl::kElementGrain, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) dst[i] = f32_to_bf16(src[i]);
  });
}

struct Shape {
  int B, T, NH, NKV, HD;
  std::size_t q_at(std::size_t b, std::size_t h) const { return b * T * NH * HD + h * HD; }
  std::size_t kv_at(std::size_t b, std::size_t g) const { return b * T * NKV * HD + g * HD; }
  std::size_t att_at(std::size_t b, std::size_t h) const { return (b * NH + h) * std::size_t(T) * T; }
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

// Per task: a bf16 copy of one (T, T) block.
std::vector<bf16_t>& block_scratch(std::size_t n) {
  thread_local std::vector<bf16_t> v;
  v.resize(n);
  return v;
}

}  // namespace

bool attention_bf16_native(int T, int HD) {
  const dim t = T, hd = HD;
  try {
    const Product p(view(t, hd, hd, false, dt::bf16), view(t, hd, hd, true, dt::bf16),
                    view(t, t, t, false, dt::f32), false);
    return p.native();
  } catch (const dnnl::error&) {
    return false;
  }
}

void attention_forward_bf16(float* out, float* att, const float* q, const float* k, const float* v, int B,
                            int T, int NH, int NKV, int HD) {
  STRATA_CHECK(NKV > 0 && NH % NKV == 0 && HD > 0, "attention_forward_bf16: heads ", NH, "/", NKV, " x ", HD);
  if (!attention_bf16_native(T, HD)) return attention_forward(out, att, q, k, v, B, T, NH, NKV, HD);
  const Shape sh{B, T, NH, NKV, HD};
  const dim t = T, hd = HD, ldq = dim(NH) * HD, ldkv = dim(NKV) * HD;
  std::vector<bf16_t> qb, kb, vb;
  round_all(qb, q, std::size_t(B) * T * NH * HD);
  round_all(kb, k, std::size_t(B) * T * NKV * HD);
  round_all(vb, v, std::size_t(B) * T * NKV * HD);
  // scores (T, T) = q_h (T, HD) k_g^T; out_h (T, HD) = att (T, T) v_g (T, HD).
  const Product scores(view(t, hd, ldq, false, dt::bf16), view(t, hd, ldkv, true, dt::bf16),
                       view(t, t, t, false, dt::f32), false);
  const Product weighted(view(t, t, t, false, dt::bf16), view(t, hd, ldkv, false, dt::bf16),
                         view(t, hd, ldq, false, dt::f32), false);
  const float scale = float(1.0 / std::sqrt(double(HD)));
  const int G = NH / NKV;
  impl::parallel_for_each_index(std::size_t(B) * NKV, 1, [&](std::size_t task) {
    omp_set_num_threads(1);
    dnnl::stream s(engine());
    const std::size_t b = task / std::size_t(NKV), g = task % std::size_t(NKV);
    std::vector<bf16_t>& ab = block_scratch(std::size_t(T) * T);
    for (std::size_t h = g * G; h < (g + 1) * G; ++h) {
      float* a = att + sh.att_at(b, h);
      scores.run(s, qb.data() + sh.q_at(b, h), kb.data() + sh.kv_at(b, g), a);
      s.wait();
      softmax_rows(a, T, scale);
      for (std::size_t i = 0; i < ab.size(); ++i) ab[i] = f32_to_bf16(a[i]);
      weighted.run(s, ab.data(), vb.data() + sh.kv_at(b, g), out + sh.q_at(b, h));
      s.wait();
    }
  });
}

void attention_backward_bf16(float* dq, float* dk, float* dv, float* scratch, const float* dout,
                             const float* q, const float* k, const float* v, const float* att, int B, int T,
                             int NH, int NKV, int HD) {
  STRATA_CHECK(NKV > 0 && NH % NKV == 0 && HD > 0, "attention_backward_bf16: heads ", NH, "/", NKV, " x ",
               HD);
  if (!attention_bf16_native(T, HD))
    return attention_backward(dq, dk, dv, scratch, dout, q, k, v, att, B, T, NH, NKV, HD);
  const Shape sh{B, T, NH, NKV, HD};
  const dim t = T, hd = HD, ldq = dim(NH) * HD, ldkv = dim(NKV) * HD;
  std::vector<bf16_t> qb, kb, vb, db;
  round_all(qb, q, std::size_t(B) * T * NH * HD);
  round_all(kb, k, std::size_t(B) * T * NKV * HD);
  round_all(vb, v, std::size_t(B) * T * NKV * HD);
  round_all(db, dout, std::size_t(B) * T * NH * HD);
  // da (T, T) = dout_h v_g^T; dq_h = dp (T, T) k_g; dk_g += dp^T q_h; dv_g += a^T dout_h.
  const Product da(view(t, hd, ldq, false, dt::bf16), view(t, hd, ldkv, true, dt::bf16),
                   view(t, t, t, false, dt::f32), false);
  const Product dq_p(view(t, t, t, false, dt::bf16), view(t, hd, ldkv, false, dt::bf16),
                     view(t, hd, ldq, false, dt::f32), false);
  const Product dkv_p(view(t, t, t, true, dt::bf16), view(t, hd, ldq, false, dt::bf16),
                      view(t, hd, ldkv, false, dt::f32), true);
  const float scale = float(1.0 / std::sqrt(double(HD)));
  const int G = NH / NKV;
  impl::parallel_for_each_index(std::size_t(B) * NKV, 1, [&](std::size_t task) {
    omp_set_num_threads(1);
    dnnl::stream s(engine());
    const std::size_t b = task / std::size_t(NKV), g = task % std::size_t(NKV);
    // dk_g and dv_g are written: clear them, then add the group's heads in head order.
    for (std::size_t r = 0; r < std::size_t(T); ++r) {
      std::memset(dk + sh.kv_at(b, g) + r * std::size_t(ldkv), 0, std::size_t(HD) * sizeof(float));
      std::memset(dv + sh.kv_at(b, g) + r * std::size_t(ldkv), 0, std::size_t(HD) * sizeof(float));
    }
    std::vector<bf16_t>& pb = block_scratch(std::size_t(T) * T);
    thread_local std::vector<bf16_t> ab;
    ab.resize(std::size_t(T) * T);
    for (std::size_t h = g * G; h < (g + 1) * G; ++h) {
      const float* a = att + sh.att_at(b, h);
      float* dp = scratch + sh.att_at(b, h);
      da.run(s, db.data() + sh.q_at(b, h), vb.data() + sh.kv_at(b, g), dp);
      s.wait();
      softmax_grad_rows(dp, a, T, scale);
      for (std::size_t i = 0; i < pb.size(); ++i) pb[i] = f32_to_bf16(dp[i]), ab[i] = f32_to_bf16(a[i]);
      dq_p.run(s, pb.data(), kb.data() + sh.kv_at(b, g), dq + sh.q_at(b, h));
      dkv_p.run(s, pb.data(), qb.data() + sh.q_at(b, h), dk + sh.kv_at(b, g));
      dkv_p.run(s, ab.data(), db.data() + sh.q_at(b, h), dv + sh.kv_at(b, g));
      s.wait();
    }
  });
}

#else  // without oneDNN: the fp32 attention (the OpenBLAS fallback of the bf16 products covers linear only)

bool attention_bf16_native(int, int) {
  return false;
}
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
