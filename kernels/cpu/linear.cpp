// strata/kernels/cpu/linear.cpp: y = x W^T and its gradients through OpenBLAS sgemm.
//
// Note [OpenBLAS determinism]: OpenBLAS (0.3.21 here) gives bit-identical products run after run for a
// fixed thread count, but its blocking changes with the thread count, so 1 and 2 threads differ in the
// last bits of ~10% of the elements. Keep set_blas_threads() fixed for a run when bit-identical losses
// matter; the tests check both properties (identical at a fixed count, fp32-close across counts).
#include <cblas.h>

#include "kernels/cpu/ops.h"

namespace strata::kernels::cpu {

void linear_forward(float* out, const float* x, const float* w, int N, int IC, int OC) {
  // out (N,OC) = x (N,IC) * w^T (IC,OC)
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, x, IC, w, IC, 0.0f, out, OC);
}

void linear_backward(float* dx, float* dw, const float* dout, const float* x, const float* w, int N, int IC,
                     int OC) {
  // dx (N,IC) += dout (N,OC) * w (OC,IC)
  if (dx != nullptr)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, w, IC, 1.0f, dx, IC);
  // dw (OC,IC) += dout^T (OC,N) * x (N,IC); none for a frozen weight
  if (dw != nullptr)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, x, IC, 1.0f, dw, IC);
}

}  // namespace strata::kernels::cpu
