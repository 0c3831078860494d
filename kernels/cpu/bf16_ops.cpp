// strata/kernels/cpu/bf16_ops.cpp: the decoder's ops on bf16 activations (kernels/cpu/ops.h, section "bf16
// activations"): the fp32 functions run on blocks widened to fp32, each bf16 output rounded once.
//
// Note [bf16 ops by blocks]: each op splits its tensor into fixed blocks — whole rows for the row ops
// (RMSNorm, bias, rotary embedding: the rows of one sequence), kBlock elements for the elementwise ops —
// and a task widens its block's inputs into per-thread fp32 buffers (exact), calls the fp32 function on
// them and rounds the bf16 outputs back (f32_to_bf16); an accumulated output (dx +=, da +=) is widened
// with the inputs, so it is read, added to in fp32 and rounded once. The fp32 functions compute each
// output element from its own row or element alone, so the block they see changes no bit: the result is
// "widen the tensors, call the fp32 function, round", whatever the blocks and the thread count. The sums
// across rows (RMSNorm's dw, the bias's db, the embedding's dwte, the loss) are the fp32 ops' own loops,
// templated on the element type (impl::rmsnorm_dw; embedding.cpp and elementwise.cpp hold the embedding's
// and the bias gradient's bf16 variants), on values widened as they are read. No fp32 copy of a whole tensor
// is made (the logits alone are N x V): a buffer holds one block. A task calls an fp32 function on no more
// rows or elements than that function runs in one task (its grain), so the call runs on the task's thread and
// spawns no oneTBB work: a thread never starts a second task, with the same buffers, while the first is
// waiting.
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/ops_impl.h"
#include "kernels/cpu/parallel_impl.h"

