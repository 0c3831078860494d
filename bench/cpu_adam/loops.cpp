// bench/cpu_adam/loops.cpp: the ceiling and unfused loops of loops.h, once per SIMD target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/cpu_adam/loops.cpp"
#include "hwy/foreach_target.h"  // must come before highway.h

#include <bit>
#include <utility>

#include "bench/cpu_adam/loops.h"
#include "core/dtype.h"
#include "cpu_optim/simd-inl.h"  // the optimizer's own rounding store, for the unfused output pass
#include "hwy/cache_control.h"
#include "hwy/highway.h"

// Per-target tables of loops (defined once, outside the per-target code this file repeats).
#ifndef STRATA_BENCH_CPU_ADAM_TABLES
#define STRATA_BENCH_CPU_ADAM_TABLES
namespace strata::bench {
using CeilingFn = void (*)(const Arrays&, size_t, size_t, bool, bool);
struct CeilingTable {
  int64_t target;
  CeilingFn fn[2][2][2][2];  // [grads 16-bit][states 16-bit][output][states - 1]
};
using UnfusedFn = void (*)(int, const Arrays&, const UnfusedScalars&, size_t, size_t);
struct UnfusedTable {
  int64_t target;
  UnfusedFn fn;
};
}  // namespace strata::bench
#endif

HWY_BEFORE_NAMESPACE();
namespace strata::bench::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Two vectors of elements at index i, widened (16-bit: by a shift, as bf16).
template <int kWide>
HWY_INLINE void Load2(const void* base, size_t i, VF& a, VF& b) {
  const DF df;
  const size_t L = hn::Lanes(df);
  if constexpr (kWide == 0) {
    a = hn::LoadU(df, static_cast<const float*>(base) + i);
    b = hn::LoadU(df, static_cast<const float*>(base) + i + L);
  } else {
#if HWY_TARGET == HWY_SCALAR
    const uint16_t* p = static_cast<const uint16_t*>(base) + i;
    a = hn::Set(df, strata::bf16_to_f32(p[0]));
    b = hn::Set(df, strata::bf16_to_f32(p[L]));
#else
    const hn::Rebind<uint16_t, DF> dh;
    const hn::RebindToUnsigned<DF> du;
    const uint16_t* p = static_cast<const uint16_t*>(base) + i;
    a = hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(dh, p))));
    b = hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(dh, p + L))));
#endif
  }
}

template <int kWide>
HWY_INLINE void Store2(VF a, VF b, void* base, size_t i, bool stream) {
  const DF df;
  const size_t L = hn::Lanes(df);
  if constexpr (kWide == 0) {
    hn::StoreU(a, df, static_cast<float*>(base) + i);
    hn::StoreU(b, df, static_cast<float*>(base) + i + L);
  } else {
    uint16_t* p = static_cast<uint16_t*>(base) + i;
#if HWY_TARGET == HWY_SCALAR
    p[0] = uint16_t(std::bit_cast<uint32_t>(hn::GetLane(a)) >> 16);
    p[L] = uint16_t(std::bit_cast<uint32_t>(hn::GetLane(b)) >> 16);
    (void)stream;
#else
    const hn::Repartition<uint16_t, DF> dw;
    const auto w = hn::ConcatOdd(dw, hn::BitCast(dw, b), hn::BitCast(dw, a));  // upper halves: truncation
    if (stream) {
      hn::Stream(w, dw, p);
    } else {
      hn::StoreU(w, dw, p);
    }
#endif
  }
}

template <int G, int S, int O, int K>
void Ceiling(const Arrays& a, size_t begin, size_t end, bool stream_out, bool prefetch) {
  const DF df;
  const size_t L = hn::Lanes(df);
  size_t i = begin;
  // Output streaming needs aligned addresses; the benchmark's arrays are page-aligned and ranges start
  // at multiples of 64 elements, so only check.
  const bool stream =
      O != 0 && stream_out && (reinterpret_cast<uintptr_t>(static_cast<uint16_t*>(a.out) + i) % (4 * L)) == 0;
  namespace co = cpu_optim::HWY_NAMESPACE;
  for (; i + 2 * L <= end; i += 2 * L) {
    if (prefetch) co::PrefetchStep<G, S, true, K == 2>(a.p, a.g, a.m, a.v, i);  // the optimizer's own
    VF p0 = hn::LoadU(df, a.p + i), p1 = hn::LoadU(df, a.p + i + L);
    VF g0, g1, m0, m1, v0, v1;
    Load2<G>(a.g, i, g0, g1);
    Load2<S>(a.m, i, m0, m1);
    if constexpr (K == 2) Load2<S>(a.v, i, v0, v1);
    p0 = hn::Add(p0, g0);
    p1 = hn::Add(p1, g1);
    hn::StoreU(p0, df, a.p + i);
    hn::StoreU(p1, df, a.p + i + L);
    Store2<S>(hn::Add(m0, g0), hn::Add(m1, g1), a.m, i, false);
    // v gains g * g rather than g, so that it never turns negative: the optimizer runs that alternate
    // with this loop on the same arrays then take square roots of non-negative numbers, as in training.
    if constexpr (K == 2)
      Store2<S>(hn::Add(v0, hn::Mul(g0, g0)), hn::Add(v1, hn::Mul(g1, g1)), a.v, i, false);
    if constexpr (O != 0) Store2<1>(p0, p1, a.out, i, stream);
  }
  if (stream) hwy::FlushStream();
  for (; i < end; ++i) a.p[i] += 1.0f;  // the benchmark's sizes leave no tail; keep the loop honest anyway
}

