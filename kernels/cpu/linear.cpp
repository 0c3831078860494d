// strata/kernels/cpu/linear.cpp: y = x W^T and its gradients through OpenBLAS sgemm.
//
// Note [OpenBLAS determinism]: OpenBLAS splits a product over rows and columns of the output, never over
// the inner dimension, so each output element is one dot product accumulated in a fixed order. The
// tests check bit-identical results across OpenBLAS thread counts.
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
  // dw (OC,IC) += dout^T (OC,N) * x (N,IC)
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, x, IC, 1.0f, dw, IC);
}

}  // namespace strata::kernels::cpu
