// strata/kernels/cpu/threads.cpp: OpenBLAS's thread count, matched to the runtime's.
#include <cblas.h>

#include "core/error.h"
#include "kernels/cpu/ops.h"

namespace strata::kernels::cpu {

void set_blas_threads(int n) {
  STRATA_CHECK(n >= 1, "set_blas_threads: thread count ", n, " must be at least 1");
  openblas_set_num_threads(n);
}

int blas_threads() {
  return openblas_get_num_threads();
}

}  // namespace strata::kernels::cpu
