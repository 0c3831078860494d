// strata/cpu_optim/simd-inl.h: per-target pieces shared by the kernel files: widening loads and
// rounding stores for fp32 / bf16 / fp16 buffers, and the one streaming loop every optimizer runs.
//
// Included once per SIMD target by each kernel file after hwy/foreach_target.h (the include guard below
// toggles with HWY_TARGET_TOGGLE, as Highway's own -inl.h headers do). An optimizer supplies an Op:
//   struct Op {
//     static constexpr bool kM, kV;     // which state buffers it reads and writes
//     static constexpr bool kReadsP;    // whether Direction reads p (L2 weight decay)
//     static constexpr bool kNaNOnNonfinite;  // a NaN or infinite g always makes the new p NaN
//     explicit Op(const impl::UpdateArgs&);
//     VF Direction(VF p, VF g, VF& m, VF& v) const;  // moves the states, returns the step direction
//     void Apply(VF& p, VF u) const;                 // moves p along the direction (and decays it)
//   };
// (one vector of elements each, g already scaled) and instantiates Update<Op, G, S, O> for each dtype
// combination.

#if defined(STRATA_CPU_OPTIM_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_CPU_OPTIM_SIMD_INL_H_
#undef STRATA_CPU_OPTIM_SIMD_INL_H_
#else
#define STRATA_CPU_OPTIM_SIMD_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "core/dtype.h"
#include "cpu_optim/kernels_impl.h"
#include "hwy/cache_control.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace strata::cpu_optim::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using DU = hn::RebindToUnsigned<DF>;  // u32 lanes, one per float
using DI = hn::RebindToSigned<DF>;
using DH = hn::Rebind<uint16_t, DF>;  // u16 lanes, one per float (half a vector)

// dtype indices, as in kernels_impl.h.
inline constexpr int kF32 = 0, kBF16 = 1, kF16 = 2;  // grads, states, outputs (out: 0 means none)

// Hardware fp16 conversions (F16C) exist on x86 from AVX2 up; elsewhere (and where Highway's own
// emulation would truncate or mishandle inf/NaN) the integer versions below are used.
#ifdef STRATA_CPU_OPTIM_HW_F16
#undef STRATA_CPU_OPTIM_HW_F16
#endif
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
#define STRATA_CPU_OPTIM_HW_F16 1
#else
#define STRATA_CPU_OPTIM_HW_F16 0
#endif

// ---- bf16 / fp16 <-> fp32 on one vector of u32 lanes ----------------------------------------------------

#if HWY_TARGET != HWY_SCALAR  // the scalar target converts with core/dtype.h directly

// bf16 rounding of a v that is not NaN (infinities included), left in the upper 16 bits of each u32
// lane: round to nearest even. The update loop uses it alone for the output and repairs a block that
// held a NaN (see Update).
HWY_INLINE hn::Vec<DU> RoundToBF16HighNotNaN(VF v) {
  const DU du;
  const hn::Vec<DU> u = hn::BitCast(du, v);
  const hn::Vec<DU> odd = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  return hn::Add(u, hn::Add(odd, hn::Set(du, 0x7fffu)));
}

// The same for any v: NaN stays NaN with the quiet bit set (three more operations). Matches f32_to_bf16
// in core/dtype.h.
HWY_INLINE hn::Vec<DU> RoundToBF16High(VF v) {
  const DU du;
  const hn::Vec<DU> quiet = hn::Or(hn::BitCast(du, v), hn::Set(du, 0x00400000u));
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet, RoundToBF16HighNotNaN(v));
}