namespace strata::kernels::cpu {
namespace {

using impl::narrow_bf16;
using impl::widen_bf16;

constexpr std::size_t kBlock = 4096;       // elements of an elementwise block (<= impl::kElementGrain)
constexpr std::size_t kRowBlock = 16384;   // about this many elements of whole rows per row-op task
constexpr std::size_t kMaxBlockRows = 64;  // and at most this many rows
// The grains under which the fp32 row ops run on the calling thread (rmsnorm.cpp, elementwise.cpp:
// 8 rows; rope.cpp: 4 positions).
constexpr std::size_t kNormRows = 8, kRopeRows = 4;

// Slot `slot` of this thread's fp32 buffers, at least n elements: one task's widened block.
float* buffer(int slot, std::size_t n) {
  thread_local std::vector<float> b[6];
  if (b[slot].size() < n) b[slot].resize(n);
  return b[slot].data();
}

// fn(i0, i1) over [0, n) in blocks of kBlock elements.
template <typename Fn>
void for_element_blocks(std::size_t n, Fn&& fn) {
  const std::size_t blocks = (n + kBlock - 1) / kBlock;
  impl::parallel_for_each_index(blocks, impl::kElementGrain / kBlock,
                                [&](std::size_t b) { fn(b * kBlock, std::min(n, (b + 1) * kBlock)); });
}

// Rows per block for rows of `width` elements.
std::size_t block_rows(std::size_t width) {
  return std::clamp<std::size_t>(kRowBlock / std::max<std::size_t>(width, 1), 1, kMaxBlockRows);
}

// fn(r0, r1) over rows [0, rows) of `width` elements, in blocks of block_rows(width) rows.
template <typename Fn>
void for_row_blocks(std::size_t rows, std::size_t width, Fn&& fn) {
  const std::size_t per = block_rows(width), blocks = (rows + per - 1) / per;
  impl::parallel_for_each_index(blocks, 1,
                                [&](std::size_t b) { fn(b * per, std::min(rows, (b + 1) * per)); });
}

// Calls fn(j0, j1) over [0, n) in pieces of at most `piece` (an fp32 function's grain).
template <typename Fn>
void in_pieces(std::size_t n, std::size_t piece, Fn&& fn) {
  for (std::size_t j = 0; j < n; j += piece) fn(j, std::min(n, j + piece));
}

// An elementwise op over kBlock blocks: its K inputs widened, op(inputs, outputs, m) — the fp32 function
// — on the block, its O outputs (null ones skipped) rounded back. accumulate: the outputs are widened
// first too (the op adds to them).
template <std::size_t K, std::size_t O, typename Op>
void elementwise(std::size_t n, const bf16_t* const (&in)[K], bf16_t* const (&out)[O], bool accumulate,
                 Op&& op) {
  for_element_blocks(n, [&](std::size_t i0, std::size_t i1) {
    const std::size_t m = i1 - i0;
    const float* fin[K];
    float* fout[O];
    for (std::size_t j = 0; j < K; ++j) {
      float* f = buffer(int(j), m);
      widen_bf16(f, in[j] + i0, m);
      fin[j] = f;
    }
    for (std::size_t j = 0; j < O; ++j) {
      fout[j] = out[j] != nullptr ? buffer(int(K + j), m) : nullptr;
      if (accumulate && fout[j] != nullptr) widen_bf16(fout[j], out[j] + i0, m);
    }
    op(fin, fout, m);
    for (std::size_t j = 0; j < O; ++j)
      if (fout[j] != nullptr) narrow_bf16(out[j] + i0, fout[j], m);
  });
}

}  // namespace

// The embedding's bf16 variants are embedding.cpp's, the bias gradient's elementwise.cpp's: one loop
// each for both types.

// ---- RMSNorm ------------------------------------------------------------------------------------------

void rmsnorm_forward(bf16_t* out, float* rstd, const bf16_t* x, const bf16_t* w, int N, int C, float eps,
                     float w_offset) {
  const std::size_t c = std::size_t(C);
  for_row_blocks(std::size_t(N), c, [&](std::size_t r0, std::size_t r1) {
    const std::size_t m = (r1 - r0) * c;
    float *xf = buffer(0, m), *of = buffer(1, m), *wf = buffer(2, c);
    widen_bf16(xf, x + r0 * c, m);
    widen_bf16(wf, w, c);
    in_pieces(r1 - r0, kNormRows, [&](std::size_t j0, std::size_t j1) {
      rmsnorm_forward(of + j0 * c, rstd + r0 + j0, xf + j0 * c, wf, int(j1 - j0), C, eps, w_offset);
    });
    narrow_bf16(out + r0 * c, of, m);
  });
}

void rmsnorm_backward(bf16_t* dx, float* dw, const bf16_t* dout, const bf16_t* x, const bf16_t* w,
                      const float* rstd, int N, int C, float w_offset) {
  const std::size_t c = std::size_t(C);
  for_row_blocks(std::size_t(N), c, [&](std::size_t r0, std::size_t r1) {
    const std::size_t m = (r1 - r0) * c;
    float *dxf = buffer(0, m), *gf = buffer(1, m), *xf = buffer(2, m), *wf = buffer(3, c);
    widen_bf16(dxf, dx + r0 * c, m);
    widen_bf16(gf, dout + r0 * c, m);
    widen_bf16(xf, x + r0 * c, m);
    widen_bf16(wf, w, c);
    for (std::size_t j = 0; j < r1 - r0; ++j)
      impl::rmsnorm_backward_row(dxf + j * c, gf + j * c, xf + j * c, wf, rstd[r0 + j], C, w_offset);
    narrow_bf16(dx + r0 * c, dxf, m);
  });
  if (dw != nullptr) impl::rmsnorm_dw(dw, dout, x, rstd, N, C);  // none for a frozen weight
}

// ---- a projection's bias ------------------------------------------------------------------------------

void bias_forward(bf16_t* out, const bf16_t* b, int N, int OC) {
  const std::size_t oc = std::size_t(OC);
  for_row_blocks(std::size_t(N), oc, [&](std::size_t r0, std::size_t r1) {
    const std::size_t m = (r1 - r0) * oc;
    float *of = buffer(0, m), *bf = buffer(1, oc);
    widen_bf16(of, out + r0 * oc, m);
    widen_bf16(bf, b, oc);
    in_pieces(r1 - r0, kNormRows,
              [&](std::size_t j0, std::size_t j1) { bias_forward(of + j0 * oc, bf, int(j1 - j0), OC); });
    narrow_bf16(out + r0 * oc, of, m);
  });
}

// ---- rotary embedding ---------------------------------------------------------------------------------

namespace {

// Blocks of positions within one sequence, each rotated by the fp32 function as a batch of one sequence
// starting at the block's first position (its rows of the tables), or with `pos` at the block's rows of pos.
void rotate(bf16_t* out, const bf16_t* x, const float* cos, const float* sin, int B, int T, int H, int HD,
            bool backward, const std::int32_t* pos) {
  STRATA_CHECK(HD % 2 == 0, "rotary embedding: head width ", HD, " must be even");
  const std::size_t width = std::size_t(H) * HD, half = std::size_t(HD / 2), per = block_rows(width);
  const std::size_t per_seq = (std::size_t(T) + per - 1) / per;
  impl::parallel_for_each_index(std::size_t(B) * per_seq, 1, [&](std::size_t blk) {
    const std::size_t b = blk / per_seq, t0 = (blk % per_seq) * per;
    const std::size_t t1 = std::min(std::size_t(T), t0 + per), m = (t1 - t0) * width;
    const std::size_t at = (b * std::size_t(T) + t0) * width;
    float *xf = buffer(0, m), *of = buffer(1, m);
    widen_bf16(xf, x + at, m);
    in_pieces(t1 - t0, kRopeRows, [&](std::size_t j0, std::size_t j1) {
      const std::size_t t = t0 + j0;
      // Without positions the tables from row t; with them the whole tables, indexed by the block's pos.
      const std::size_t from = pos ? 0 : t * half;
      const std::int32_t* p = pos ? pos + b * std::size_t(T) + t : nullptr;
      if (backward)
        rope_backward(of + j0 * width, xf + j0 * width, cos + from, sin + from, 1, int(j1 - j0), H, HD, p);
      else
        rope_forward(of + j0 * width, xf + j0 * width, cos + from, sin + from, 1, int(j1 - j0), H, HD, p);
    });
    narrow_bf16(out + at, of, m);
  });
}

}  // namespace

void rope_forward(bf16_t* out, const bf16_t* x, const float* cos, const float* sin, int B, int T, int H,
                  int HD, const std::int32_t* pos) {
  rotate(out, x, cos, sin, B, T, H, HD, false, pos);
}

void rope_backward(bf16_t* dx, const bf16_t* dout, const float* cos, const float* sin, int B, int T, int H,
                   int HD, const std::int32_t* pos) {
  rotate(dx, dout, cos, sin, B, T, H, HD, true, pos);
}

// ---- SwiGLU, GeGLU, residual, scale ---------------------------------------------------------------------

void swiglu_forward(bf16_t* out, const bf16_t* gate, const bf16_t* up, std::size_t n) {
  elementwise<2, 1>(n, {gate, up}, {out}, false, [](const float* const* in, float* const* o, std::size_t m) {
    swiglu_forward(o[0], in[0], in[1], m);
  });
}

void swiglu_backward(bf16_t* dgate, bf16_t* dup, const bf16_t* dout, const bf16_t* gate, const bf16_t* up,
                     std::size_t n) {
  elementwise<3, 2>(n, {dout, gate, up}, {dgate, dup}, false,
                    [](const float* const* in, float* const* o, std::size_t m) {
                      swiglu_backward(o[0], o[1], in[0], in[1], in[2], m);
                    });
}

void geglu_forward(bf16_t* out, const bf16_t* gate, const bf16_t* up, std::size_t n) {
  elementwise<2, 1>(n, {gate, up}, {out}, false, [](const float* const* in, float* const* o, std::size_t m) {
    geglu_forward(o[0], in[0], in[1], m);
  });
}

void geglu_backward(bf16_t* dgate, bf16_t* dup, const bf16_t* dout, const bf16_t* gate, const bf16_t* up,
                    std::size_t n) {
  elementwise<3, 2>(n, {dout, gate, up}, {dgate, dup}, false,
                    [](const float* const* in, float* const* o, std::size_t m) {
                      geglu_backward(o[0], o[1], in[0], in[1], in[2], m);
                    });
}

void residual_forward(bf16_t* out, const bf16_t* a, const bf16_t* b, std::size_t n) {
  elementwise<2, 1>(n, {a, b}, {out}, false, [](const float* const* in, float* const* o, std::size_t m) {
    residual_forward(o[0], in[0], in[1], m);
  });
}

void residual_backward(bf16_t* da, bf16_t* db, const bf16_t* dout, std::size_t n) {
  elementwise<1, 2>(n, {dout}, {da, db}, true, [](const float* const* in, float* const* o, std::size_t m) {
    residual_backward(o[0], o[1], in[0], m);
  });
}

void scale(bf16_t* x, float s, std::size_t n) {
  for_element_blocks(n, [&](std::size_t i0, std::size_t i1) {
    const std::size_t m = i1 - i0;
    float* f = buffer(0, m);
    widen_bf16(f, x + i0, m);
    scale(f, s, m);
    narrow_bf16(x + i0, f, m);
  });
}

// ---- cross-entropy --------------------------------------------------------------------------------------

// cross_entropy.cpp's rows, each widened into a buffer that also receives its gradient (the row function
// allows the alias) before it is rounded into dlogits.
float cross_entropy_forward_backward(bf16_t* dlogits, float* losses, const bf16_t* logits,
                                     const std::int32_t* targets, int N, int V, float grad_scale,
                                     int n_valid) {
  const std::size_t v = std::size_t(V);
  return impl::cross_entropy_rows(
      losses, targets, N, V, grad_scale, n_valid, [&](std::size_t i, float gscale) {
        float* row = buffer(0, v);
        widen_bf16(row, logits + i * v, v);
        const double loss =
            impl::cross_entropy_row(dlogits != nullptr ? row : nullptr, row, targets[i], V, gscale);
        if (dlogits != nullptr) narrow_bf16(dlogits + i * v, row, v);
        return loss;
      });
}

}  // namespace strata::kernels::cpu
