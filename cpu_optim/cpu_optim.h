// strata/cpu_optim/cpu_optim.h: SIMD Adam/AdamW, Adagrad and Lion over one optimizer shard.
//
// Example (one optimizer step over the shards of a rank, fp16 training with gradient clipping):
//   namespace co = strata::cpu_optim;
//   co::Optimizer opt({.simd = "auto", .threads = 0, .pin = false});   // opt.target() is e.g. "avx2"
//   // 1. Global overflow check and norm, before any shard changes (one read of the gradients).
//   double sum_sq = 0;
//   bool finite = true;
//   for (auto& s : shards) {
//     co::GradStats st = opt.grad_stats(s.grads, strata::DType::fp32, s.n, 1.0f / loss_scale);
//     sum_sq += st.sum_sq;
//     finite = finite && st.finite;
//   }
//   if (!finite) { /* skip the step, lower the loss scale */ }
//   const double norm = std::sqrt(sum_sq);
//   const float clip = norm > max_norm ? float(max_norm / (norm + 1e-6)) : 1.0f;
//   // 2. The update, one call per shard; unscale and clip are folded into one gradient scale.
//   co::AdamParams hp{.lr = 1e-4f, .weight_decay = 0.1f, .adamw = true};
//   for (auto& s : shards) {
//     co::Shard sh{.params = s.master,    .grads = s.grads,         // fp32 (n), fp32 (n)
//                  .exp_avg = s.m,        .exp_avg_sq = s.v,        // fp32 (n) each
//                  .out = s.working_bf16, .n = s.n};                // bf16 (n): the copy sent back
//     opt.adam(s.step_state, hp, step, sh, clip / loss_scale);
//   }
//
// Arithmetic. Every element's update is computed in fp32 in the fixed order below (the same as
// kernels/cpu/ops.h's AdamW), with the gradient first multiplied by grad_scale. No operation mixes
// elements, so results are bit-identical whatever the thread count or the split of a shard into calls.
// The library is built with -ffp-contract=off and uses only correctly rounded IEEE operations (add, mul,
// div, sqrt; no FMA, no approximate reciprocal or square root), so results are also bit-identical across
// the SIMD targets and equal to the scalar fp32 formula (tests check this on every x86 target the CPU
// runs; AArch64's NEON/SVE divide and square root are IEEE as well, but untested here). This assumes the
// default floating-point environment: round to nearest, no flush-to-zero or denormals-are-zero.
// Fused multiply-adds are left out on purpose: kernels/ computes the same AdamW on the CPU and on the GPU
// (with unfused _rn intrinsics), so a shard's update is bit-identical whether its state lives on the
// device or is offloaded, and a run can move state between tiers without changing its losses. The update
// is bound by memory traffic, so fusing would not make it measurably faster.
//   Adam/AdamW (bc1 = 1 - beta1^step, bc2 = 1/sqrt(1 - beta2^step), both 1 without bias correction;
//   step_size = -lr/bc1 and w_decay = -lr*weight_decay are computed in double and rounded to fp32):
//     g = grad * grad_scale;   if (!adamw && weight_decay != 0) g = p * weight_decay + g
//     m = beta1 * m + (1 - beta1) * g;      v = beta2 * v + (1 - beta2) * (g * g)
//     u = m / (sqrt(v) * bc2 + eps);        if (adamw && weight_decay != 0) p = p + w_decay * p
//     p = p + step_size * u
//   Adagrad (PyTorch's, weight decay as L2; exp_avg_sq holds the running sum of squares):
//     g = grad * grad_scale;   if (weight_decay != 0) g = p * weight_decay + g
//     v = v + g * g;           p = p + (-lr) * (g / (sqrt(v) + eps))
//   Lion (Chen et al. 2023; decoupled weight decay; sign(0) = 0, sign(NaN) = NaN):
//     g = grad * grad_scale;   c = beta1 * m + (1 - beta1) * g
//     if (weight_decay != 0) p = p + w_decay * p;     p = p + (-lr) * sign(c)
//     m = beta2 * m + (1 - beta2) * g
// (1 - beta) is computed in fp32. bf16 states are widened on load and rounded to nearest even on store;
// the low-precision output is the new fp32 p rounded to nearest even (core/dtype.h defines both roundings).
//
// Non-finite gradients. Every update call also checks the scaled gradients and returns false when one is
// NaN or infinite; by then the shard holds the result of using them. A step that may have to be skipped
// (fp16 loss scaling) is therefore decided with grad_stats() over all shards first, as above: one read of
// the gradients yields the overflow flag and the squared norm for clipping together.
//
// Threads. Each call splits its shard into one contiguous range per thread of the Optimizer's own oneTBB
// arena (the calling thread takes part); shards under 64K elements run on the calling thread alone.
// Several threads may call one Optimizer at once; the calls share its arena.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace strata::cpu_optim {

// The buffers of one shard: n elements each, each aligned to its element size (no other alignment is
// needed). Buffers an optimizer does not use may be null (Adagrad: exp_avg; Lion: exp_avg_sq). No two
// may overlap.
struct Shard {
  float* params = nullptr;      // (n) fp32 master parameters, updated in place
  const void* grads = nullptr;  // (n) grad_dtype: fp32, bf16 or fp16; read only
  void* exp_avg = nullptr;      // (n) state_dtype: first moment (Adam, AdamW, Lion)
  void* exp_avg_sq = nullptr;   // (n) state_dtype: second moment (Adam, AdamW), sum of squares (Adagrad)
  void* out = nullptr;          // (n) out_dtype or null: the new params, rounded, written in the same pass
  std::size_t n = 0;
  DType grad_dtype = DType::fp32;
  DType state_dtype = DType::fp32;  // f32 or bf16
  DType out_dtype = DType::bf16;    // bf16 or f16; ignored when out is null
};

