// tests/kernels: what the tests of attention's band masks share (attention_window_test.cpp: sliding
// windows; attention_documents_test.cpp: packed documents, with windows too): a shape, its random bf16-exact
// inputs, the fp32 and the fused bf16 attention run forward and backward over them, and the comparisons
// (bit for bit; against the float64 reference of reference.h and its central differences).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "kernels/cpu/attention_fused.h"
#include "kernels/cpu/ops.h"
#include "tests/kernels/reference.h"

namespace strata::kernels::test::band {

namespace kc = kernels::cpu;
using kc::bf16_t;
using Positions = std::vector<std::int32_t>;

inline const float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Shape {
  int B, T, NH, NKV, HD;
  std::size_t nq() const { return std::size_t(B) * T * NH * HD; }
  std::size_t nkv() const { return std::size_t(B) * T * NKV * HD; }
  std::size_t natt() const { return std::size_t(B) * NH * T * T; }
};

// Everything one attention computes, widened to float.
struct Result {
  std::vector<float> out, dq, dk, dv;
};

// q, k, v and dout from seeds seed .. seed + 3; each value exactly a bf16 value (both paths see the same).
struct Inputs {
  std::vector<float> q, k, v, dout;
  Inputs(const Shape& s, unsigned seed)
      : q(from_bf16(to_bf16(random_floats(s.nq(), seed)))),
        k(from_bf16(to_bf16(random_floats(s.nkv(), seed + 1)))),
        v(from_bf16(to_bf16(random_floats(s.nkv(), seed + 2)))),
        dout(from_bf16(to_bf16(random_floats(s.nq(), seed + 3)))) {}
};

inline Result run_fp32(const Shape& s, const Inputs& in, int window, const Positions* pos = nullptr) {
  Result r{std::vector<float>(s.nq(), kNaN), std::vector<float>(s.nq(), kNaN),
           std::vector<float>(s.nkv(), kNaN), std::vector<float>(s.nkv(), kNaN)};
  std::vector<float> att(s.natt(), kNaN), scratch(s.natt(), kNaN);
  const std::int32_t* p = pos ? pos->data() : nullptr;
  kc::attention_forward(r.out.data(), att.data(), in.q.data(), in.k.data(), in.v.data(), s.B, s.T, s.NH,
                        s.NKV, s.HD, window, p);
  kc::attention_backward(r.dq.data(), r.dk.data(), r.dv.data(), scratch.data(), in.dout.data(), in.q.data(),
                         in.k.data(), in.v.data(), r.out.data(), att.data(), s.B, s.T, s.NH, s.NKV, s.HD,
                         window, p);
  return r;
}

inline Result run_fused(const Shape& s, const Inputs& in, int window, const Positions* pos = nullptr) {
  const std::vector<bf16_t> q = to_bf16(in.q), k = to_bf16(in.k), v = to_bf16(in.v), dout = to_bf16(in.dout);
  std::vector<bf16_t> out(s.nq()), dq(s.nq()), dk(s.nkv()), dv(s.nkv());
  std::vector<float> saved(kc::attention_fused_saved(s.B, s.T, s.NH, s.HD));
  std::vector<float> scratch(kc::attention_fused_scratch(s.B, s.T, s.NKV, s.HD));
  const std::int32_t* p = pos ? pos->data() : nullptr;
  kc::attention_fused_forward(out.data(), saved.data(), q.data(), k.data(), v.data(), s.B, s.T, s.NH, s.NKV,
                              s.HD, window, p);
  kc::attention_fused_backward(dq.data(), dk.data(), dv.data(), scratch.data(), dout.data(), q.data(),
                               k.data(), v.data(), out.data(), saved.data(), s.B, s.T, s.NH, s.NKV, s.HD,
                               window, p);
  return {from_bf16(out), from_bf16(dq), from_bf16(dk), from_bf16(dv)};
}

inline void expect_same_bits(const Result& a, const Result& b) {
  for (auto [x, y, what] : {std::tuple{&a.out, &b.out, "out"},
                            {&a.dq, &b.dq, "dq"},
                            {&a.dk, &b.dk, "dk"},
                            {&a.dv, &b.dv, "dv"}}) {
    ASSERT_EQ(x->size(), y->size()) << what;
    EXPECT_EQ(std::memcmp(x->data(), y->data(), x->size() * sizeof(float)), 0) << what;
  }
}

// Forward against float64; backward (bwd_tol > 0) against float64 central differences of it.
inline void expect_matches_float64(const Shape& s, const Inputs& in, const Result& r, int window,
                                   const Positions* pos, double fwd_tol, double bwd_tol) {
  auto f = [&](const std::vector<Vec>& x) {
    return ref_attention(x[0], x[1], x[2], s.B, s.T, s.NH, s.NKV, s.HD, window, pos);
  };
  const std::vector<Vec> x = {to_double(in.q), to_double(in.k), to_double(in.v)};
  EXPECT_LE(rel_l2(r.out, f(x)), fwd_tol) << "out";
  if (bwd_tol <= 0) return;
  const Vec dout = to_double(in.dout);
  EXPECT_LE(rel_l2(r.dq, fd_grad(f, x, 0, dout)), bwd_tol) << "dq";
  EXPECT_LE(rel_l2(r.dk, fd_grad(f, x, 1, dout)), bwd_tol) << "dk";
  EXPECT_LE(rel_l2(r.dv, fd_grad(f, x, 2, dout)), bwd_tol) << "dv";
}

}  // namespace strata::kernels::test::band
