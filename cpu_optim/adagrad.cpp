// strata/cpu_optim/adagrad.cpp: the Adagrad update, compiled once per SIMD target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu_optim/adagrad.cpp"
#include "hwy/foreach_target.h"  // must come before highway.h

#include "cpu_optim/kernels_impl.h"
#include "cpu_optim/simd-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace strata::cpu_optim::HWY_NAMESPACE {

// The formula of cpu_optim.h; exp_avg_sq holds the running sum of squared gradients.
template <bool kL2>
struct AdagradOp {
  static constexpr bool kM = false, kV = true, kReadsP = kL2;
  // g = +-inf or NaN makes v NaN or +inf, so g / (sqrt(v) + eps) and then p are NaN.
  static constexpr bool kNaNOnNonfinite = true;
  VF eps, step_size, weight_decay;

  explicit AdagradOp(const impl::UpdateArgs& a)
      : eps(hn::Set(DF(), a.eps)),
        step_size(hn::Set(DF(), a.step_size)),
        weight_decay(hn::Set(DF(), a.weight_decay)) {}

  HWY_INLINE VF Direction(VF p, VF g, VF& /*m*/, VF& v) const {
    if constexpr (kL2) g = hn::Add(hn::Mul(p, weight_decay), g);
    v = hn::Add(v, hn::Mul(g, g));
    return hn::Div(g, hn::Add(hn::Sqrt(v), eps));
  }
  HWY_INLINE void Apply(VF& p, VF u) const { p = hn::Add(p, hn::Mul(step_size, u)); }
};

const impl::UpdateTable* AdagradTablePlain() {
  return MakeTable<AdagradOp<false>>();
}
const impl::UpdateTable* AdagradTableL2() {
  return MakeTable<AdagradOp<true>>();
}

}  // namespace strata::cpu_optim::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::cpu_optim {

HWY_EXPORT(AdagradTablePlain);
HWY_EXPORT(AdagradTableL2);

const impl::UpdateTable* impl::adagrad_table(bool l2, std::int64_t target) {
  return l2 ? find_table(HWY_DISPATCH_TABLE(AdagradTableL2), target)
            : find_table(HWY_DISPATCH_TABLE(AdagradTablePlain), target);
}

}  // namespace strata::cpu_optim
#endif  // HWY_ONCE