// Hyper-parameters, with DeepSpeed's / PyTorch's defaults. Any of them may change between calls.
struct AdamParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;    // [0, 1)
  float beta2 = 0.999f;  // [0, 1)
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool adamw = true;  // true: decoupled weight decay (AdamW); false: L2 added to the gradient (Adam)
  bool bias_correction = true;
};

struct AdagradParams {
  float lr = 1e-2f;
  float eps = 1e-10f;
  float weight_decay = 0.0f;  // L2, added to the gradient
};

struct LionParams {
  float lr = 1e-4f;
  float beta1 = 0.9f;         // [0, 1]
  float beta2 = 0.99f;        // [0, 1]
  float weight_decay = 0.0f;  // decoupled
};

// Step bookkeeping of one shard; the caller keeps one per shard (and checkpoints it). Steps are numbered
// from 1 by the caller. A call with a step number above `step` updates the shard and records it; a call
// that repeats `step` changes nothing and returns the recorded `finite`, so sub-groups can be stepped one
// at a time (or early, as their gradients land) and a later sweep over all shards does not update any
// twice; a smaller step number raises ConfigError. Adam's bias corrections are computed from the step
// number and the betas of each call, so changing the betas mid-run takes effect at once.
struct ShardStep {
  std::int64_t step = 0;  // last step applied to this shard; 0: none yet
  bool finite = true;     // whether that step's scaled gradients were all finite
};

// The block grad_stats sums over (Note [deterministic norm] in grad_stats.cpp).
inline constexpr std::size_t kGradStatsBlock = 8192;

struct GradStats {
  double sum_sq = 0.0;  // sum of (grad * scale)^2 in double: deterministic, identical on every target
  bool finite = true;   // false when some grad * scale is NaN or infinite (sum_sq is then not finite)
};

struct Options {
  // strata.cpu_optim.simd: "auto" (the best target this CPU runs) or one compiled target by its Highway
  // name in lower case: on x86 "avx3" (AVX-512), "avx2", "sse4", and the portable fallback ("scalar", or
  // "emu128" where the compiler lets Highway build that one; either name selects the fallback); on Arm
  // "sve2", "sve", "neon". The environment variable STRATA_CPU_OPTIM_SIMD, when set and non-empty,
  // takes precedence (for tests and benchmarks). A name that is not compiled in, or that this CPU cannot
  // run, raises ConfigError listing the usable ones.
  std::string simd = "auto";
  // strata.threads: threads per call, the calling thread included; 0 = oneTBB's default concurrency
  // (every cpu the process may run on). More than that splits each shard into this many ranges but runs
  // only that many at once. Negative raises ConfigError.
  int threads = 0;
  // strata.cpu_optim.pin_threads: bind each thread to one cpu of `cpus` (empty: core/topology's list of
  // every cpu) while it works on a call (its previous affinity is restored when it leaves). Off by
  // default.
  bool pin = false;
  std::vector<int> cpus = {};
  // Write the low-precision output with non-temporal (streaming) stores where the address allows: it is
  // written once and read next by a copy to the device, so it need not displace cached data, and the
  // stores skip the read-for-ownership of each line (2 bytes per element less traffic). Off: ordinary
  // stores (better when the output is read back from cache right away).
  bool stream_output = true;
};

// The SIMD targets compiled into this build, best first, by lower-case name ("avx3", "avx2", ...).
std::vector<std::string> compiled_targets();
// Those of them this CPU can run, best first.
std::vector<std::string> supported_targets();
// The target an Optimizer constructed with Options::simd = `simd` would use here (STRATA_CPU_OPTIM_SIMD
// included); throws ConfigError as the constructor would.
std::string chosen_target(const std::string& simd = "auto");

class Optimizer {
 public:
  explicit Optimizer(const Options& options = {});
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  const std::string& target() const;  // the SIMD target in use, e.g. "avx2"
  int threads() const;

  // One update of one shard at step `step` (see ShardStep), gradients multiplied by grad_scale first.
  // Returns whether every scaled gradient was finite. Throws strata::Error on a null or misaligned
  // buffer or an unsupported dtype, and ConfigError on betas out of range or a step number that goes
  // backwards; nothing is modified when it throws.
  bool adam(ShardStep& state, const AdamParams& hp, std::int64_t step, const Shard& shard,
            float grad_scale = 1.0f);
  bool adagrad(ShardStep& state, const AdagradParams& hp, std::int64_t step, const Shard& shard,
               float grad_scale = 1.0f);
  bool lion(ShardStep& state, const LionParams& hp, std::int64_t step, const Shard& shard,
            float grad_scale = 1.0f);

  // The squared L2 norm of grads * scale, and whether all were finite, in one read. Summed in double
  // over fixed blocks combined in a fixed order: identical whatever the thread count and SIMD target.
  GradStats grad_stats(const void* grads, DType grad_dtype, std::size_t n, float scale = 1.0f);
  // grad_stats' partial sums, one per block of kGradStatsBlock elements (the last may be short), in
  // block order: grad_stats(g, n).sum_sq is 0.0 + sums[0] + sums[1] + ... added left to right. So the
  // norm of an array cut into slices at multiples of kGradStatsBlock (ranks' shards) can be summed to the
  // same bits as over the whole.
  std::vector<double> grad_block_sums(const void* grads, DType grad_dtype, std::size_t n, float scale = 1.0f);

  // Runs fn(begin, end) over the same per-thread contiguous ranges of [0, n) that the update calls use,
  // on the same threads (benchmarks measure their ceilings this way).
  void for_each_range(std::size_t n, const std::function<void(std::size_t, std::size_t)>& fn);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::cpu_optim
