// strata/kernels/cpu/linear_bf16.cpp: y = x W^T and its gradients with bf16 inputs and fp32 accumulation —
// the arithmetic of the cuda path's cuBLASLt products — for the host backend's bf16 training.
//
// Note [bf16 matrix products on the CPU]: both operands of each product are rounded to bf16 (core's
// f32_to_bf16: nearest, ties to even) into scratch buffers, and the product is accumulated in fp32 into
// the fp32 output. With oneDNN (STRATA_WITH_DNNL) it runs oneDNN's matmul, which uses the CPU's bf16
// units — AMX tiles or AVX-512 BF16 dot products — where it has them; where oneDNN has only its
// reference implementation for this CPU, or without oneDNN, the same rounded operands, widened back to
// fp32 (exactly), go through OpenBLAS's sgemm: the same products of bf16 values summed in fp32, in another
// order. Either way the result is bit-identical run to run (oneDNN's for any thread count, OpenBLAS's for
// a fixed one) and independent of where the tensors came from, so placements
// still agree bit for bit. The fp32 functions in linear.cpp stay the oracle; tests bound the difference.
//
// Threads: oneTBB spreads fixed blocks of rows over the runtime's threads, each a single-threaded oneDNN
// product (Note [Row blocks]); OpenMP's team is never more than the calling thread.
#include <cblas.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/log.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/parallel_impl.h"

#ifdef STRATA_WITH_DNNL
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace strata::kernels::cpu {
namespace {

// Per calling thread (the compute stream's worker): the bf16 copies of the two operands.
struct Scratch {
  std::vector<bf16_t> a, b;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// dst = bf16(src), n elements.
void round_to_bf16(bf16_t* dst, const float* src, std::size_t n) {
  impl::parallel_for_range(n, impl::kElementGrain, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) dst[i] = f32_to_bf16(src[i]);
  });
}

// C (M, N) [+]= op(A) (M, K) op(B) (K, N), C row-major dense; A stored (M, K) row-major, or (K, M) when
// trans_a; B stored (K, N), or (N, K) when trans_b; both dense and in bf16. Returns false when oneDNN has
// no native bf16 matmul here (the caller falls back).
#ifdef STRATA_WITH_DNNL
struct Dnnl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  bool native = true;  // cleared the first time oneDNN offers only its reference implementation
  bool said = false;
};
Dnnl& dnnl_state() {
  static Dnnl d;
  return d;
}

// One block of rows [r0, r1) of C, single-threaded (the caller's oneTBB task is its thread).
void dnnl_rows(Dnnl& d, const dnnl::matmul::primitive_desc& pd, float* c, const bf16_t* a, bool trans_a,
               const bf16_t* b, int M, int N, int K, int r0) {
  dnnl::stream s(d.engine);
  const std::size_t at = trans_a ? std::size_t(r0) : std::size_t(r0) * std::size_t(K);
  dnnl::memory am(pd.src_desc(), d.engine, const_cast<bf16_t*>(a + at)),
      bm(pd.weights_desc(), d.engine, const_cast<bf16_t*>(b)),
      cm(pd.dst_desc(), d.engine, c + std::size_t(r0) * std::size_t(N));
  (void)M;
  // The scratchpad is the caller's (Note [Concurrent products]).
  thread_local std::vector<char> pad;
  pad.resize(pd.scratchpad_desc().get_size());
  dnnl::memory sm(pd.scratchpad_desc(), d.engine, pad.data());
  dnnl::matmul(pd).execute(
      s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}, {DNNL_ARG_SCRATCHPAD, sm}});
  s.wait();
}

// Note [Row blocks]: oneDNN's own threads are OpenMP's, whose idle workers spin and starve the runtime's
// oneTBB and OpenBLAS threads on a small machine (measured: 1.6x slower steps on 2 cores). So oneDNN runs
// single-threaded, and oneTBB spreads C's rows over the runtime's threads in fixed blocks of kBlockRows:
// each block is the same single-threaded product whatever the thread count, so the result does not
// depend on it at all.
constexpr int kBlockRows = 64;

dnnl::matmul::primitive_desc dnnl_pd(Dnnl& d, int rows, int M, int N, int K, bool trans_a, bool trans_b,
                                     bool accumulate) {
  using dt = dnnl::memory::data_type;
  const dnnl::memory::dim m = M, n = N, k = K;
  const dnnl::memory::desc ad({rows, k}, dt::bf16,
                              trans_a ? dnnl::memory::dims{1, m} : dnnl::memory::dims{k, 1}),
      bd({k, n}, dt::bf16, trans_b ? dnnl::memory::dims{1, k} : dnnl::memory::dims{n, 1}),
      cd({rows, n}, dt::f32, dnnl::memory::dims{n, 1});
  // Note [Concurrent products]: the blocks of one product run the same (cached) primitive at once on
  // several threads. A primitive's library-owned scratchpad may be shared between those runs (whether it
  // is depends on how oneDNN was built), so each thread passes its own.
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (accumulate) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), attr, d.engine);
}

