// strata/cpu_optim/lion.cpp: the Lion update, compiled once per SIMD target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu_optim/lion.cpp"
#include "hwy/foreach_target.h"  // must come before highway.h

#include "cpu_optim/kernels_impl.h"
#include "cpu_optim/simd-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace strata::cpu_optim::HWY_NAMESPACE {

// The formula of cpu_optim.h: the step is the sign of an interpolation between the momentum and the
// gradient (sign(0) = 0, sign(NaN) = NaN); the momentum then moves with beta2.
template <bool kDecoupled>
struct LionOp {
  static constexpr bool kM = true, kV = false, kReadsP = false;
  static constexpr bool kNaNOnNonfinite = false;  // an infinite g gives sign +-1: checked one by one
  VF beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, w_decay;

  explicit LionOp(const impl::UpdateArgs& a)
      : beta1(hn::Set(DF(), a.beta1)),
        one_minus_beta1(hn::Set(DF(), a.one_minus_beta1)),
        beta2(hn::Set(DF(), a.beta2)),
        one_minus_beta2(hn::Set(DF(), a.one_minus_beta2)),
        step_size(hn::Set(DF(), a.step_size)),
        w_decay(hn::Set(DF(), a.w_decay)) {}

  // The sign of the interpolation, after moving the momentum.
  HWY_INLINE VF Direction(VF /*p*/, VF g, VF& m, VF& /*v*/) const {
    const DF df;
    const VF zero = hn::Zero(df);
    const VF c = hn::Add(hn::Mul(beta1, m), hn::Mul(one_minus_beta1, g));
    m = hn::Add(hn::Mul(beta2, m), hn::Mul(one_minus_beta2, g));
    return hn::IfThenElse(hn::Gt(c, zero), hn::Set(df, 1.0f),
                          hn::IfThenElse(hn::Lt(c, zero), hn::Set(df, -1.0f), hn::Mul(c, zero)));
  }
  HWY_INLINE void Apply(VF& p, VF sign) const {
    if constexpr (kDecoupled) p = hn::Add(p, hn::Mul(w_decay, p));
    p = hn::Add(p, hn::Mul(step_size, sign));
  }
};

const impl::UpdateTable* LionTablePlain() {
  return MakeTable<LionOp<false>>();
}
const impl::UpdateTable* LionTableDecoupled() {
  return MakeTable<LionOp<true>>();
}

}  // namespace strata::cpu_optim::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::cpu_optim {

HWY_EXPORT(LionTablePlain);
HWY_EXPORT(LionTableDecoupled);

const impl::UpdateTable* impl::lion_table(bool decoupled, std::int64_t target) {
  return decoupled ? find_table(HWY_DISPATCH_TABLE(LionTableDecoupled), target)
                   : find_table(HWY_DISPATCH_TABLE(LionTablePlain), target);
}

}  // namespace strata::cpu_optim
#endif  // HWY_ONCE
