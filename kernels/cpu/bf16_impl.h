// strata/kernels/cpu/bf16_impl.h: what the bf16-product ops (linear_bf16.cpp, attention_fused.cpp) share:
// with oneDNN, one engine and a product made once and run by any thread.
// Internal to kernels/cpu.
#pragma once

#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/ops.h"

#ifdef STRATA_WITH_DNNL
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace strata::kernels::cpu::impl {

#ifdef STRATA_WITH_DNNL
inline dnnl::engine& dnnl_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// Note [Concurrent products]: one product's primitive is made once and run at once by several threads
// (the blocks of a linear product, the heads of attention). A primitive's library-owned scratchpad may be
// shared between those runs (whether it is depends on how oneDNN was built), so each thread passes its
// own; and each run is single-threaded (Note [Row blocks] in linear_bf16.cpp), on its thread's stream.
struct Product {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;

  // C [+]= A B for these views (A, B bf16; C fp32). Throws dnnl::error when oneDNN has no such matmul.
  Product(const dnnl::memory::desc& a, const dnnl::memory::desc& b, const dnnl::memory::desc& c,
          bool accumulate) {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (accumulate) {
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, dnnl_engine());
    prim = dnnl::matmul(pd);
  }
  // Not oneDNN's reference implementation (slower than the OpenBLAS fallback).
  bool native() const { return std::strncmp(pd.impl_info_str(), "ref", 3) != 0; }
  // Runs on the calling thread; returns when C is written. c: fp32 or bf16, as the product's C was described.
  void run(const bf16_t* a, const bf16_t* b, void* c) const {
    omp_set_num_threads(1);
    thread_local dnnl::stream s(dnnl_engine());
    thread_local std::vector<char> pad;
    pad.resize(pd.scratchpad_desc().get_size());
    dnnl::memory am(pd.src_desc(), dnnl_engine(), const_cast<bf16_t*>(a)),
        bm(pd.weights_desc(), dnnl_engine(), const_cast<bf16_t*>(b)), cm(pd.dst_desc(), dnnl_engine(), c),
        sm(pd.scratchpad_desc(), dnnl_engine(), pad.data());
    prim.execute(s,
                 {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}, {DNNL_ARG_SCRATCHPAD, sm}});
    s.wait();
  }
};
#endif

}  // namespace strata::kernels::cpu::impl
