// strata/kernels/cuda/linear.cpp: y = x W^T and its gradients through cuBLASLt (bf16 in, fp32 accumulate).
//
// Note [row-major through cuBLASLt]: cuBLASLt is column-major. A row-major (r, c) buffer is the
// column-major (c, r) matrix, its transpose, with leading dimension c. So with row-major x (N,IC),
// W (OC,IC), dout (N,OC):
//   out^T (OC,N)  = W x^T           : A = W   as (IC,OC) transposed,  B = x    as (IC,N)
//   dx^T  (IC,N) += W^T dout^T      : A = W   as (IC,OC),             B = dout as (OC,N)
//   dW^T  (IC,OC) += x^T dout       : A = x   as (IC,N),              B = dout as (OC,N) transposed
#include <cublasLt.h>

#include <cstdint>

#include "core/cuda_check.h"
#include "kernels/cuda/ops.h"

#define STRATA_CUBLASLT_CHECK(stmt)                                                          \
  do {                                                                                       \
    cublasStatus_t strata_s_ = (stmt);                                                       \
    if (strata_s_ != CUBLAS_STATUS_SUCCESS)                                                  \
      ::strata::detail::throw_backend(__FILE__, __LINE__, #stmt, "cuBLASLt", int(strata_s_), \
                                      cublasLtGetStatusString(strata_s_));                   \
  } while (0)

namespace strata::kernels::cuda {

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

Gemm::Gemm(std::size_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  STRATA_CUBLASLT_CHECK(cublasLtCreate(&impl_->handle));
  if (workspace_bytes > 0) {
    const cudaError_t e = cudaMalloc(&impl_->workspace, workspace_bytes);
    if (e != cudaSuccess) {
      cublasLtDestroy(impl_->handle);
      STRATA_CUDA_CHECK(e);
    }
  }
  impl_->workspace_bytes = workspace_bytes;
}

Gemm::~Gemm() {
  if (impl_->workspace != nullptr) cudaFree(impl_->workspace);
  if (impl_->handle != nullptr) cublasLtDestroy(impl_->handle);
}

namespace {

// Owns the descriptors of one call.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// The largest power of two (up to 256) dividing the address: what cuBLASLt may assume about it.
std::uint32_t alignment(const void* p) {
  const auto u = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 256;
  while (a > 1 && u % a != 0) a /= 2;
  return a;
}

// Column-major D (m,n) = op(A) op(B) + beta D, A and B bf16, D of type d_type; fp32 compute and scale.
void matmul(Gemm::Impl& g, bool trans_a, bool trans_b, int m, int n, int k, const bf16* A, int lda,
            const bf16* B, int ldb, void* D, cudaDataType_t d_type, int ldd, float beta,
            cudaStream_t stream) {
  Descriptors d;
  STRATA_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  STRATA_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  STRATA_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  // Layouts describe the stored matrices: op(A) is (m,k), so A is stored (k,m) when transposed.
  STRATA_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_16BF, trans_a ? k : m, trans_a ? m : k, lda));
  STRATA_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&d.b, CUDA_R_16BF, trans_b ? n : k, trans_b ? k : n, ldb));
  STRATA_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&d.c, d_type, m, n, ldd));
  STRATA_CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&d.pref));
  const std::uint64_t ws = g.workspace_bytes;
  STRATA_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &ws, sizeof(ws)));
  const std::uint32_t align_a = alignment(A), align_b = alignment(B), align_d = alignment(D);
  STRATA_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(
      d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
  STRATA_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(
      d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
  STRATA_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(
      d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d)));
  STRATA_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(
      d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  STRATA_CUBLASLT_CHECK(
      cublasLtMatmulAlgoGetHeuristic(g.handle, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &result, &found));
  if (found == 0)
    throw BackendError(detail::cat("cuBLASLt has no algorithm for the bf16 product (m=", m, ", n=", n, ", k=",
                                   k, ", trans_a=", trans_a, ", trans_b=", trans_b, ", alignments ", align_a,
                                   "/", align_b, "/", align_d, " bytes); align the buffers to 16 bytes"));
  const float alpha = 1.0f;
  STRATA_CUBLASLT_CHECK(cublasLtMatmul(g.handle, d.op, &alpha, A, d.a, B, d.b, &beta, D, d.c, D, d.c,
                                       &result.algo, g.workspace, g.workspace_bytes, stream));
}

}  // namespace

void linear_forward(Gemm& gemm, bf16* out, const bf16* x, const bf16* w, int N, int IC, int OC,
                    cudaStream_t stream) {
  if (N == 0 || OC == 0) return;
  // out^T (OC,N) = W (OC,IC) x^T: A = W stored (IC,OC) ld IC, transposed; B = x stored (IC,N) ld IC.
  matmul(gemm.impl(), true, false, OC, N, IC, w, IC, x, IC, out, CUDA_R_16BF, OC, 0.0f, stream);
}

void linear_backward(Gemm& gemm, bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w, int N,
                     int IC, int OC, cudaStream_t stream) {
  if (N == 0 || OC == 0 || IC == 0) return;
  // dx^T (IC,N) += W^T dout^T: A = W stored (IC,OC) ld IC; B = dout stored (OC,N) ld OC.
  if (dx != nullptr)
    matmul(gemm.impl(), false, false, IC, N, OC, w, IC, dout, OC, dx, CUDA_R_16BF, IC, 1.0f, stream);
  // dW^T (IC,OC) += x^T dout: A = x stored (IC,N) ld IC; B = dout stored (OC,N) ld OC, transposed.
  matmul(gemm.impl(), false, true, IC, OC, N, x, IC, dout, OC, dw, CUDA_R_32F, IC, 1.0f, stream);
}

}  // namespace strata::kernels::cuda