// fp16 rounding of v, in the lower 16 bits of each u32 lane. Matches f32_to_f16 in core/dtype.h.
HWY_INLINE hn::Vec<DU> RoundToF16Low(VF v) {
  const DU du;
  const DI di;
  const DF df;
  const hn::Vec<DU> u = hn::BitCast(du, v);
  const hn::Vec<DU> sign = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 0x8000u));
  const hn::Vec<DU> a = hn::And(u, hn::Set(du, 0x7fffffffu));
  const hn::Vec<DI> ai = hn::BitCast(di, a);  // non-negative, so signed compares order it
  // NaN keeps its top payload bits; >= 65536 (and inf) becomes inf.
  const hn::Vec<DU> nan = hn::Or(hn::Set(du, 0x7e00u), hn::And(hn::ShiftRight<13>(a), hn::Set(du, 0x3ffu)));
  const hn::Vec<DU> big =
      hn::IfThenElse(hn::RebindMask(du, hn::Gt(ai, hn::Set(di, 0x7f800000))), nan, hn::Set(du, 0x7c00u));
  // Below 2^-14: an fp32 add of 0.5f rounds the value onto the half subnormal grid.
  const hn::Vec<DU> sub =
      hn::Sub(hn::BitCast(du, hn::Add(hn::BitCast(df, a), hn::Set(df, 0.5f))), hn::Set(du, 0x3f000000u));
  // Normal: rebias the exponent and round to nearest even at bit 13.
  const hn::Vec<DU> odd = hn::And(hn::ShiftRight<13>(a), hn::Set(du, 1u));
  const hn::Vec<DU> normal = hn::ShiftRight<13>(hn::Add(a, hn::Add(odd, hn::Set(du, 0xc8000fffu))));
  hn::Vec<DU> h = hn::IfThenElse(hn::RebindMask(du, hn::Lt(ai, hn::Set(di, 0x38800000))), sub, normal);
  h = hn::IfThenElse(hn::RebindMask(du, hn::Gt(ai, hn::Set(di, 0x477fffff))), big, h);
  return hn::Or(h, sign);
}

// fp16 bits (one per u32 lane, upper half zero) to fp32. Matches f16_to_f32 in core/dtype.h.
HWY_INLINE VF F16LowToF32(hn::Vec<DU> h) {
  const DU du;
  const DF df;
  const hn::Vec<DU> sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
  const hn::Vec<DU> em = hn::And(h, hn::Set(du, 0x7fffu));
  const hn::Vec<DU> shifted = hn::ShiftLeft<13>(em);
  const hn::Vec<DU> finite = hn::BitCast(du, hn::Mul(hn::BitCast(df, shifted), hn::Set(df, 0x1p112f)));
  const hn::Vec<DU> special = hn::Or(shifted, hn::Set(du, 0x7f800000u));
  const DI di;
  const auto is_special = hn::Gt(hn::BitCast(di, em), hn::Set(di, 0x7bff));
  return hn::BitCast(df, hn::Or(hn::IfThenElse(hn::RebindMask(du, is_special), special, finite), sign));
}

#endif  // HWY_TARGET != HWY_SCALAR

// ---- loads and stores of two vectors' worth (2 * Lanes(DF) elements) -----------------------------------

template <int kType>
HWY_INLINE void Load2(const void* base, size_t i, VF& a, VF& b) {
  const DF df;
  const size_t L = hn::Lanes(df);
  if constexpr (kType == kF32) {
    const float* p = static_cast<const float*>(base) + i;
    a = hn::LoadU(df, p);
    b = hn::LoadU(df, p + L);
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(base) + i;
#if HWY_TARGET == HWY_SCALAR
    // One lane: the scalar conversions of core/dtype.h are the vector ones.
    const auto widen = [](uint16_t h) { return kType == kBF16 ? bf16_to_f32(h) : f16_to_f32(h); };
    a = hn::Set(df, widen(p[0]));
    b = hn::Set(df, widen(p[L]));
#else
#if STRATA_CPU_OPTIM_HW_F16
    if constexpr (kType == kF16) {
      const hn::Rebind<hwy::float16_t, DF> d16;
      const hwy::float16_t* h = reinterpret_cast<const hwy::float16_t*>(p);
      a = hn::PromoteTo(df, hn::LoadU(d16, h));
      b = hn::PromoteTo(df, hn::LoadU(d16, h + L));
      return;
    }
#endif
    const DH dh;
    const DU du;
    const hn::Vec<DU> lo = hn::PromoteTo(du, hn::LoadU(dh, p));
    const hn::Vec<DU> hi = hn::PromoteTo(du, hn::LoadU(dh, p + L));
    if constexpr (kType == kBF16) {
      a = hn::BitCast(df, hn::ShiftLeft<16>(lo));
      b = hn::BitCast(df, hn::ShiftLeft<16>(hi));
    } else {
      a = F16LowToF32(lo);
      b = F16LowToF32(hi);
    }
#endif  // HWY_TARGET == HWY_SCALAR
  }
}

