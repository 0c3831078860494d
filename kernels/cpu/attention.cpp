// strata/kernels/cpu/attention.cpp: causal self-attention with grouped-query heads, O(T^2) scores.
//
// Each (batch, head) pair is a handful of matrix products over strided views of q, k, v (OpenBLAS, run
// one after another so that OpenBLAS threads each) and a row-wise softmax or softmax gradient (oneTBB).
// The products cover the full T x T square; the causal mask (and a sliding window's band) is applied by the
// row pass, which writes exact zeros outside it, so the products that follow add nothing from masked
// positions; a document mask (Note [Document masks] in ops.h) the same way. This is the oracle: simple
// rather than fast, a window or documents save nothing here.
#include <cblas.h>

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/attention_impl.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/parallel_impl.h"

namespace strata::kernels::cpu {
namespace {

void check_heads(const char* op, int NH, int NKV, int HD, int window) {
  STRATA_CHECK(NKV > 0 && NH % NKV == 0, op, ": n_heads ", NH, " must be a positive multiple of n_kv_heads ",
               NKV);
  STRATA_CHECK(HD > 0, op, ": head width ", HD, " must be positive");
  STRATA_CHECK(window >= 0, op, ": sliding window ", window, " must be 0 (none) or positive");
}

// Views of one (b, h) pair: the head's rows of q / dout (leading dimension NH * HD), its key/value
// head's rows of k / v (leading dimension NKV * HD), and its (T, T) block of att / scratch.
struct Head {
  std::size_t q, kv, att;  // element offsets
};

Head head(std::size_t b, std::size_t h, int T, int NH, int NKV, int HD) {
  const std::size_t g = h / std::size_t(NH / NKV);
  return Head{b * T * NH * HD + h * HD, b * T * NKV * HD + g * HD, (b * NH + h) * std::size_t(T) * T};
}

}  // namespace

void attention_forward(float* out, float* att, const float* q, const float* k, const float* v, int B, int T,
                       int NH, int NKV, int HD, int window, const std::int32_t* pos) {
  check_heads("attention_forward", NH, NKV, HD, window);
  const float scale = float(1.0 / std::sqrt(double(HD)));
  const int ldq = NH * HD, ldkv = NKV * HD;
  // Scores: att (T,T) = scale * q_h (T,HD) k_g^T.
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const Head x = head(b, h, T, NH, NKV, HD);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HD, scale, q + x.q, ldq, k + x.kv, ldkv,
                  0.0f, att + x.att, T);
    }
  // Causal softmax, one task per row; zeros above the diagonal and before the window or the document.
  impl::parallel_for_each_index(std::size_t(B) * NH * T, 8, [&](std::size_t row) {
    const std::size_t t = row % T, b = row / T / std::size_t(NH);
    impl::causal_softmax_row(att + row * T, t, std::size_t(T), 1.0f,  // scaled by the product
                             impl::first_key(t, window, pos ? pos + b * T : nullptr));
  });
  // out_h (T,HD) = att (T,T) v_g (T,HD).
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const Head x = head(b, h, T, NH, NKV, HD);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HD, T, 1.0f, att + x.att, T, v + x.kv, ldkv,
                  0.0f, out + x.q, ldq);
    }
}

// With a = att and p the scaled scores: da = dout_h v_g^T, dp = a (da - rowsum(a da)) (then * scale for
// the unscaled q.k), dq_h = dp k_g, dk_g = sum over the group's heads of dp^T q_h, dv_g likewise a^T dout_h.
void attention_backward(float* dq, float* dk, float* dv, float* scratch, const float* dout, const float* q,
                        const float* k, const float* v, const float* /*out: unread*/, const float* att, int B,
                        int T, int NH, int NKV, int HD, int window, const std::int32_t* pos) {
  check_heads("attention_backward", NH, NKV, HD, window);
  const float scale = float(1.0 / std::sqrt(double(HD)));
  const int ldq = NH * HD, ldkv = NKV * HD;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const Head x = head(b, h, T, NH, NKV, HD);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HD, 1.0f, dout + x.q, ldq, v + x.kv, ldkv,
                  0.0f, scratch + x.att, T);
    }
  impl::parallel_for_each_index(std::size_t(B) * NH * T, 8, [&](std::size_t row) {
    const std::size_t t = row % T, b = row / T / std::size_t(NH);
    impl::causal_softmax_grad_row(scratch + row * T, att + row * T, t, std::size_t(T), scale,
                                  impl::first_key(t, window, pos ? pos + b * T : nullptr));
  });
  // dk and dv are written: clear them, then add each head of the group in head order.
  impl::parallel_for_range(std::size_t(B) * T * NKV * HD, impl::kElementGrain,
                           [&](std::size_t i0, std::size_t i1) {
                             std::memset(dk + i0, 0, (i1 - i0) * sizeof(float));
                             std::memset(dv + i0, 0, (i1 - i0) * sizeof(float));
                           });
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const Head x = head(b, h, T, NH, NKV, HD);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HD, T, 1.0f, scratch + x.att, T, k + x.kv,
                  ldkv, 0.0f, dq + x.q, ldq);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HD, T, 1.0f, scratch + x.att, T, q + x.q, ldq,
                  1.0f, dk + x.kv, ldkv);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HD, T, 1.0f, att + x.att, T, dout + x.q, ldq,
                  1.0f, dv + x.kv, ldkv);
    }
}

}  // namespace strata::kernels::cpu
