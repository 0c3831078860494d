// strata/kernels/cpu/parallel_impl.h: the loop helpers the CPU ops share (internal to kernels/cpu).
//
// Note [deterministic CPU ops]: every op splits its work so that each output element is produced by one
// task, reducing its terms in a fixed order. Which thread runs a task, and how oneTBB splits the ranges,
// then cannot change a single bit of the result. Reductions across elements (norms, losses) go through
// fixed-size blocks whose partial sums are added in block order.
#pragma once

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cstddef>

namespace strata::kernels::cpu::impl {

// Calls fn(i) for i in [0, n), in parallel. grain: the fewest iterations worth a task.
template <typename Fn>
void parallel_for_each_index(std::size_t n, std::size_t grain, Fn&& fn) {
  if (n == 0) return;
  if (n <= grain) {
    for (std::size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, grain),
                    [&](const tbb::blocked_range<std::size_t>& r) {
                      for (std::size_t i = r.begin(); i != r.end(); ++i) fn(i);
                    });
}

// Calls fn(begin, end) over [0, n) in parallel, on sub-ranges of at least grain elements (elementwise ops).
template <typename Fn>
void parallel_for_range(std::size_t n, std::size_t grain, Fn&& fn) {
  if (n == 0) return;
  if (n <= grain) {
    fn(std::size_t{0}, n);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, grain),
                    [&](const tbb::blocked_range<std::size_t>& r) { fn(r.begin(), r.end()); });
}

// Elements per task for elementwise ops: large enough to amortise scheduling, small enough to balance.
inline constexpr std::size_t kElementGrain = 16384;

}  // namespace strata::kernels::cpu::impl