// Stores a then b (2 * Lanes elements) at base[i], rounding to the buffer's dtype. `stream` requests
// non-temporal stores; it is only honoured for 16-bit buffers, whose caller has aligned base + i.
// kNotNaN: the caller guarantees a and b hold no NaN, or rewrites what this wrote (bf16 only).
template <int kType, bool kNotNaN = false>
HWY_INLINE void Store2(VF a, VF b, void* base, size_t i, bool stream) {
  const DF df;
  const size_t L = hn::Lanes(df);
  if constexpr (kType == kF32) {
    float* p = static_cast<float*>(base) + i;
    hn::StoreU(a, df, p);
    hn::StoreU(b, df, p + L);
  } else {
#if HWY_TARGET == HWY_SCALAR
    const auto narrow = [](float x) { return kType == kBF16 ? f32_to_bf16(x) : f32_to_f16(x); };
    uint16_t* q = static_cast<uint16_t*>(base) + i;
    q[0] = narrow(hn::GetLane(a));
    q[L] = narrow(hn::GetLane(b));
    (void)stream;
#else
    const hn::Repartition<uint16_t, DF> dw;  // u16 lanes filling a whole vector (two floats' worth)
    hn::Vec<decltype(dw)> w;
    if constexpr (kType == kBF16 && kNotNaN) {
      w = hn::ConcatOdd(dw, hn::BitCast(dw, RoundToBF16HighNotNaN(b)),
                        hn::BitCast(dw, RoundToBF16HighNotNaN(a)));
    } else if constexpr (kType == kBF16) {
      w = hn::ConcatOdd(dw, hn::BitCast(dw, RoundToBF16High(b)), hn::BitCast(dw, RoundToBF16High(a)));
    } else {
#if STRATA_CPU_OPTIM_HW_F16
      const hn::Rebind<hwy::float16_t, DF> d16;
      const DH dh;
      w = hn::Combine(dw, hn::BitCast(dh, hn::DemoteTo(d16, b)), hn::BitCast(dh, hn::DemoteTo(d16, a)));
#else
      w = hn::ConcatEven(dw, hn::BitCast(dw, RoundToF16Low(b)), hn::BitCast(dw, RoundToF16Low(a)));
#endif
    }
    uint16_t* p = static_cast<uint16_t*>(base) + i;
    if (stream) {
      hn::Stream(w, dw, p);
    } else {
      hn::StoreU(w, dw, p);
    }
#endif
  }
}

// ---- the update loop --------------------------------------------------------------------------------

// Typed base pointers of one call (or of the stack copies used for a partial vector).
struct Bufs {
  float* p;
  const void* g;
  void* m;
  void* v;
  void* out;
};

// Software prefetch of every stream the update reads, kPrefetchAhead elements ahead of the step being
// computed: one prefetch per 64-byte line per stream and step. Without it the out-of-order window,
// filled by the divide and square root chain, holds too few loads to keep the memory bus busy (on Zen 3
// with AVX2 it lifted AdamW by about 8 points of the read-modify-write ceiling; 64 to 256 elements ahead
// measured alike, 512 to 2048 ahead gained little: bench/cpu_adam, bench/RESULTS.md). Prefetches do not
// fault, so addresses past the end of a buffer are harmless.
inline constexpr size_t kPrefetchAhead = 128;