template <size_t... I>
void FillCeiling(CeilingTable& t, std::index_sequence<I...>) {
  ((t.fn[I / 8][(I / 4) % 2][(I / 2) % 2][I % 2] =
        &Ceiling<int(I / 8), int((I / 4) % 2), int((I / 2) % 2), int(I % 2) + 1>),
   ...);
}

const CeilingTable* GetCeilingTable() {
  static const CeilingTable t = [] {
    CeilingTable c{};
    c.target = HWY_TARGET;
    FillCeiling(c, std::make_index_sequence<16>());
    return c;
  }();
  return &t;
}

// One pass of the unfused AdamW over fp32 arrays; the output pass rounds to bf16 with the optimizer's
// own vector store.
void Unfused(int pass, const Arrays& a, const UnfusedScalars& s, size_t begin, size_t end) {
  const DF df;
  const size_t L = hn::Lanes(df);
  float* g = static_cast<float*>(a.g);
  float* m = static_cast<float*>(a.m);
  float* v = static_cast<float*>(a.v);
  float* d = a.tmp;
  size_t i = begin;
  for (; i + L <= end; i += L) {
    switch (pass) {
      case 0:
        hn::StoreU(hn::Mul(hn::LoadU(df, g + i), hn::Set(df, s.scale)), df, g + i);
        break;
      case 1:
        hn::StoreU(hn::Mul(hn::LoadU(df, a.p + i), hn::Set(df, s.decay)), df, a.p + i);
        break;
      case 2:
        hn::StoreU(hn::Add(hn::Mul(hn::LoadU(df, m + i), hn::Set(df, s.b1)),
                           hn::Mul(hn::LoadU(df, g + i), hn::Set(df, s.omb1))),
                   df, m + i);
        break;
      case 3:
        hn::StoreU(hn::Mul(hn::LoadU(df, v + i), hn::Set(df, s.b2)), df, v + i);
        break;
      case 4: {
        const VF gi = hn::LoadU(df, g + i);
        hn::StoreU(hn::Add(hn::LoadU(df, v + i), hn::Mul(hn::Set(df, s.omb2), hn::Mul(gi, gi))), df, v + i);
        break;
      }
      case 5:
        hn::StoreU(hn::Mul(hn::Sqrt(hn::LoadU(df, v + i)), hn::Set(df, s.bc2)), df, d + i);
        break;
      case 6:
        hn::StoreU(hn::Add(hn::LoadU(df, d + i), hn::Set(df, s.eps)), df, d + i);
        break;
      case 7:
        hn::StoreU(
            hn::Add(hn::LoadU(df, a.p + i),
                    hn::Mul(hn::Set(df, s.step_size), hn::Div(hn::LoadU(df, m + i), hn::LoadU(df, d + i)))),
            df, a.p + i);
        break;
      default:
        break;
    }
  }
  if (pass == 8 && a.out != nullptr) {
    for (i = begin; i + 2 * L <= end; i += 2 * L) {
      cpu_optim::HWY_NAMESPACE::Store2<cpu_optim::HWY_NAMESPACE::kBF16>(
          hn::LoadU(df, a.p + i), hn::LoadU(df, a.p + i + L), a.out, i, false);
    }
  }
  // The benchmark's ranges are multiples of 64 elements: no tail.
}

const UnfusedTable* GetUnfusedTable() {
  static const UnfusedTable t = {HWY_TARGET, &Unfused};
  return &t;
}

}  // namespace strata::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <cctype>

#include "cpu_optim/kernels_impl.h"
#include "hwy/targets.h"

namespace strata::bench {

HWY_EXPORT(GetCeilingTable);
HWY_EXPORT(GetUnfusedTable);

void ceiling_range(std::int64_t target, const Arrays& a, std::size_t begin, std::size_t end, bool stream_out,
                   bool prefetch) {
  const auto* t = cpu_optim::impl::find_table(HWY_DISPATCH_TABLE(GetCeilingTable), target);
  t->fn[a.g_type][a.s_type][a.o_type][a.states - 1](a, begin, end, stream_out, prefetch);
}

void unfused_pass(std::int64_t target, int pass, const Arrays& a, const UnfusedScalars& s, std::size_t begin,
                  std::size_t end) {
  const auto* t = cpu_optim::impl::find_table(HWY_DISPATCH_TABLE(GetUnfusedTable), target);
  t->fn(pass, a, s, begin, end);
}

std::int64_t target_bit(const std::string& name) {
  for (std::int64_t m = HWY_TARGETS; m != 0; m &= m - 1) {
    const std::int64_t bit = m & -m;
    std::string n = hwy::TargetName(bit);
    for (char& c : n) c = char(std::tolower(static_cast<unsigned char>(c)));
    if (n == name) return bit;
  }
  return 0;
}

}  // namespace strata::bench
#endif  // HWY_ONCE
