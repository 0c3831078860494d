// strata/kernels/cpu/attention_fused.cpp: causal grouped-query attention on bf16 tensors in blocks, with an
// online softmax, so that no (T, T) buffer exists (attention_fused.h). attention.cpp's fp32 functions stay
// the oracle.
//
// Note [Fused attention on the CPU]: query rows and key rows are cut into blocks of kBlock (128) rows; the
// blocks are square, so only the diagonal block (i, i) is cut by the causal mask, and only the last block
// (T % 128 rows) is short. Per (query block i, key block j <= i) of one head:
//   forward:  S = q_i k_j^T (bf16 operands, fp32 sums), scaled by 1/sqrt(HD) in fp32 and masked; the online
//             softmax keeps each row's running max m and sum l in fp32 and rescales the row's fp32 sums acc
//             by e^(m_old - m_new) when the max grows; P = e^(S - m) is rounded to bf16 for acc += P v_j.
//             At the end out = bf16(acc / l), and saved keeps lse = m + ln l per row.
//   backward: S and dP = dout_i v_j^T again (fp32 sums), P = e^(S - lse) (normalised: no second pass),
//             dS = P (dP - D) / sqrt(HD) with D = rowsum(dout * out); then dv_j += P^T dout_i,
//             dk_j += dS^T q_i, dq_i += dS k_j with P and dS rounded to bf16 as the products' operands.
// A sliding window of w (kernels/cpu/ops.h: query t sees keys t - w < s <= t) cuts a band out of that
// triangle: query block i runs key blocks j from the one holding its first row's first key, (t0 - w + 1)
// / 128, to i, skipping every block left of the band outright; the blocks the band's left edge crosses are
// masked like the diagonal one, each row from its own first key (a row that sees none of a block's keys
// leaves its running max, sum and acc as they were). Without a window every row starts at key 0, and the
// blocks, row passes and sums are the causal ones bit for bit. Documents (Note [Document masks] in ops.h)
// move a row's first key further right, to its document's start: each row's first key is computed once per
// query block (first_keys), the block skips the key blocks left of its earliest row's, and the row passes
// mask each row from its own, so a window and documents are one mask here.
// Rounding points: q, k, v, dout arrive in bf16; P and dS are rounded to bf16 only as product operands
// (l sums the unrounded P, as flash attention does); every sum is fp32; out, dq, dk, dv are each rounded to
// bf16 once, from their complete fp32 sums. Those are the rounding points of the unfused bf16 attention it
// replaced (probabilities rounded for the products), except for where the 1/l normalisation falls (after
// the product, not before rounding P).
//
// Tasks (Note [deterministic CPU ops] in parallel_impl.h): the forward runs one oneTBB task per (batch,
// head, query block) — its rows are written by it alone. The backward runs one task per (batch, key/value
// head): dk and dv sum over the group's query heads and over every query block, so one task adds them in a
// fixed order (heads, then query blocks, then key blocks) into fp32 sums kept in `scratch`, (T, HD) twice
// per task, rounded once at the end. Those sums span the sequence, so they live in the caller's scratch
// (planned with the other activations) rather than in thread-local buffers that would grow with T unseen;
// what each thread keeps is O(128 x 128 + 128 x HD). dq's sums are per (head, query block), inside the task.
// Each product is a single-threaded oneDNN matmul on strided views of the heads (Note [Concurrent
// products] in bf16_impl.h, Note [Row blocks] in linear_bf16.cpp), so nothing depends on the thread count.
//
// Waves: B*NKV tasks' sums, 2*T*HD fp32 elements each, would be the largest buffer of the backward at long
// context (6144 bytes a token with 12 key/value heads), so scratch holds only `slots` of them: slots =
// max(1, min(B*NKV, budget / (2*T*HD))), the budget kFusedScratchElements (64 MiB) unless FusedPaths says
// otherwise. The tasks run in waves of `slots`: wave w runs tasks [w*slots, min((w+1)*slots, B*NKV)) in
// parallel, task t summing into slot t - w*slots, and the next wave starts once it is done. A task's
// arithmetic and order do not depend on its slot or wave, so every budget gives the same bits. The cost:
// at long context fewer tasks run at once than B*NKV (4 at T = 32768, HD 64), so fewer threads than that
// find work, and each wave waits for its slowest task; at training lengths up to a few thousand tokens
// every task fits in one wave (B 4 with 12 key/value heads, 48 tasks, up to T = 2730 at HD 64).
//
// D: rowsum(dout * out) equals rowsum(P * dP) up to out's rounding; computing it from P would take a
// second pass over the key blocks (two more products per block), so the backward reads the forward's out,
// which its caller keeps anyway (kernels/ops.h hands it over; the model's o_proj backward reads the same
// tensor just before; the cuDNN path does the same: Note [cuDNN attention saved state]). saved is then the
// lse alone, B*NH*T*4 bytes, instead of the unfused B*NH*T*T*4.
//
// Why 128: each product (128 x 128 x HD) is large enough that oneDNN's per-call cost (memory objects, an
// argument map, a stream wait) stays small against it, while S, dP (64 KiB of fp32 each), P, dS and an
// output block stay in L2. Measured at B 4, T 1024, NH 12, HD 64 on 2 threads: 128 takes 0.8x the time
// of 64 (forward and backward alike), 256 no less than 128. The cost: the masked half of each diagonal
// block is computed and thrown away, about 128/T of the products (12% at T 1024).
//
// Row passes: once the products are oneDNN's, the per-element work between them (e^x, maxima, sums,
// rounding to bf16) is the rest of the time, so it is compiled for AVX2 and AVX-512 besides x86-64's
// baseline and chosen at run time (row_passes; STYLE's runtime dispatch, without -march=native). The
// targets give the same bits (tests check each one this CPU has), so a run does not depend on the
// machine.
#include "kernels/cpu/attention_fused.h"