template <size_t kElemBytes>
HWY_INLINE void PrefetchAhead(const void* base, size_t i) {
#if HWY_TARGET != HWY_SCALAR  // two elements per step: the hardware prefetcher keeps up on its own
  const size_t step_bytes = 2 * hn::Lanes(DF()) * kElemBytes;  // a constant once inlined
  const uintptr_t at = reinterpret_cast<uintptr_t>(base) + (i + kPrefetchAhead) * kElemBytes;
  for (size_t off = 0; off < step_bytes; off += 64) hwy::Prefetch(reinterpret_cast<const uint8_t*>(at + off));
#else
  (void)base;
  (void)i;
#endif
}

// The prefetches of one step at index i: params (read by Apply2 of the same block), grads and the
// states in use. bench/cpu_adam's ceiling loop issues the same ones.
template <int G, int S, bool kM, bool kV>
HWY_INLINE void PrefetchStep(const float* p, const void* g, const void* m, const void* v, size_t i) {
  PrefetchAhead<4>(p, i);
  PrefetchAhead<G == kF32 ? 4 : 2>(g, i);
  if constexpr (kM) PrefetchAhead<S == kF32 ? 4 : 2>(m, i);
  if constexpr (kV) PrefetchAhead<S == kF32 ? 4 : 2>(v, i);
}

// nonfinite += g * 0 for the scaled gradients g0, g1: it turns NaN for good as soon as one is NaN or
// infinite (one accumulator, one add per step: no register to spare).
HWY_INLINE void AccumulateNonfinite(VF g0, VF g1, VF& nonfinite) {
  const VF zero = hn::Zero(DF());
  nonfinite = hn::Add(nonfinite, hn::Add(hn::Mul(g0, zero), hn::Mul(g1, zero)));
}

// The first half of one step of 2 * Lanes elements at index i: loads the gradients and states, moves
// the states, stores them and leaves the step direction in dir[0, 2 * Lanes). kCheckG: test the scaled
// gradients into `nonfinite` (else the caller learns of them another way, see Update).
template <class Op, int G, int S, bool kCheckG>
HWY_INLINE void Moments2(const Op& op, VF scale, const Bufs& b, size_t i, float* HWY_RESTRICT dir,
                         VF& nonfinite) {
  const DF df;
  const size_t L = hn::Lanes(df);
  PrefetchStep<G, S, Op::kM, Op::kV>(b.p, b.g, b.m, b.v, i);
  const VF zero = hn::Zero(df);
  VF p0 = zero, p1 = zero;
  if constexpr (Op::kReadsP) {
    p0 = hn::LoadU(df, b.p + i);
    p1 = hn::LoadU(df, b.p + i + L);
  }
  VF g0, g1;
  Load2<G>(b.g, i, g0, g1);
  g0 = hn::Mul(g0, scale);
  g1 = hn::Mul(g1, scale);
  if constexpr (kCheckG) AccumulateNonfinite(g0, g1, nonfinite);
  VF m0 = zero, m1 = zero, v0 = zero, v1 = zero;
  if constexpr (Op::kM) Load2<S>(b.m, i, m0, m1);
  if constexpr (Op::kV) Load2<S>(b.v, i, v0, v1);
  hn::Store(op.Direction(p0, g0, m0, v0), df, dir);
  hn::Store(op.Direction(p1, g1, m1, v1), df, dir + L);
  if constexpr (Op::kM) Store2<S>(m0, m1, b.m, i, false);
  if constexpr (Op::kV) Store2<S>(v0, v1, b.v, i, false);
}

