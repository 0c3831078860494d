// strata/cpu_optim/adam.cpp: the Adam / AdamW update, compiled once per SIMD target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu_optim/adam.cpp"
#include "hwy/foreach_target.h"  // must come before highway.h

#include "cpu_optim/kernels_impl.h"
#include "cpu_optim/simd-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace strata::cpu_optim::HWY_NAMESPACE {

// The formula of cpu_optim.h, one vector at a time. The weight decay variant is a template parameter so
// that the common cases (none, decoupled) carry no dead arithmetic.
template <impl::AdamDecay kDecay>
struct AdamOp {
  static constexpr bool kM = true, kV = true, kReadsP = kDecay == impl::AdamDecay::l2;
  // g = +-inf or NaN makes m NaN or infinite and v NaN or +inf (1 - beta > 0), so m / (sqrt(v) * bias2
  // + eps) and then p are NaN.
  static constexpr bool kNaNOnNonfinite = true;
  VF beta1, one_minus_beta1, beta2, one_minus_beta2, eps, bias2, step_size, weight_decay, w_decay;

  explicit AdamOp(const impl::UpdateArgs& a)
      : beta1(hn::Set(DF(), a.beta1)),
        one_minus_beta1(hn::Set(DF(), a.one_minus_beta1)),
        beta2(hn::Set(DF(), a.beta2)),
        one_minus_beta2(hn::Set(DF(), a.one_minus_beta2)),
        eps(hn::Set(DF(), a.eps)),
        bias2(hn::Set(DF(), a.bias2)),
        step_size(hn::Set(DF(), a.step_size)),
        weight_decay(hn::Set(DF(), a.weight_decay)),
        w_decay(hn::Set(DF(), a.w_decay)) {}

  // The step direction m / (sqrt(v) * bias2 + eps), after moving the moments; p is only read (L2).
  HWY_INLINE VF Direction(VF p, VF g, VF& m, VF& v) const {
    if constexpr (kDecay == impl::AdamDecay::l2) g = hn::Add(hn::Mul(p, weight_decay), g);
    m = hn::Add(hn::Mul(beta1, m), hn::Mul(one_minus_beta1, g));
    v = hn::Add(hn::Mul(beta2, v), hn::Mul(one_minus_beta2, hn::Mul(g, g)));
    return hn::Div(m, hn::Add(hn::Mul(hn::Sqrt(v), bias2), eps));
  }
  HWY_INLINE void Apply(VF& p, VF u) const {
    if constexpr (kDecay == impl::AdamDecay::decoupled) p = hn::Add(p, hn::Mul(w_decay, p));
    p = hn::Add(p, hn::Mul(step_size, u));
  }
};

const impl::UpdateTable* AdamTableNone() {
  return MakeTable<AdamOp<impl::AdamDecay::none>>();
}
const impl::UpdateTable* AdamTableL2() {
  return MakeTable<AdamOp<impl::AdamDecay::l2>>();
}
const impl::UpdateTable* AdamTableDecoupled() {
  return MakeTable<AdamOp<impl::AdamDecay::decoupled>>();
}

}  // namespace strata::cpu_optim::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::cpu_optim {

HWY_EXPORT(AdamTableNone);
HWY_EXPORT(AdamTableL2);
HWY_EXPORT(AdamTableDecoupled);

const impl::UpdateTable* impl::adam_table(AdamDecay decay, std::int64_t target) {
  switch (decay) {
    case AdamDecay::none:
      return find_table(HWY_DISPATCH_TABLE(AdamTableNone), target);
    case AdamDecay::l2:
      return find_table(HWY_DISPATCH_TABLE(AdamTableL2), target);
    case AdamDecay::decoupled:
      return find_table(HWY_DISPATCH_TABLE(AdamTableDecoupled), target);
  }
  return nullptr;
}

}  // namespace strata::cpu_optim
#endif  // HWY_ONCE
