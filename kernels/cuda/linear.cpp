// strata/kernels/cuda/linear.cpp: y = x W^T and its gradients through cuBLASLt (bf16 in, fp32 accumulate).
//
// Note [row-major through cuBLASLt]: cuBLASLt is column-major. A row-major (r, c) buffer is the
// column-major (c, r) matrix, its transpose, with leading dimension c. So with row-major x (N,IC),
// W (OC,IC), dout (N,OC):
//   out^T (OC,N)  = W x^T           : A = W   as (IC,OC) transposed,  B = x    as (IC,N)
//   dx^T  (IC,N) += W^T dout^T      : A = W   as (IC,OC),             B = dout as (OC,N)
//   dW^T  (IC,OC) += x^T dout       : A = x   as (IC,N),              B = dout as (OC,N) transposed
//
// Note [cuBLASLt plan cache]: building the matmul descriptor, the three layouts and asking the heuristic
// for an algorithm costs far more than a small product's launch, and a training step repeats the same
// few shapes. Gemm::Impl keeps them per (transposes, m, n, k, leading dimensions, output type, operand
// alignments) — everything the heuristic sees — and reuses them for every later call of that shape. The
// alignments are in the key because cuBLASLt's choice is only valid for pointers at least that aligned.
#include <cublasLt.h>

#include <cstdint>
#include <tuple>
#include <unordered_map>

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
namespace {

// The descriptors of one product shape and the algorithm chosen for it (Note [cuBLASLt plan cache]).
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulHeuristicResult_t result{};
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// Owns a preference for the time of one heuristic query.
struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  ~Preference() {
    if (p) cublasLtMatmulPreferenceDestroy(p);
  }
};

using PlanKey =
    std::tuple<bool, bool, int, int, int, int, int, int, int, std::uint32_t, std::uint32_t, std::uint32_t>;

struct PlanKeyHash {
  std::size_t operator()(const PlanKey& k) const {
    std::size_t h = 0;
    auto mix = [&h](std::size_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    std::apply([&](const auto&... v) { (mix(std::size_t(v)), ...); }, k);
    return h;
  }
};

// The largest power of two (up to 256) dividing the address: what cuBLASLt may assume about it.
std::uint32_t alignment(const void* p) {
  const auto u = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 256;
  while (a > 1 && u % a != 0) a /= 2;
  return a;
}

}  // namespace

struct Gemm::Impl {
  strata::DeviceBuffer workspace;  // (workspace_bytes) from the caller's Device
  int device = 0;
  cublasLtHandle_t handle = nullptr;
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans;

  ~Impl() {
    plans.clear();
    if (handle != nullptr) cublasLtDestroy(handle);
  }
};

Gemm::Gemm(strata::Device& device, std::size_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  STRATA_CHECK(device.caps().backend == BackendKind::cuda, "kernels::cuda::Gemm needs a cuda Device, got ",
               to_string(device.caps().backend));
  impl_->device = device.caps().ordinal;
  detail::CudaDeviceGuard guard(impl_->device);
  if (workspace_bytes > 0)
    impl_->workspace = strata::DeviceBuffer(device, workspace_bytes, "cuBLASLt workspace");
  STRATA_CUBLASLT_CHECK(cublasLtCreate(&impl_->handle));
}

Gemm::~Gemm() = default;

std::size_t Gemm::workspace_bytes() const {
  return impl_->workspace.size();
}

namespace {

// The plan for this shape, built on first use.
const Plan& plan_for(Gemm::Impl& g, bool trans_a, bool trans_b, int m, int n, int k, int lda, int ldb,
                     cudaDataType_t d_type, int ldd, std::uint32_t align_a, std::uint32_t align_b,
                     std::uint32_t align_d) {
  const PlanKey key{trans_a, trans_b, m, n, k, lda, ldb, int(d_type), ldd, align_a, align_b, align_d};
  if (auto it = g.plans.find(key); it != g.plans.end()) return *it->second;
  auto d = std::make_unique<Plan>();
  STRATA_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&d->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  STRATA_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  STRATA_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  // Layouts describe the stored matrices: op(A) is (m,k), so A is stored (k,m) when transposed.
  STRATA_CUBLASLT_CHECK(
      cublasLtMatrixLayoutCreate(&d->a, CUDA_R_16BF, trans_a ? k : m, trans_a ? m : k, lda));
  STRATA_CUBLASLT_CHECK(
      cublasLtMatrixLayoutCreate(&d->b, CUDA_R_16BF, trans_b ? n : k, trans_b ? k : n, ldb));
  STRATA_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&d->c, d_type, m, n, ldd));
  Preference pref;
  STRATA_CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&pref.p));
  const std::uint64_t ws = g.workspace.size();
  STRATA_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &ws, sizeof(ws)));
  STRATA_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
  STRATA_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
  STRATA_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d)));
  STRATA_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d)));
  int found = 0;
  STRATA_CUBLASLT_CHECK(
      cublasLtMatmulAlgoGetHeuristic(g.handle, d->op, d->a, d->b, d->c, d->c, pref.p, 1, &d->result, &found));
  if (found == 0)
    throw BackendError(detail::cat("cuBLASLt has no algorithm for the bf16 product (m=", m, ", n=", n, ", k=",
                                   k, ", trans_a=", trans_a, ", trans_b=", trans_b, ", alignments ", align_a,
                                   "/", align_b, "/", align_d, " bytes); align the buffers to 16 bytes"));
  return *g.plans.emplace(key, std::move(d)).first->second;
}

