// strata/kernels/cpu/linear_bf16.cpp: y = x W^T and its gradients with bf16 inputs and fp32 accumulation —
// the arithmetic of the cuda path's cuBLASLt products — for the host backend's bf16 training.
//
// Note [bf16 matrix products on the CPU]: the operands are bf16 tensors (the host backend's bf16
// activations and gathered weights, as on cuda), used as they are; out and dx are rounded to bf16 once from
// the fp32 sums (dx = bf16(dx + dout W), a product with beta 1 into a bf16 matrix) and dw is accumulated
// in fp32. With oneDNN (STRATA_WITH_DNNL) the products run oneDNN's matmul, which uses the CPU's bf16
// units — AMX tiles or AVX-512 BF16 dot products — where it has them; where oneDNN has only its
// reference implementation for this CPU, or without oneDNN, the bf16 values, widened to fp32 (exactly),
// go through OpenBLAS's sgemm: the same products of bf16 values summed in fp32, in another order. Either
// way the result is bit-identical run to run (oneDNN's for any thread count, OpenBLAS's for a fixed one)
// and independent of where the tensors came from, so placements still agree bit for bit. The fp32
// functions in linear.cpp stay the oracle; tests bound the difference.
//
// Threads: oneTBB spreads tiles of C, sized by the shape, over the runtime's threads, each a
// single-threaded oneDNN product (Note [Row blocks], Note [Product tiles]; Note [Concurrent products] in
// bf16_impl.h); OpenMP's team is never more than the calling thread. Which implementation runs is decided
// once per process (bf16_matmul_impl()).
#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/bf16_impl.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/parallel_impl.h"

