// strata/cpu_optim/kernels_impl.h: what the per-target kernel files export to the dispatcher.
//
// Each kernel file (adam.cpp, adagrad.cpp, lion.cpp, grad_stats.cpp) is compiled once per SIMD target
// through Highway's foreach_target.h and exports, per target, a table of function pointers: one per
// combination of gradient, state and output dtype. The dispatcher (target.cpp) asks each file for the
// table of one target by its Highway bit, so a caller can pick the target per Optimizer rather than
// through Highway's process-wide choice.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu_optim/cpu_optim.h"
#include "hwy/targets.h"

namespace strata::cpu_optim::impl {

// The scalars of one update call, already in the form the kernels use (see cpu_optim.h's formulas).
struct UpdateArgs {
  float* p = nullptr;       // (n) fp32
  const void* g = nullptr;  // (n) grad dtype
  void* m = nullptr;        // (n) state dtype, or null when the optimizer has no first moment
  void* v = nullptr;        // (n) state dtype, or null when it has no second moment
  void* out = nullptr;      // (n) out dtype, or null
  float grad_scale = 1.0f;
  float beta1 = 0, one_minus_beta1 = 0, beta2 = 0, one_minus_beta2 = 0;
  float eps = 0;
  float bias2 = 1;         // Adam: 1 / sqrt(1 - beta2^step)
  float step_size = 0;     // Adam: -lr / (1 - beta1^step); Adagrad, Lion: -lr
  float weight_decay = 0;  // L2 coefficient
  float w_decay = 0;       // decoupled: -lr * weight_decay
  bool stream_out = true;  // non-temporal stores for `out` where it is vector-aligned
};

// Updates elements [begin, end); returns false if any scaled gradient there was not finite.
using UpdateFn = bool (*)(const UpdateArgs& a, std::size_t begin, std::size_t end);

// dtype indices: grads 0 fp32, 1 bf16, 2 fp16; states 0 fp32, 1 bf16; out 0 none, 1 bf16, 2 fp16.
struct UpdateTable {
  std::int64_t target = 0;  // Highway target bit
  UpdateFn fn[3][2][3] = {};
};

// Weight decay variants of Adam, chosen per call (a zero weight decay costs nothing).
enum class AdamDecay { none = 0, l2 = 1, decoupled = 2 };

// Sum of squares of grads * scale over whole blocks [first_block, last_block) of kStatsBlock elements
// (the last block of the array may be short: n bounds it), one double per block into block_sums.
inline constexpr std::size_t kStatsBlock = kGradStatsBlock;
inline constexpr std::size_t kVirtualLanes = 32;  // see grad_stats.cpp, Note [deterministic norm]
using SumSqFn = void (*)(const void* g, std::size_t n, float scale, std::size_t first_block,
                         std::size_t last_block, double* block_sums);
struct StatsTable {
  std::int64_t target = 0;
  SumSqFn fn[3] = {};  // by grad dtype
};

// The entry of `target` in a Highway dispatch table (HWY_DISPATCH_TABLE of an exported function that
// returns a table), or null when that target is not compiled in. Only that entry is called: calling
// another target's function could execute instructions this CPU lacks. The index follows Highway's
// layout (hwy/targets.h): entry 0 is its own chooser, then one entry per dynamic target in bit order,
// the fallback (EMU128 or SCALAR) last; a single-target build has just one entry.
template <class Table, std::size_t N>
const Table* find_table(const Table* (*const (&fns)[N])(), std::int64_t target) {
  std::size_t index = 0;
  if constexpr (N > 1) {
    std::int64_t mask = HWY_CHOSEN_TARGET_SHIFT(target);
    if (mask == 0) mask = HWY_CHOSEN_TARGET_MASK_SCALAR;
    index = std::size_t(__builtin_ctzll(std::uint64_t(mask)));
  }
  if (index >= N || fns[index] == nullptr) return nullptr;
  const Table* t = fns[index]();
  return t->target == target ? t : nullptr;
}

// The table of `target` (a Highway target bit), or null when that target is not compiled in.
const UpdateTable* adam_table(AdamDecay decay, std::int64_t target);
const UpdateTable* adagrad_table(bool l2, std::int64_t target);
const UpdateTable* lion_table(bool decoupled, std::int64_t target);
const StatsTable* stats_table(std::int64_t target);

}  // namespace strata::cpu_optim::impl