// The second half: moves the params at i along dir[0, 2 * Lanes), stores them and the output.
// kSum: add the new params into `sum` and round a bf16 output as if none were NaN (see Update).
template <class Op, int O, bool kSum>
HWY_INLINE void Apply2(const Op& op, const Bufs& b, size_t i, const float* HWY_RESTRICT dir, bool stream,
                       VF& sum) {
  const DF df;
  const size_t L = hn::Lanes(df);
  VF p0 = hn::LoadU(df, b.p + i);
  VF p1 = hn::LoadU(df, b.p + i + L);
  op.Apply(p0, hn::Load(df, dir));
  op.Apply(p1, hn::Load(df, dir + L));
  hn::StoreU(p0, df, b.p + i);
  hn::StoreU(p1, df, b.p + i + L);
  if constexpr (kSum) sum = hn::Add(sum, hn::Add(p0, p1));
  if constexpr (O != 0) Store2<O, kSum>(p0, p1, b.out, i, stream);
}

// Elements per block of the main loop (a multiple of 2 * Lanes on every target). Each block runs
// Moments2 over all of it, then Apply2: the square root and divide chain of one half no longer sits in
// the out-of-order window with the rounding and stores of the other, so the core overlaps more steps
// (bench/cpu_adam). The directions (2 KiB) and the block's params stay in L1 between the halves.
inline constexpr size_t kBlock = 512;

// Elements [i, i + k), k < 2 * Lanes: copied into zero-padded stack buffers, run through the same
// Moments2 and Apply2 (so their arithmetic is exactly that of the main loop), and copied back.
template <class Op, int G, int S, int O>
HWY_NOINLINE void StepPartial(const Op& op, VF scale, const Bufs& b, size_t i, size_t k, VF& nonfinite) {
  constexpr size_t kMax = 2 * HWY_MAX_BYTES / sizeof(float);
  HWY_ALIGN float p[kMax] = {};
  HWY_ALIGN float g[kMax] = {}, m[kMax] = {}, v[kMax] = {};  // wide enough for any dtype
  HWY_ALIGN uint16_t out[kMax] = {};
  const size_t gb = G == kF32 ? 4 : 2, sb = S == kF32 ? 4 : 2;
  std::memcpy(p, b.p + i, k * 4);
  std::memcpy(g, static_cast<const char*>(b.g) + i * gb, k * gb);
  if constexpr (Op::kM) std::memcpy(m, static_cast<const char*>(b.m) + i * sb, k * sb);
  if constexpr (Op::kV) std::memcpy(v, static_cast<const char*>(b.v) + i * sb, k * sb);
  const Bufs local{p, g, m, v, out};
  HWY_ALIGN float dir[kMax];
  VF unused_sum = hn::Zero(DF());
  Moments2<Op, G, S, true>(op, scale, local, 0, dir, nonfinite);
  Apply2<Op, O, false>(op, local, 0, dir, false, unused_sum);
  std::memcpy(b.p + i, p, k * 4);
  if constexpr (Op::kM) std::memcpy(static_cast<char*>(b.m) + i * sb, m, k * sb);
  if constexpr (Op::kV) std::memcpy(static_cast<char*>(b.v) + i * sb, v, k * sb);
  if constexpr (O != 0) std::memcpy(static_cast<uint16_t*>(b.out) + i, out, k * 2);
}

// The exact checks of the `len` elements at i, for a block of the main loop whose sum of new params came
// out NaN: tests its scaled gradients into `nonfinite` (kCheckG) and rewrites a bf16 output from the
// stored params with the NaN-preserving rounding.
template <int G, int O, bool kCheckG>
HWY_NOINLINE void RepairBlock(VF scale, const Bufs& b, size_t i, size_t len, bool stream, VF& nonfinite) {
  const DF df;
  const size_t L = hn::Lanes(df);
  if constexpr (kCheckG) {
    for (size_t j = i; j < i + len; j += 2 * L) {
      VF g0, g1;
      Load2<G>(b.g, j, g0, g1);
      AccumulateNonfinite(hn::Mul(g0, scale), hn::Mul(g1, scale), nonfinite);
    }
  }
  if constexpr (O == kBF16) {
    if (stream) hwy::FlushStream();  // the block's streamed stores are ordered before their rewrite
    for (size_t j = i; j < i + len; j += 2 * L) {
      Store2<kBF16>(hn::LoadU(df, b.p + j), hn::LoadU(df, b.p + j + L), b.out, j, false);
    }
  }
}

