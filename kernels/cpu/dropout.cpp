// strata/kernels/cpu/dropout.cpp: dropout with a counter-based mask (kernels/cpu/ops.h), fp32 and bf16.
// Each element's factor depends on (key, its index) alone (kernels/cpu/dropout_impl.h), so any split of
// the elements over threads gives the same bits.
#include <cstring>

#include "kernels/cpu/dropout_impl.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/parallel_impl.h"

namespace strata::kernels::cpu {
namespace {

// out[i] = round(widen(in[i]) * factor(i)) over [0, n); T = float (round: none) or bf16_t.
template <typename T, typename Widen, typename Round>
void masked(T* out, const T* in, std::size_t n, double p, std::uint64_t key, Widen widen, Round round) {
  if (p == 0) {  // nothing dropped, a factor of 1: the identity
    if (out != in && n > 0) std::memmove(out, in, n * sizeof(T));
    return;
  }
  const impl::DropoutScalars d = impl::dropout_scalars(p);
  impl::parallel_for_range(n, impl::kElementGrain, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i)
      out[i] = round(widen(in[i]) * impl::dropout_factor(key, i, d.threshold, d.scale));
  });
}

}  // namespace

void dropout(float* out, const float* in, std::size_t n, double p, std::uint64_t key) {
  masked(
      out, in, n, p, key, [](float x) { return x; }, [](float x) { return x; });
}

void dropout(bf16_t* out, const bf16_t* in, std::size_t n, double p, std::uint64_t key) {
  masked(
      out, in, n, p, key, [](bf16_t x) { return bf16_to_f32(x); }, [](float x) { return f32_to_bf16(x); });
}

std::uint64_t dropout_key(std::uint64_t key, std::uint64_t value) {
  return impl::mix_key(key, value);
}

}  // namespace strata::kernels::cpu