#include "kernels/cpu/attention_impl.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/bf16_impl.h"
#include "kernels/cpu/parallel_impl.h"
#include "kernels/cpu/simd_impl.h"

namespace strata::kernels::cpu {
namespace {

constexpr int kBlock = 128;  // rows of a query block and of a key block (Note [Fused attention on the CPU])

void check_heads(const char* op, int B, int T, int NH, int NKV, int HD, int window) {
  STRATA_CHECK(B >= 0 && T >= 0, op, ": batch ", B, " and sequence length ", T, " must not be negative");
  STRATA_CHECK(NKV > 0 && NH > 0 && NH % NKV == 0, op, ": n_heads ", NH,
               " must be a positive multiple of n_kv_heads ", NKV);
  STRATA_CHECK(HD > 0, op, ": head width ", HD, " must be positive");
  STRATA_CHECK(window >= 0, op, ": sliding window ", window, " must be 0 (none) or positive");
}

struct Dims {
  int B, T, NH, NKV, HD;
  int window;  // 0: causal; else the sliding window (Note [Fused attention on the CPU])
  std::size_t group() const { return std::size_t(NH / NKV); }  // query heads per key/value head
  std::size_t ldq() const { return std::size_t(NH) * HD; }     // row stride of q, dout, out
  std::size_t ldkv() const { return std::size_t(NKV) * HD; }   // row stride of k, v
  std::size_t blocks() const { return (std::size_t(T) + kBlock - 1) / kBlock; }
  int rows(std::size_t block) const { return std::min(kBlock, T - int(block) * kBlock); }
  std::size_t q_numel() const { return std::size_t(B) * T * NH * HD; }
  // Element offsets: row t of head h of q / dout / out, of head g of k / v, and (b, h, t)'s lse.
  std::size_t q_at(std::size_t b, std::size_t t, std::size_t h) const { return (b * T + t) * ldq() + h * HD; }
  std::size_t kv_at(std::size_t b, std::size_t t, std::size_t g) const {
    return (b * T + t) * ldkv() + g * HD;
  }
  std::size_t lse_at(std::size_t b, std::size_t h, std::size_t t) const { return (b * NH + h) * T + t; }
};

// The first key each row of the query block from t0 (rows of them) in batch row b sees, into key0, and the
// first key block the query block reads: the one holding the earliest of them (Note [Document masks] in
// ops.h; without a window or positions every row's is 0).
std::size_t first_keys(const Dims& d, const std::int32_t* pos, std::size_t b, std::size_t t0, int rows,
                       int* key0) {
  const std::int32_t* row = pos ? pos + b * std::size_t(d.T) : nullptr;
  std::size_t earliest = t0;
  for (int r = 0; r < rows; ++r) {
    const std::size_t first = impl::first_key(t0 + std::size_t(r), d.window, row);
    key0[r] = int(first);
    earliest = std::min(earliest, first);
  }
  return earliest / kBlock;
}

// ---- the row passes' arithmetic ------------------------------------------------------------------------

// e^x, row maxima and sums: simd_impl.h's, vectorised (Note [SIMD row passes]).
using impl::exp_f32;
using impl::kLanes;
using impl::max_row;
using impl::sum_row;

[[gnu::always_inline]] inline float dot_bf16(const bf16_t* a, const bf16_t* b, int n) {
  float lane[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lane[j] += bf16_to_f32(a[i + j]) * bf16_to_f32(b[i + j]);
  float s = 0.0f;
  for (float l : lane) s += l;
  for (; i < n; ++i) s += bf16_to_f32(a[i]) * bf16_to_f32(b[i]);
  return s;
}

// ---- the row passes of a block, compiled for each SIMD target ------------------------------------------

// Forward, on a (rows, cols) block of raw scores: scale, mask, fold into each row's running max m and sum
// l, P = e^(s - m) (left in s) rounded to bf16 into p with exact zeros where masked (so the product adds
// nothing from there), and acc's row rescaled by e^(m_old - m_new) when the max grew. Row r sees columns
// [max(0, key0[r] - s0), diagonal ? r + 1 : cols); a row that sees none leaves m, l and acc alone.
struct ForwardBlock {
  float* s;        // (rows, cols; ld kBlock)
  bf16_t* p;       // (rows, cols; ld kBlock)
  float *m, *l;    // (rows)
  float* acc;      // (rows, HD)
  int rows, cols;  // on the diagonal block (cols == rows), query r sees keys up to r
  bool diagonal;
  const int* key0;  // (rows) each row's first visible key (first_keys), absolute
  int s0;           // the block's first key
  float scale;
  int HD;
};

[[gnu::always_inline]] inline void forward_rows(const ForwardBlock& f) {
  const std::size_t hd = std::size_t(f.HD);
  for (int r = 0; r < f.rows; ++r) {
    const int lo = std::max(0, f.key0[r] - f.s0), hi = f.diagonal ? r + 1 : f.cols;
    float* s = f.s + std::size_t(r) * kBlock;
    bf16_t* p = f.p + std::size_t(r) * kBlock;
    if (lo >= hi) {
      std::fill(p, p + f.cols, bf16_t{0});
      continue;
    }
    for (int c = lo; c < hi; ++c) s[c] *= f.scale;
    const float mx = max_row(s + lo, hi - lo, f.m[r]);
    const float alpha = exp_f32(f.m[r] - mx);  // 0 on the row's first block (m = -inf)
    for (int c = lo; c < hi; ++c) s[c] = exp_f32(s[c] - mx);
    f.l[r] = f.l[r] * alpha + sum_row(s + lo, hi - lo);
    f.m[r] = mx;
    for (int c = 0; c < lo; ++c) p[c] = 0;
    for (int c = lo; c < hi; ++c) p[c] = f32_to_bf16(s[c]);
    for (int c = hi; c < f.cols; ++c) p[c] = 0;
    if (alpha != 1.0f)
      for (std::size_t e = 0; e < hd; ++e) f.acc[r * hd + e] *= alpha;
  }
}

// Backward, on a (rows, cols) block of raw scores s and the gradient dp of P: P = e^(scale s - lse) into
// p, dS = P (dp - D) scale into ds, both rounded to bf16, exact zeros where masked (ForwardBlock's mask).
struct BackwardBlock {
  float* s;              // (rows, cols; ld kBlock)
  const float* dp;       // (rows, cols; ld kBlock)
  bf16_t *p, *ds;        // (rows, cols; ld kBlock)
  const float *lse, *D;  // (rows)
  int rows, cols;
  bool diagonal;
  const int* key0;  // as ForwardBlock's
  int s0;
  float scale;
};

[[gnu::always_inline]] inline void backward_rows(const BackwardBlock& b) {
  for (int r = 0; r < b.rows; ++r) {
    const int hi = b.diagonal ? r + 1 : b.cols, lo = std::min(hi, std::max(0, b.key0[r] - b.s0));
    const std::size_t at = std::size_t(r) * kBlock;
    float* s = b.s + at;
    const float* dp = b.dp + at;
    bf16_t *p = b.p + at, *ds = b.ds + at;
    const float lse = b.lse[r], D = b.D[r];
    for (int c = lo; c < hi; ++c) s[c] = exp_f32(s[c] * b.scale - lse);
    for (int c = lo; c < hi; ++c) {
      p[c] = f32_to_bf16(s[c]);
      ds[c] = f32_to_bf16(s[c] * (dp[c] - D) * b.scale);
    }
    for (int c = 0; c < lo; ++c) p[c] = ds[c] = 0;
    for (int c = hi; c < b.cols; ++c) p[c] = ds[c] = 0;
  }
}

// One copy of each pass per target: the bodies are inlined and vectorised with that target's registers.
// Every target computes the same bits: the file is built with -ffp-contract=off (no FMA), and each sum
// runs in the order the source gives (kLanes partial sums), whatever the vector width.
struct RowPasses {
  void (*forward)(const ForwardBlock&);
  void (*backward)(const BackwardBlock&);
};
void forward_rows_baseline(const ForwardBlock& f) {
  forward_rows(f);
}
void backward_rows_baseline(const BackwardBlock& b) {
  backward_rows(b);
}
#if STRATA_SIMD_X86
[[gnu::target("avx2")]] void forward_rows_avx2(const ForwardBlock& f) {
  forward_rows(f);
}
[[gnu::target("avx2")]] void backward_rows_avx2(const BackwardBlock& b) {
  backward_rows(b);
}
[[gnu::target("avx512f,avx512bw,avx512vl")]] void forward_rows_avx512(const ForwardBlock& f) {
  forward_rows(f);
}
[[gnu::target("avx512f,avx512bw,avx512vl")]] void backward_rows_avx512(const BackwardBlock& b) {
  backward_rows(b);
}
#endif

RowPasses row_passes(FusedRows rows) {
  switch (attention_fused_rows(rows)) {
#if STRATA_SIMD_X86
    case FusedRows::avx512:
      return {forward_rows_avx512, backward_rows_avx512};
    case FusedRows::avx2:
      return {forward_rows_avx2, backward_rows_avx2};
#endif
    default:
      return {forward_rows_baseline, backward_rows_baseline};
  }
}

// ---- the block products --------------------------------------------------------------------------------

// The three products of a (rows, cols) block of scores — rows query rows, cols keys, both <= kBlock —
// on bf16 operands with fp32 sums; a and b point at the block's first row of a head (strided views):
//   scores: s (rows, cols; ld kBlock)  = a (rows, HD; ld NH*HD) b^T, b (cols, HD; ld NKV*HD)   S, dP
//   right:  c (rows, HD; ld HD)       += p (rows, cols; ld kBlock) b (cols, HD; ld NKV*HD)     P v, dS k
//   left:   c (cols, HD; ld HD)       += p^T b, p (rows, cols; ld kBlock), b (rows, HD; ld NH*HD)
//                                                                                 P^T dout, dS^T q
class Products {
 public:
  Products(const Dims& d, FusedProducts which) : d_(d) {
#ifdef STRATA_WITH_DNNL
    if (which == FusedProducts::loops || bf16_matmul_impl().empty()) return;
    using dt = dnnl::memory::data_type;
    using dim = dnnl::memory::dim;
    const auto view = [](dim rows, dim cols, dim row_stride, dim col_stride, dt type) {
      return dnnl::memory::desc({rows, cols}, type, dnnl::memory::dims{row_stride, col_stride});
    };
    const dim hd = d.HD, ldq = dim(d.ldq()), ldkv = dim(d.ldkv()), ld = kBlock, tail = d.T % kBlock;
    try {
      for (int rt = 0; rt < 2; ++rt)
        for (int ct = 0; ct < 2; ++ct) {
          const dim rows = rt ? tail : kBlock, cols = ct ? tail : kBlock;
          if (rows == 0 || cols == 0 || rows > d.T || (ct && !rt)) continue;  // a block shape never met
          Set& s = sets_[rt][ct].emplace(
              Set{impl::Product(view(rows, hd, ldq, 1, dt::bf16), view(hd, cols, 1, ldkv, dt::bf16),
                                view(rows, cols, ld, 1, dt::f32), false),
                  impl::Product(view(rows, cols, ld, 1, dt::bf16), view(cols, hd, ldkv, 1, dt::bf16),
                                view(rows, hd, hd, 1, dt::f32), true),
                  impl::Product(view(cols, rows, 1, ld, dt::bf16), view(rows, hd, ldq, 1, dt::bf16),
                                view(cols, hd, hd, 1, dt::f32), true)});
          if (!s.scores.native() || !s.right.native() || !s.left.native()) return;
        }
    } catch (const dnnl::error&) {
      return;  // no such matmul here: the loops run
    }
    dnnl_ = true;
#else
    (void)which;
#endif
  }

  void scores(float* s, const bf16_t* a, const bf16_t* b, int rows, int cols) const {
#ifdef STRATA_WITH_DNNL
    if (dnnl_) return set(rows, cols).scores.run(a, b, s);
#endif
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c)
        s[std::size_t(r) * kBlock + c] = dot_bf16(a + r * d_.ldq(), b + c * d_.ldkv(), d_.HD);
  }

  void right(float* c, const bf16_t* p, const bf16_t* b, int rows, int cols) const {
#ifdef STRATA_WITH_DNNL
    if (dnnl_) return set(rows, cols).right.run(p, b, c);
#endif
    const std::size_t hd = std::size_t(d_.HD);
    for (int r = 0; r < rows; ++r)
      for (int k = 0; k < cols; ++k) {
        const float pv = bf16_to_f32(p[std::size_t(r) * kBlock + k]);
        const bf16_t* bk = b + k * d_.ldkv();
        for (std::size_t e = 0; e < hd; ++e) c[r * hd + e] += pv * bf16_to_f32(bk[e]);
      }
  }

  void left(float* c, const bf16_t* p, const bf16_t* b, int rows, int cols) const {
#ifdef STRATA_WITH_DNNL
    if (dnnl_) return set(rows, cols).left.run(p, b, c);
#endif
    const std::size_t hd = std::size_t(d_.HD);
    for (int k = 0; k < cols; ++k)
      for (int r = 0; r < rows; ++r) {
        const float pv = bf16_to_f32(p[std::size_t(r) * kBlock + k]);
        const bf16_t* br = b + r * d_.ldq();
        for (std::size_t e = 0; e < hd; ++e) c[k * hd + e] += pv * bf16_to_f32(br[e]);
      }
  }

 private:
  Dims d_;
#ifdef STRATA_WITH_DNNL
  struct Set {
    impl::Product scores, right, left;
  };
  // [rows < kBlock][cols < kBlock]: a block is full or the sequence's tail. Only the last query block has
  // tail rows and only its diagonal block tail columns, so [0][1] never occurs.
  std::optional<Set> sets_[2][2];
  bool dnnl_ = false;
  const Set& set(int rows, int cols) const {
    return *sets_[rows < kBlock][cols < kBlock];
  }
#endif
};

// One thread's block buffers, reused by its tasks. A task runs nothing on oneTBB (its products are
// single-threaded oneDNN or loops), so a thread never starts another task while one is using them.
struct Work {
  std::vector<float> s, dp;      // (kBlock, kBlock): scores, then P; the gradient of P
  std::vector<bf16_t> p, ds;     // (kBlock, kBlock): P and dS as product operands
  std::vector<float> acc;        // (kBlock, HD): an output block's fp32 sums (out or dq)
  float m[kBlock], l[kBlock];    // forward: running max and sum per row
  float lse[kBlock], D[kBlock];  // backward: log-sum-exp and rowsum(dout * out) per row
  int key0[kBlock];              // each row's first visible key (first_keys)
};

Work& work(int HD) {
  thread_local Work w;
  const std::size_t sq = std::size_t(kBlock) * kBlock;
  w.s.resize(sq);
  w.dp.resize(sq);
  w.p.resize(sq);
  w.ds.resize(sq);
  w.acc.resize(std::size_t(kBlock) * HD);
  return w;
}

// The backward's waves (Note [Fused attention on the CPU]): how many tasks' dk, dv sums scratch holds.
struct Slots {
  std::size_t tasks;     // B*NKV, one per (batch, key/value head)
  std::size_t per_task;  // fp32 elements of one task's sums, 2*T*HD
  std::size_t slots;     // tasks at once: max(1, min(tasks, budget / per_task)); 0 when nothing runs
};
Slots slots_for(int B, int T, int NKV, int HD, std::size_t scratch_elements) {
  const std::size_t budget = scratch_elements ? scratch_elements : kFusedScratchElements;
  Slots s{std::size_t(B) * std::size_t(NKV), 2 * std::size_t(T) * std::size_t(HD), 0};
  if (s.tasks > 0 && s.per_task > 0)
    s.slots = std::max<std::size_t>(1, std::min(s.tasks, budget / s.per_task));
  return s;
}

}  // namespace

std::size_t attention_fused_saved(int B, int T, int NH, int /*HD*/) {
  return std::size_t(B) * NH * T;  // the lse; out comes from the caller
}

std::size_t attention_fused_scratch(int B, int T, int NKV, int HD, std::size_t scratch_elements) {
  const Slots s = slots_for(B, T, NKV, HD, scratch_elements);
  return s.slots * s.per_task;
}

FusedRows attention_fused_rows(FusedRows rows) {
  using impl::SimdTarget;
  const SimdTarget here = impl::simd_target();
  if (rows == FusedRows::best || rows == FusedRows::avx512)
    rows = here >= SimdTarget::avx512 ? FusedRows::avx512 : FusedRows::avx2;
  if (rows == FusedRows::avx2 && here < SimdTarget::avx2) rows = FusedRows::baseline;
  return rows;
}

void attention_fused_forward(bf16_t* out, float* saved, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                             int B, int T, int NH, int NKV, int HD, int window, const std::int32_t* pos,
                             const FusedPaths& paths) {
  check_heads("attention_fused_forward", B, T, NH, NKV, HD, window);
  const Dims d{B, T, NH, NKV, HD, window};
  if (d.q_numel() == 0) return;
  const Products prod(d, paths.products);
  const RowPasses pass = row_passes(paths.rows);
  const float scale = float(1.0 / std::sqrt(double(HD)));
  const std::size_t nb = d.blocks(), hd = std::size_t(HD);
  impl::parallel_for_each_index(std::size_t(B) * NH * nb, 1, [&](std::size_t task) {
    const std::size_t i = task % nb, h = task / nb % std::size_t(NH), b = task / nb / std::size_t(NH);
    const std::size_t g = h / d.group(), t0 = i * kBlock;
    const int rows = d.rows(i);
    Work& w = work(HD);
    std::fill(w.acc.begin(), w.acc.begin() + std::ptrdiff_t(rows * hd), 0.0f);
    std::fill(w.m, w.m + rows, -INFINITY);
    std::fill(w.l, w.l + rows, 0.0f);
    const bf16_t* qi = q + d.q_at(b, t0, h);
    for (std::size_t j = first_keys(d, pos, b, t0, rows, w.key0); j <= i; ++j) {
      const std::size_t s0 = j * kBlock;
      const int cols = d.rows(j);
      prod.scores(w.s.data(), qi, k + d.kv_at(b, s0, g), rows, cols);
      pass.forward(
          {w.s.data(), w.p.data(), w.m, w.l, w.acc.data(), rows, cols, j == i, w.key0, int(s0), scale, HD});
      prod.right(w.acc.data(), w.p.data(), v + d.kv_at(b, s0, g), rows, cols);
    }
    for (int r = 0; r < rows; ++r) {
      const std::size_t t = t0 + std::size_t(r), at = d.q_at(b, t, h);
      for (std::size_t e = 0; e < hd; ++e) out[at + e] = f32_to_bf16(w.acc[r * hd + e] / w.l[r]);
      saved[d.lse_at(b, h, t)] = w.m[r] + std::log(w.l[r]);
    }
  });
}

void attention_fused_backward(bf16_t* dq, bf16_t* dk, bf16_t* dv, float* scratch, const bf16_t* dout,
                              const bf16_t* q, const bf16_t* k, const bf16_t* v, const bf16_t* out,
                              const float* saved, int B, int T, int NH, int NKV, int HD, int window,
                              const std::int32_t* pos, const FusedPaths& paths) {
  check_heads("attention_fused_backward", B, T, NH, NKV, HD, window);
  const Dims d{B, T, NH, NKV, HD, window};
  if (d.q_numel() == 0) return;
  const Products prod(d, paths.products);
  const RowPasses pass = row_passes(paths.rows);
  const float scale = float(1.0 / std::sqrt(double(HD)));
  const std::size_t nb = d.blocks(), hd = std::size_t(HD), G = d.group();
  // One (batch, key/value head) task, its dk and dv sums in `sums` (Note [Fused attention on the CPU]).
  const auto run = [&](std::size_t task, float* sums) {
    const std::size_t b = task / std::size_t(NKV), g = task % std::size_t(NKV);
    float* dk_sum = sums;  // (T, HD) each
    float* dv_sum = dk_sum + std::size_t(T) * hd;
    std::fill(dk_sum, dk_sum + 2 * std::size_t(T) * hd, 0.0f);
    Work& w = work(HD);
    for (std::size_t h = g * G; h < (g + 1) * G; ++h)
      for (std::size_t i = 0; i < nb; ++i) {
        const std::size_t t0 = i * kBlock;
        const int rows = d.rows(i);
        const bf16_t* qi = q + d.q_at(b, t0, h);
        const bf16_t* dout_i = dout + d.q_at(b, t0, h);
        const bf16_t* out_i = out + d.q_at(b, t0, h);
        for (int r = 0; r < rows; ++r) {
          w.lse[r] = saved[d.lse_at(b, h, t0 + std::size_t(r))];
          w.D[r] = dot_bf16(dout_i + r * d.ldq(), out_i + r * d.ldq(), HD);
        }
        std::fill(w.acc.begin(), w.acc.begin() + std::ptrdiff_t(rows * hd), 0.0f);
        for (std::size_t j = first_keys(d, pos, b, t0, rows, w.key0); j <= i; ++j) {
          const std::size_t s0 = j * kBlock;
          const int cols = d.rows(j);
          const bf16_t* kj = k + d.kv_at(b, s0, g);
          prod.scores(w.s.data(), qi, kj, rows, cols);
          prod.scores(w.dp.data(), dout_i, v + d.kv_at(b, s0, g), rows, cols);
          pass.backward({w.s.data(), w.dp.data(), w.p.data(), w.ds.data(), w.lse, w.D, rows, cols, j == i,
                         w.key0, int(s0), scale});
          prod.left(dv_sum + s0 * hd, w.p.data(), dout_i, rows, cols);
          prod.left(dk_sum + s0 * hd, w.ds.data(), qi, rows, cols);
          prod.right(w.acc.data(), w.ds.data(), kj, rows, cols);
        }
        for (int r = 0; r < rows; ++r) {
          bf16_t* dst = dq + d.q_at(b, t0 + std::size_t(r), h);
          for (std::size_t e = 0; e < hd; ++e) dst[e] = f32_to_bf16(w.acc[r * hd + e]);
        }
      }
    for (std::size_t t = 0; t < std::size_t(T); ++t)
      for (std::size_t e = 0; e < hd; ++e) {
        dk[d.kv_at(b, t, g) + e] = f32_to_bf16(dk_sum[t * hd + e]);
        dv[d.kv_at(b, t, g) + e] = f32_to_bf16(dv_sum[t * hd + e]);
      }
  };
  // Waves of `slots` tasks, task t of the wave from `first` in slot t - first.
  const Slots sl = slots_for(B, T, NKV, HD, paths.scratch_elements);
  for (std::size_t first = 0; first < sl.tasks; first += sl.slots) {
    const std::size_t n = std::min(sl.slots, sl.tasks - first);
    impl::parallel_for_each_index(n, 1,
                                  [&](std::size_t slot) { run(first + slot, scratch + slot * sl.per_task); });
  }
}

}  // namespace strata::kernels::cpu