template <class Op, int G, int S, int O>
bool Update(const impl::UpdateArgs& a, size_t begin, size_t end) {
  const DF df;
  const size_t n2 = 2 * hn::Lanes(df);
  const Op op(a);
  const VF scale = hn::Set(df, a.grad_scale);
  const Bufs b{a.p, a.g, a.m, a.v, a.out};
  VF nonfinite = hn::Zero(df);
  size_t i = begin;
  bool stream = false;
  if constexpr (O != 0) {
    // Streaming stores need a vector-aligned address: run the elements before it as a partial step.
    const uintptr_t addr = reinterpret_cast<uintptr_t>(static_cast<uint16_t*>(a.out) + i);
    const size_t vbytes = n2 * sizeof(uint16_t);
    if (a.stream_out && addr % sizeof(uint16_t) == 0) {
      const size_t head = std::min(((vbytes - addr % vbytes) % vbytes) / sizeof(uint16_t), end - i);
      if (head != 0) StepPartial<Op, G, S, O>(op, scale, b, i, head, nonfinite);
      i += head;
      stream = true;
    }
  }
  // Non-finite values in the main loop. The exact checks cost 10 of the ~70 instructions of an AdamW
  // step with a bf16 output on AVX2: every scaled gradient tested (two multiplies, two adds per step)
  // and the NaN-preserving bf16 rounding of the output (a compare, an or and a blend per vector); in
  // cache, taking them out of the main loop made that update about a quarter faster (bench/RESULTS.md).
  // When the Op guarantees that a non-finite gradient makes the new param NaN (kNaNOnNonfinite), or the
  // output is bf16, each block instead sums its new params (one add per vector) and rounds the output
  // as if none were NaN. A NaN sum (a non-finite gradient, a param already NaN, or, rarely, a sum that
  // overflowed) sends the block through RepairBlock's exact checks. Either way the results and the
  // returned flag are those of the exact checks, bit for bit.
  constexpr bool kCheckG = !Op::kNaNOnNonfinite;
  constexpr bool kSum = !kCheckG || O == kBF16;
  HWY_ALIGN float dir[kBlock];
  while (i + n2 <= end) {
    const size_t len = std::min(kBlock, (end - i) / n2 * n2);
    VF sum = hn::Zero(df);
    for (size_t j = 0; j < len; j += n2) Moments2<Op, G, S, kCheckG>(op, scale, b, i + j, dir + j, nonfinite);
    for (size_t j = 0; j < len; j += n2) Apply2<Op, O, kSum>(op, b, i + j, dir + j, stream, sum);
    if constexpr (kSum) {
      if (HWY_UNLIKELY(!hn::AllFalse(df, hn::IsNaN(sum)))) {
        RepairBlock<G, O, !kCheckG>(scale, b, i, len, stream, nonfinite);
      }
    }
    i += len;
  }
  if (i < end) StepPartial<Op, G, S, O>(op, scale, b, i, end - i, nonfinite);
  if (stream) hwy::FlushStream();
  return hn::AllFalse(df, hn::IsNaN(nonfinite));
}

// The 18 dtype combinations of one Op as a table (grads x states x outputs).
template <class Op, size_t... I>
void FillTable(impl::UpdateTable& t, std::index_sequence<I...>) {
  ((t.fn[I / 6][(I / 3) % 2][I % 3] = &Update<Op, int(I / 6), int((I / 3) % 2), int(I % 3)>), ...);
}

template <class Op>
const impl::UpdateTable* MakeTable() {
  static const impl::UpdateTable table = [] {
    impl::UpdateTable t;
    t.target = HWY_TARGET;
    FillTable<Op>(t, std::make_index_sequence<18>());
    return t;
  }();
  return &table;
}

}  // namespace strata::cpu_optim::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // STRATA_CPU_OPTIM_SIMD_INL_H_
