// strata/kernels/cpu/reduce.cpp: scaling, the non-finite check and the squared L2 norm.
#include <atomic>
#include <bit>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/parallel_impl.h"

namespace strata::kernels::cpu {

void scale(float* x, float s, std::size_t n) {
  impl::parallel_for_range(n, impl::kElementGrain, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) x[i] *= s;
  });
}

bool has_nonfinite(const float* x, std::size_t n) {
  std::atomic<bool> found{false};
  impl::parallel_for_range(n, impl::kElementGrain, [&](std::size_t i0, std::size_t i1) {
    if (found.load(std::memory_order_relaxed)) return;
    std::uint32_t bad = 0;
    for (std::size_t i = i0; i < i1; ++i)  // exponent all ones: inf or NaN
      bad |= ((std::bit_cast<std::uint32_t>(x[i]) & 0x7F800000u) == 0x7F800000u);
    if (bad) found.store(true, std::memory_order_relaxed);
  });
  return found.load();
}

// Fixed blocks, partial sums added in block order (Note [deterministic CPU ops]).
double squared_norm(const float* x, std::size_t n) {
  constexpr std::size_t kBlock = 4096;
  const std::size_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(blocks);
  impl::parallel_for_each_index(blocks, 4, [&](std::size_t b) {
    const std::size_t i0 = b * kBlock, i1 = i0 + kBlock < n ? i0 + kBlock : n;
    double s = 0.0;
    for (std::size_t i = i0; i < i1; ++i) s += double(x[i]) * x[i];
    partial[b] = s;
  });
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace strata::kernels::cpu
