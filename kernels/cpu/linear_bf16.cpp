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
// product (Note [Row blocks]; Note [Concurrent products] in bf16_impl.h); OpenMP's team is never more than
// the calling thread. Which implementation runs is decided once per process (bf16_matmul_impl()).
#include <cblas.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/bf16_impl.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/parallel_impl.h"

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

// C (M, N) [+]= op(A) (M, K) op(B) (K, N), C row-major dense; A stored (M, K) row-major, or (K, M) when
// trans_a; B stored (K, N), or (N, K) when trans_b; both dense and in bf16. Returns false when oneDNN has
// no native bf16 matmul for it (the caller falls back).
#ifdef STRATA_WITH_DNNL
// Note [Row blocks]: oneDNN's own threads are OpenMP's, whose idle workers spin and starve the runtime's
// oneTBB and OpenBLAS threads on a small machine (measured: 1.6x slower steps on 2 cores). So oneDNN runs
// single-threaded, and oneTBB spreads C's rows over the runtime's threads in fixed blocks of kBlockRows:
// each block is the same single-threaded product whatever the thread count, so the result does not
// depend on it at all.
constexpr int kBlockRows = 64;

// The product of `rows` rows of op(A) with op(B), for C's rows at stride N.
impl::Product block_product(int rows, int M, int N, int K, bool trans_a, bool trans_b, bool accumulate) {
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  const dnnl::memory::dim m = M, n = N, k = K;
  return impl::Product(dnnl::memory::desc({rows, k}, dt::bf16, trans_a ? dims{1, m} : dims{k, 1}),
                       dnnl::memory::desc({k, n}, dt::bf16, trans_b ? dims{1, k} : dims{n, 1}),
                       dnnl::memory::desc({rows, n}, dt::f32, dims{n, 1}), accumulate);
}

bool dnnl_matmul(float* c, const bf16_t* a, bool trans_a, const bf16_t* b, bool trans_b, int M, int N, int K,
                 bool accumulate) {
  if (bf16_matmul_impl().empty()) return false;
  const int tail = M > kBlockRows ? M % kBlockRows : 0;
  std::optional<impl::Product> full, last;
  try {
    full.emplace(block_product(std::min(M, kBlockRows), M, N, K, trans_a, trans_b, accumulate));
    if (tail > 0) last.emplace(block_product(tail, M, N, K, trans_a, trans_b, accumulate));
  } catch (const dnnl::error&) {
    return false;
  }
  if (!full->native() || (last && !last->native())) return false;
  const std::size_t blocks = std::size_t((M + kBlockRows - 1) / kBlockRows);
  impl::parallel_for_range(blocks, 1, [&](std::size_t b0, std::size_t b1) {
    for (std::size_t blk = b0; blk < b1; ++blk) {
      const std::size_t r0 = blk * kBlockRows;
      const impl::Product& p = tail > 0 && blk + 1 == blocks ? *last : *full;
      p.run(a + (trans_a ? r0 : r0 * std::size_t(K)), b, c + r0 * std::size_t(N));
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
  impl::round_to_bf16(s.a.data(), a, s.a.size());
  impl::round_to_bf16(s.b.data(), b, s.b.size());
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
  static const std::string impl = [] {
#ifdef STRATA_WITH_DNNL
    try {
      const impl::Product p = block_product(kBlockRows, 1024, 256, 256, false, true, false);
      if (p.native()) return std::string("oneDNN ") + p.pd.impl_info_str();
    } catch (const dnnl::error&) {
    }
#endif
    return std::string();
  }();
  return impl;
}

}  // namespace strata::kernels::cpu