bool dnnl_matmul(float* c, const bf16_t* a, bool trans_a, const bf16_t* b, bool trans_b, int M, int N, int K,
                 bool accumulate) {
  Dnnl& d = dnnl_state();
  if (!d.native) return false;
  const int full = std::min(M, kBlockRows), tail = M % kBlockRows;
  dnnl::matmul::primitive_desc pd_full, pd_tail;
  try {
    pd_full = dnnl_pd(d, full, M, N, K, trans_a, trans_b, accumulate);
    if (tail > 0 && M > kBlockRows) pd_tail = dnnl_pd(d, tail, M, N, K, trans_a, trans_b, accumulate);
  } catch (const dnnl::error&) {
    d.native = false;
  }
  if (d.native && std::strncmp(pd_full.impl_info_str(), "ref", 3) == 0) d.native = false;
  if (!d.said) {
    d.said = true;
    STRATA_LOG_DEBUG("kernels: bf16 matrix products on the CPU through ",
                     d.native ? std::string("oneDNN (") + pd_full.impl_info_str() + ")"
                              : std::string("OpenBLAS (oneDNN has no native bf16 matmul on this CPU)"));
  }
  if (!d.native) return false;
  const std::size_t blocks = std::size_t((M + kBlockRows - 1) / kBlockRows);
  impl::parallel_for_range(blocks, 1, [&](std::size_t b0, std::size_t b1) {
    omp_set_num_threads(1);
    for (std::size_t blk = b0; blk < b1; ++blk) {
      const int r0 = int(blk) * kBlockRows;
      const bool last_partial = M > kBlockRows && tail > 0 && blk + 1 == blocks;
      dnnl_rows(d, last_partial ? pd_tail : pd_full, c, a, trans_a, b, M, N, K, r0);
    }
  });
  return true;
}
#else
bool dnnl_matmul(float*, const bf16_t*, bool, const bf16_t*, bool, int, int, int, bool) {
  return false;
}
#endif

// C (M, N) [+]= op(A) op(B) as dnnl_matmul takes them, from fp32 operands rounded to bf16 first.
void bf16_gemm(float* c, const float* a, bool trans_a, const float* b, bool trans_b, int M, int N, int K,
               bool accumulate) {
  Scratch& s = scratch();
  const std::size_t m = std::size_t(M), n = std::size_t(N), k = std::size_t(K);
  s.a.resize(m * k);
  s.b.resize(k * n);
  round_to_bf16(s.a.data(), a, s.a.size());
  round_to_bf16(s.b.data(), b, s.b.size());
  if (dnnl_matmul(c, s.a.data(), trans_a, s.b.data(), trans_b, M, N, K, accumulate)) return;
  // Fallback: the same bf16 values, widened back to fp32 (exactly), through sgemm.
  thread_local std::vector<float> fa, fb;
  fa.resize(s.a.size());
  fb.resize(s.b.size());
  for (std::size_t i = 0; i < fa.size(); ++i) fa[i] = bf16_to_f32(s.a[i]);
  for (std::size_t i = 0; i < fb.size(); ++i) fb[i] = bf16_to_f32(s.b[i]);
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N,
              K, 1.0f, fa.data(), trans_a ? M : K, fb.data(), trans_b ? K : N, accumulate ? 1.0f : 0.0f, c,
              N);
}

}  // namespace

void linear_forward_bf16(float* out, const float* x, const float* w, int N, int IC, int OC) {
  // out (N, OC) = x (N, IC) w^T, w stored (OC, IC)
  bf16_gemm(out, x, false, w, true, N, OC, IC, false);
}

void linear_backward_bf16(float* dx, float* dw, const float* dout, const float* x, const float* w, int N,
                          int IC, int OC) {
  // dx (N, IC) += dout (N, OC) w (OC, IC)
  if (dx != nullptr) bf16_gemm(dx, dout, false, w, false, N, IC, OC, true);
  // dw (OC, IC) += dout^T (OC, N) x (N, IC)
  bf16_gemm(dw, dout, true, x, false, OC, IC, N, true);
}

std::string bf16_matmul_impl() {
#ifdef STRATA_WITH_DNNL
  Dnnl& d = dnnl_state();
  try {
    const dnnl::matmul::primitive_desc pd = dnnl_pd(d, kBlockRows, 1024, 256, 256, false, true, false);
    if (std::strncmp(pd.impl_info_str(), "ref", 3) != 0) return std::string("oneDNN ") + pd.impl_info_str();
  } catch (const dnnl::error&) {
  }
#endif
  return "";
}

}  // namespace strata::kernels::cpu
