// strata/kernels/cuda/attention_cudnn_impl.h: the parts of kernels/cuda/attention_cudnn.cpp that run
// without a GPU, declared for its tests (internal to kernels/cuda otherwise):
//   - HandleOwner: a library handle and what was built with it, released dependents first, handle last
//     (Note [cuDNN handle lifetime]); CudnnAttention's Impl keeps its handle and its per-shape graphs in one;
//   - check_graphs: the cuDNN frontend's host-side checks of the forward and backward graphs plan() builds
//     for a shape (Note [cuDNN attention graph checks] in the .cpp), with no GPU and no cuDNN handle.
//
// Example (tests/kernels/cuda_attention_cudnn_host_test.cpp):
//   const cudnn_impl::GraphCheck c = cudnn_impl::check_graphs({2, 128, 32, 4, 64, DType::bf16},
//                                                             /*deterministic=*/true, /*sm=*/90);
//   if (!c.ok()) ...  // c.forward / c.backward: what the frontend refused, "" where it accepted
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "kernels/cuda/attention_cudnn.h"

namespace strata::kernels::cudnn_impl {

// Note [cuDNN handle lifetime]: an execution plan built with a cuDNN handle belongs to that handle; it
// must be destroyed while the handle still exists (as kernels/cuda/linear.cpp's Gemm clears its cuBLASLt
// plans before cublasLtDestroy). HandleOwner makes that order a property of the type rather than of the
// class that holds it: ~HandleOwner clears the dependents first, and the handle is a member declared
// before them, so even the implicit member teardown destroys it last.
//
// `Handle` is a pointer type (cudnnHandle_t); `Dependents` a container with clear() (a map of cached
// graphs). Not thread-safe: the holder's lock guards it.
template <class Handle, class Dependents>
class HandleOwner {
  static_assert(std::is_pointer_v<Handle>, "HandleOwner holds a library handle, a pointer type");

 public:
  using Destroy = void (*)(Handle);  // releases a handle that is not null; must not throw

  explicit HandleOwner(Destroy destroy) : handle_(nullptr, Deleter{destroy}) {}
  ~HandleOwner() { dependents_.clear(); }  // then handle_, the first member, goes last
  HandleOwner(const HandleOwner&) = delete;
  HandleOwner& operator=(const HandleOwner&) = delete;

  // Takes ownership of `h`, which the caller just created. Once: the dependents may hold the first one.
  void adopt(Handle h) {
    STRATA_CHECK(!handle_, "kernels: HandleOwner already owns a handle");
    handle_.reset(h);
  }
  Handle handle() const { return handle_.get(); }
  Dependents& dependents() { return dependents_; }
  const Dependents& dependents() const { return dependents_; }

 private:
  struct Deleter {
    Destroy destroy;
    void operator()(Handle h) const noexcept {
      if (h != nullptr) destroy(h);
    }
  };
  // Declaration order is teardown order, reversed: the handle outlives everything declared after it.
  std::unique_ptr<std::remove_pointer_t<Handle>, Deleter> handle_;
  Dependents dependents_;
};

// The cache CudnnAttention's Impl keeps: a handle and, per shape, what plan() built with it.
template <class Handle, class Entry>
using ShapeCache = HandleOwner<Handle, std::map<AttentionShape, Entry>>;

// What the cuDNN frontend's host-side checks say of the two graphs of a shape: "" where a graph passed,
// else the frontend's reason.
struct GraphCheck {
  std::string forward, backward;
  bool ok() const { return forward.empty() && backward.empty(); }
};

// Builds the forward and backward graphs CudnnAttention::plan() builds for `shape` and `deterministic`,
// for a GPU of compute capability `sm` (major * 10 + minor: 80, 90, 100), then runs the frontend's checks
// that need neither a GPU nor a handle: Graph::validate() (its SDPA support surface, which asks libcudnn
// for its version) and the lowering to cuDNN's backend operation graph without a handle. plan() then does
// the rest on the GPU: heuristics, support check, plan build. Without STRATA_WITH_CUDNN both fields say
// the path is not built.
GraphCheck check_graphs(const AttentionShape& shape, bool deterministic, int sm);

// The cuDNN library's version as cudnnGetVersion() reports it (9.19.0 is 91900); 0 when not built in.
std::size_t backend_version();

}  // namespace strata::kernels::cudnn_impl
