// strata/kernels/cpu/attention_fused.h: causal grouped-query attention on bf16 tensors that never holds
// the (B, NH, T, T) probabilities — flash attention's blocking on the CPU, for the host backend's bf16
// path (Note [Fused attention on the CPU] in attention_fused.cpp). Semantics, layouts, the head mapping
// g = h / (NH / NKV) and the sliding window (0: none) are ops.h's attention_forward / attention_backward,
// which stay the oracle; with a window the key blocks left of the band are skipped, and so with per-token
// positions `pos` ((B,T) i32 or null, Note [Document masks] in ops.h) those before a row's document.
//
// Example (q, k, v, dout, out, dq, dk, dv bf16; saved and scratch fp32):
//   using namespace strata::kernels::cpu;
//   std::vector<float> saved(attention_fused_saved(B, T, NH, HD));        // kept from forward to backward
//   std::vector<float> scratch(attention_fused_scratch(B, T, NKV, HD));   // backward only
//   attention_fused_forward(out, saved.data(), q, k, v, B, T, NH, NKV, HD, window);
//   ...                                                                   // out kept, unchanged
//   attention_fused_backward(dq, dk, dv, scratch.data(), dout, q, k, v, out, saved.data(), B, T, NH, NKV,
//                            HD, window);
//
// Threads: oneTBB tasks, each running single-threaded products; every output element is reduced in a fixed
// order inside one task, so results are bit-identical whatever the oneTBB thread count and whatever the
// backward's scratch budget (FusedPaths::scratch_elements).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/ops.h"

namespace strata::kernels::cpu {

// fp32 elements the forward leaves in `saved` for the backward: each query row's log-sum-exp of its scaled
// scores, (B, NH, T): B*NH*T (HD unused). The backward reads out from its caller for D = rowsum(dout * out).
std::size_t attention_fused_saved(int B, int T, int NH, int HD);

// The backward's fp32 dk and dv sums take at most this many fp32 elements of scratch by default (64 MiB;
// Note [Fused attention on the CPU], the waves).
inline constexpr std::size_t kFusedScratchElements = std::size_t(1) << 24;
// fp32 elements of the backward's scratch: `slots` tasks' fp32 sums of dk and dv, (slots, 2, T, HD), each
// rounded to bf16 once at the end, with slots = max(1, min(B*NKV, budget / (2*T*HD))) and budget =
// scratch_elements, or kFusedScratchElements for 0 — the value the backward is given in FusedPaths. So at
// most max(budget, 2*T*HD) elements. Besides it, each thread keeps buffers of O(128 x 128 + 128 x HD)
// elements.
std::size_t attention_fused_scratch(int B, int T, int NKV, int HD, std::size_t scratch_elements = 0);

// How the blocks run. The default is the fastest path this CPU has; tests pick each one.
//   products: best is oneDNN's bf16 matmul where it is native here (bf16_matmul_impl() not empty), else
//             plain loops over the widened bf16 values with fp32 sums (correct, not fast: what a build
//             without oneDNN runs); loops forces those.
//   rows:     the row passes (e^x, row maxima and sums, rounding to bf16) are compiled for x86-64's
//             baseline (SSE2), AVX2 and AVX-512 and one is chosen at run time; all give the same bits (no
//             FMA, every sum in the same order). A target this CPU lacks falls back to the best it has.
//   scratch_elements: the backward's budget of fp32 scratch elements for its dk, dv sums; 0 (the default)
//             is kFusedScratchElements. Its scratch must hold attention_fused_scratch(..., the same value)
//             elements. Any budget gives the same bits; a smaller one runs fewer tasks at once.
enum class FusedProducts { best, loops };
enum class FusedRows { best, baseline, avx2, avx512 };
struct FusedPaths {
  FusedProducts products = FusedProducts::best;
  FusedRows rows = FusedRows::best;
  std::size_t scratch_elements = 0;
};
// The row-pass target that `rows` runs on this CPU (never best).
FusedRows attention_fused_rows(FusedRows rows);

// WRITES out and saved (attention_fused_saved elements).
void attention_fused_forward(bf16_t* out /*(B,T,NH,HD)*/, float* saved /*attention_fused_saved*/,
                             const bf16_t* q /*(B,T,NH,HD)*/, const bf16_t* k /*(B,T,NKV,HD)*/,
                             const bf16_t* v /*(B,T,NKV,HD)*/, int B, int T, int NH, int NKV, int HD,
                             int window = 0, const std::int32_t* pos = nullptr, const FusedPaths& paths = {});
// WRITES dq, dk, dv (=), each rounded to bf16 once from its fp32 sum. scratch (attention_fused_scratch
// elements for paths.scratch_elements) is overwritten; out and saved are the forward's, unchanged.
void attention_fused_backward(bf16_t* dq /*(B,T,NH,HD)*/, bf16_t* dk /*(B,T,NKV,HD)*/,
                              bf16_t* dv /*(B,T,NKV,HD)*/, float* scratch /*attention_fused_scratch*/,
                              const bf16_t* dout /*(B,T,NH,HD)*/, const bf16_t* q /*(B,T,NH,HD)*/,
                              const bf16_t* k /*(B,T,NKV,HD)*/, const bf16_t* v /*(B,T,NKV,HD)*/,
                              const bf16_t* out /*(B,T,NH,HD) the forward's*/,
                              const float* saved /*attention_fused_saved*/, int B, int T, int NH, int NKV,
                              int HD, int window = 0, const std::int32_t* pos = nullptr,
                              const FusedPaths& paths = {});

}  // namespace strata::kernels::cpu
