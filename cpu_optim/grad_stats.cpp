// strata/cpu_optim/grad_stats.cpp: squared L2 norm of the scaled gradients, compiled once per SIMD target.
//
// Note [deterministic norm]: the sum must not depend on the thread count or the SIMD width. The array is
// cut into fixed blocks of kStatsBlock elements (whole blocks go to threads); inside a block, element j
// is added to virtual lane j % kVirtualLanes in element order, in double (the square of an fp32 value is
// exact in double, so fused and unfused multiply-adds agree); the lanes are then added in lane order and
// the blocks in block order. A vector target maps kVirtualLanes onto kVirtualLanes / Lanes accumulators;
// elements after the last whole group of a block take the same lanes one at a time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu_optim/grad_stats.cpp"
#include "hwy/foreach_target.h"  // must come before highway.h

#include "core/dtype.h"
#include "cpu_optim/kernels_impl.h"
#include "cpu_optim/simd-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace strata::cpu_optim::HWY_NAMESPACE {

using DD = hn::ScalableTag<double>;
using VD = hn::Vec<DD>;

// Adds x^2 (x one fp32 vector) into the double accumulators of its virtual lanes, lo half then hi half.
HWY_INLINE void AddSquares(VF x, double* acc) {
  const DD dd;
#if HWY_TARGET == HWY_SCALAR
  const VD d = hn::PromoteTo(dd, x);
  hn::Store(hn::Add(hn::Load(dd, acc), hn::Mul(d, d)), dd, acc);
#else
  const size_t ld = hn::Lanes(dd);
  const hn::Half<DF> dh;
  const VD lo = hn::PromoteTo(dd, hn::LowerHalf(dh, x));
  const VD hi = hn::PromoteTo(dd, hn::UpperHalf(dh, x));
  hn::Store(hn::Add(hn::Load(dd, acc), hn::Mul(lo, lo)), dd, acc);
  hn::Store(hn::Add(hn::Load(dd, acc + ld), hn::Mul(hi, hi)), dd, acc + ld);
#endif
}

template <int G>
void SumSq(const void* g, size_t n, float scale_f, size_t first_block, size_t last_block, double* sums) {
  const DF df;
  const size_t L = hn::Lanes(df);
  const VF scale = hn::Set(df, scale_f);
  const size_t group = impl::kVirtualLanes;
  for (size_t blk = first_block; blk < last_block; ++blk) {
    const size_t begin = blk * impl::kStatsBlock;
    const size_t end = std::min(n, begin + impl::kStatsBlock);
    // The accumulators live in L1: each lane's chain has one add per group of 32 elements.
    HWY_ALIGN double acc[impl::kVirtualLanes] = {};
    size_t i = begin;
    for (; 2 * L <= group && i + group <= end; i += group) {
      for (size_t j = 0; j < group; j += 2 * L) {
        VF a, b;
        Load2<G>(g, i + j, a, b);
        AddSquares(hn::Mul(a, scale), acc + j);
        AddSquares(hn::Mul(b, scale), acc + j + L);
      }
    }
    for (size_t j = 0; i < end; ++i, ++j) {
      const float x = G == kF32    ? static_cast<const float*>(g)[i]
                      : G == kBF16 ? bf16_to_f32(static_cast<const uint16_t*>(g)[i])
                                   : f16_to_f32(static_cast<const uint16_t*>(g)[i]);
      const double d = double(x * scale_f);
      acc[j] = acc[j] + d * d;
    }
    double s = 0.0;
    for (size_t j = 0; j < group; ++j) s += acc[j];
    sums[blk] = s;
  }
}

const impl::StatsTable* StatsTable() {
  static const impl::StatsTable table = [] {
    impl::StatsTable t;
    t.target = HWY_TARGET;
    t.fn[0] = &SumSq<kF32>;
    t.fn[1] = &SumSq<kBF16>;
    t.fn[2] = &SumSq<kF16>;
    return t;
  }();
  return &table;
}

}  // namespace strata::cpu_optim::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::cpu_optim {

HWY_EXPORT(StatsTable);

const impl::StatsTable* impl::stats_table(std::int64_t target) {
  return find_table(HWY_DISPATCH_TABLE(StatsTable), target);
}

}  // namespace strata::cpu_optim
#endif  // HWY_ONCE