namespace strata::kernels::cpu {
namespace {

#ifdef STRATA_WITH_DNNL
// Note [Row blocks]: oneDNN's own threads are OpenMP's, whose idle workers spin and starve the runtime's
// oneTBB and OpenBLAS threads on a small machine (measured: 1.6x slower steps on 2 cores). So oneDNN runs
// single-threaded, and oneTBB spreads tiles of C over the runtime's threads (Note [Product tiles]): each
// tile is the same single-threaded product whatever the thread count, so the result does not depend on it
// at all.
// Note [Product tiles]: C is cut into tiles by its shape alone (never by the thread count, so the result
// does not depend on it), at least kMinTiles of them so that up to that many threads have work:
//   - tall C (M >= kMinTiles * 32 rows): tiles of whole rows, 32-128 of them. B is packed once per product
//     into the blocked layout oneDNN's kernel reads (pack(), split over the threads) and every tile reads
//     the packed copy; tiles reading a plain B would each repack all of it (measured on the AMD EPYC kind,
//     125m's shapes, one thread: 64-row tiles at 0.84 of oneDNN's single-call rate with plain B, 0.94
//     packed; bench/model/matmul_bench);
//   - short C (fewer rows: small micro-batches): tiles of whole columns, each over all the rows with its
//     own slice of B, which the product packs for itself, so B is still packed once in all. A tile has at
//     least 128 columns: with 64 the calls' own cost showed (125m at 64 rows, 2 threads: 0.80 of the
//     ceiling with 64, 0.85 with 128), at the price of fewer tiles than kMinTiles for narrow products.
// B is packed per product, not kept packed per gathered chunk: the forward (B = W^T) and the input
// gradient (B = W) want different packings, so a kept copy would serve only the forward recomputed under
// activation checkpointing, a third of the packings, against another copy of every gathered chunk in
// device memory. Packing's whole cost is oneDNN's own copy of a plain B: 7% of 125m's products on 2
// threads (matmul_bench: 1874.5 ms plain, 1743.3 ms packed beforehand).
constexpr int kMinTiles = 16;

struct Tiles {
  int rows, cols;  // of C per tile: rows == M or cols == N
};

Tiles tiles_for(int M, int N) {
  const auto round16 = [](int v) { return std::max(16, v / 16 * 16); };
  if (M >= kMinTiles * 32) return {std::min(128, round16(M / kMinTiles)), N};
  return {M, std::min(N, std::max(128, round16(N / kMinTiles)))};
}

using dims = dnnl::memory::dims;
using dim = dnnl::memory::dim;
using dt = dnnl::memory::data_type;

// op(A)'s rows [r0, r0 + rows) as a (rows, K) view at the full matrix's strides.
dnnl::memory::desc a_rows(dim rows, dim M, dim K, bool trans_a) {
  return dnnl::memory::desc({rows, K}, dt::bf16, trans_a ? dims{1, M} : dims{K, 1});
}
dnnl::memory::desc b_plain(dim K, dim N, bool trans_b) {
  return dnnl::memory::desc({K, N}, dt::bf16, trans_b ? dims{1, K} : dims{N, 1});
}
dnnl::memory::desc c_rows(dim rows, dim N, bool c_bf16) {
  return dnnl::memory::desc({rows, N}, c_bf16 ? dt::bf16 : dt::f32, dims{N, 1});
}

// Copies B (plain, as stored) into `packed`'s layout, the columns split over the runtime's threads in
// slices of whole layout blocks (exact: a reorder between two bf16 layouts moves bits). A layout with
// padding (N or K not a multiple of its blocks) is zeroed first, so the padding holds zeros.
void pack(const dnnl::memory::desc& plain, const dnnl::memory::desc& packed, const bf16_t* b, char* dst) {
  dnnl::engine& eng = impl::dnnl_engine();
  const dim K = plain.dims()[0], N = plain.dims()[1];
  if (packed.get_size() != std::size_t(K * N) * sizeof(bf16_t)) std::memset(dst, 0, packed.get_size());
  constexpr dim kSlice = 256;  // columns per task: a multiple of every bf16 matmul weights block
  const dim slices = (N + kSlice - 1) / kSlice;
  std::vector<std::pair<dnnl::memory::desc, dnnl::memory::desc>> views;
  try {
    for (dim i = 0; i < slices; ++i) {
      const dim c0 = i * kSlice, cols = std::min(kSlice, N - c0);
      views.emplace_back(plain.submemory_desc({K, cols}, {0, c0}), packed.submemory_desc({K, cols}, {0, c0}));
    }
  } catch (const dnnl::error&) {
    views = {{plain, packed}};  // a layout whose blocks the slices would cut: one reorder
  }
  impl::parallel_for_each_index(views.size(), 1, [&](std::size_t i) {
    omp_set_num_threads(1);
    thread_local dnnl::stream s(eng);
    dnnl::memory src(views[i].first, eng, const_cast<bf16_t*>(b)), out(views[i].second, eng, dst);
    dnnl::reorder(src, out).execute(s, src, out);
    s.wait();
  });
}

// C (M, N) [+]= op(A) (M, K) op(B) (K, N), C row-major dense; A stored (M, K) row-major, or (K, M) when
// trans_a; B stored (K, N), or (N, K) when trans_b; both dense and in bf16. C is fp32 (float) or bf16
// (bf16_t, rounded once from the fp32 sum). Returns false when oneDNN has no native bf16 matmul for it (the
// caller falls back).
template <typename CT>
bool dnnl_matmul(CT* c, const bf16_t* a, bool trans_a, const bf16_t* b, bool trans_b, int M, int N, int K,
                 bool accumulate) {
  constexpr bool c_bf16 = std::is_same_v<CT, bf16_t>;
  if (bf16_matmul_impl().empty()) return false;
  const Tiles t = tiles_for(M, N);
  const bool by_rows = t.cols == N;
  const int rows_tail = M % t.rows, cols_tail = N % t.cols;
  const dnnl::memory::desc plain = b_plain(K, N, trans_b);
  // The products of a full tile and of the last, smaller one (if any); B's layout for the row tiles.
  std::optional<impl::Product> full, last;
  dnnl::memory::desc packed = plain;
  try {
    if (by_rows) {
      // The layout the product wants B in, asked of the full tiles' product; the last tile's takes it too.
      const impl::Product probe(a_rows(t.rows, M, K, trans_a),
                                dnnl::memory::desc({K, N}, dt::bf16, dnnl::memory::format_tag::any),
                                c_rows(t.rows, N, c_bf16), accumulate);
      if (probe.native()) packed = probe.pd.weights_desc();
      full.emplace(a_rows(t.rows, M, K, trans_a), packed, c_rows(t.rows, N, c_bf16), accumulate);
      if (rows_tail > 0)
        last.emplace(a_rows(rows_tail, M, K, trans_a), packed, c_rows(rows_tail, N, c_bf16), accumulate);
    } else {
      const auto tile = [&](dim cols) {
        return impl::Product(a_rows(M, M, K, trans_a),
                             dnnl::memory::desc({K, cols}, dt::bf16, trans_b ? dims{1, K} : dims{N, 1}),
                             dnnl::memory::desc({M, cols}, c_bf16 ? dt::bf16 : dt::f32, dims{N, 1}),
                             accumulate);
      };
      full.emplace(tile(t.cols));
      if (cols_tail > 0) last.emplace(tile(cols_tail));
    }
  } catch (const dnnl::error&) {
    return false;
  }
  if (!full->native() || (last && !last->native())) return false;
  const bf16_t* bb = b;
  thread_local std::vector<char> packed_b;  // the calling thread's: products on one stream run in turn
  if (packed != plain) {
    packed_b.resize(packed.get_size());
    pack(plain, packed, b, packed_b.data());
    bb = reinterpret_cast<const bf16_t*>(packed_b.data());
  }
  const std::size_t tiles =
      by_rows ? std::size_t((M + t.rows - 1) / t.rows) : std::size_t((N + t.cols - 1) / t.cols);
  impl::parallel_for_each_index(tiles, 1, [&](std::size_t i) {
    const impl::Product& p = (by_rows ? rows_tail : cols_tail) > 0 && i + 1 == tiles ? *last : *full;
    if (by_rows) {
      const std::size_t r0 = i * std::size_t(t.rows);
      p.run(a + (trans_a ? r0 : r0 * std::size_t(K)), bb, c + r0 * std::size_t(N));
    } else {
      const std::size_t c0 = i * std::size_t(t.cols);
      p.run(a, b + (trans_b ? c0 * std::size_t(K) : c0), c + c0);
    }
  });
  return true;
}
#else
template <typename CT>
bool dnnl_matmul(CT*, const bf16_t*, bool, const bf16_t*, bool, int, int, int, bool) {
  return false;
}
#endif

// C (M, N) [+]= op(A) op(B) with A and B already bf16 and C fp32 or bf16.
template <typename CT>
void bf16_gemm(CT* c, const bf16_t* a, bool trans_a, const bf16_t* b, bool trans_b, int M, int N, int K,
               bool accumulate) {
  if (dnnl_matmul(c, a, trans_a, b, trans_b, M, N, K, accumulate)) return;
  // Fallback: the bf16 values widened to fp32 (exactly) through sgemm, C rounded once if it is bf16.
  const std::size_t m = std::size_t(M), n = std::size_t(N), k = std::size_t(K);
  thread_local std::vector<float> fa, fb, fc;
  fa.resize(m * k);
  fb.resize(k * n);
  cast_bf16_to_f32(fa.data(), a, fa.size());
  cast_bf16_to_f32(fb.data(), b, fb.size());
  float* cf = nullptr;
  if constexpr (std::is_same_v<CT, float>) {
    cf = c;
  } else {
    fc.resize(m * n);
    if (accumulate) cast_bf16_to_f32(fc.data(), c, fc.size());  // beta 0 below ignores fc otherwise
    cf = fc.data();
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N,
              K, 1.0f, fa.data(), trans_a ? M : K, fb.data(), trans_b ? K : N, accumulate ? 1.0f : 0.0f, cf,
              N);
  if constexpr (std::is_same_v<CT, bf16_t>) cast_f32_to_bf16(c, fc.data(), fc.size());
}

}  // namespace

void linear_forward(bf16_t* out, const bf16_t* x, const bf16_t* w, int N, int IC, int OC) {
  bf16_gemm(out, x, false, w, true, N, OC, IC, false);
}

void linear_backward(bf16_t* dx, float* dw, const bf16_t* dout, const bf16_t* x, const bf16_t* w, int N,
                     int IC, int OC) {
  if (dx != nullptr) bf16_gemm(dx, dout, false, w, false, N, IC, OC, true);
  if (dw != nullptr) bf16_gemm(dw, dout, true, x, false, OC, IC, N, true);  // none for a frozen weight
}

std::string bf16_matmul_impl() {
  static const std::string impl = [] {
#ifdef STRATA_WITH_DNNL
    try {
      const impl::Product p(a_rows(64, 1024, 256, false), b_plain(256, 256, true), c_rows(64, 256, false),
                            false);
      if (p.native()) return std::string("oneDNN ") + p.pd.impl_info_str();
    } catch (const dnnl::error&) {
    }
#endif
    return std::string();
  }();
  return impl;
}

}  // namespace strata::kernels::cpu