// Column-major D (m,n) = op(A) op(B) + beta D, A and B bf16, D of type d_type; fp32 compute and scale.
// m, n, k > 0.
void matmul(Gemm::Impl& g, bool trans_a, bool trans_b, int m, int n, int k, const bf16* A, int lda,
            const bf16* B, int ldb, void* D, cudaDataType_t d_type, int ldd, float beta,
            cudaStream_t stream) {
  const Plan& p =
      plan_for(g, trans_a, trans_b, m, n, k, lda, ldb, d_type, ldd, alignment(A), alignment(B), alignment(D));
  const float alpha = 1.0f;
  STRATA_CUBLASLT_CHECK(cublasLtMatmul(g.handle, p.op, &alpha, A, p.a, B, p.b, &beta, D, p.c, D, p.c,
                                       &p.result.algo, g.workspace.data(), g.workspace.size(), stream));
  STRATA_KERNEL_CHECK(stream);  // STRATA_CUDA_SYNC=1 reports a fault of the product here
}

// The Gemm's workspace lives on its device: the stream must belong to the same one.
void check_device(Gemm& gemm, const detail::CudaDeviceGuard& guard) {
  STRATA_CHECK(guard.device() == gemm.impl().device, "linear: a Gemm of cuda device ", gemm.impl().device,
               " used with a stream of device ", guard.device(), "; use one Gemm per stream");
}

}  // namespace

void linear_forward(Gemm& gemm, bf16* out, const bf16* x, const bf16* w, int N, int IC, int OC,
                    cudaStream_t stream) {
  if (N == 0 || OC == 0) return;
  detail::CudaDeviceGuard guard(stream);
  if (IC == 0) {  // an empty sum: out = 0, as the CPU's sgemm with k = 0 (cuBLASLt rejects k = 0)
    STRATA_CUDA_CHECK(cudaMemsetAsync(out, 0, std::size_t(N) * OC * sizeof(bf16), stream));
    return;
  }
  check_device(gemm, guard);
  // out^T (OC,N) = W (OC,IC) x^T: A = W stored (IC,OC) ld IC, transposed; B = x stored (IC,N) ld IC.
  matmul(gemm.impl(), true, false, OC, N, IC, w, IC, x, IC, out, CUDA_R_16BF, OC, 0.0f, stream);
}

void linear_backward(Gemm& gemm, bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w, int N,
                     int IC, int OC, cudaStream_t stream) {
  // N = 0 adds nothing to dw; OC = 0 adds nothing to dx; IC = 0 leaves both empty.
  if (N == 0 || OC == 0 || IC == 0) return;
  detail::CudaDeviceGuard guard(stream);
  check_device(gemm, guard);
  // dx^T (IC,N) += W^T dout^T: A = W stored (IC,OC) ld IC; B = dout stored (OC,N) ld OC.
  if (dx != nullptr)
    matmul(gemm.impl(), false, false, IC, N, OC, w, IC, dout, OC, dx, CUDA_R_16BF, IC, 1.0f, stream);
  // dW^T (IC,OC) += x^T dout: A = x stored (IC,N) ld IC; B = dout stored (OC,N) ld OC, transposed. None
  // for a frozen weight.
  if (dw != nullptr)
    matmul(gemm.impl(), false, true, IC, OC, N, x, IC, dout, OC, dw, CUDA_R_32F, IC, 1.0f, stream);
}

}  // namespace strata::kernels::cuda
