// strata/kernels/cuda/attention_cudnn.h: causal grouped-query attention through cuDNN's fused scaled dot
// product attention (flash attention, forward and backward, cuDNN frontend graph API), for the CUDA compute
// interface (kernels/cuda/ops.cpp). Built with the cuda backend; the cuDNN part only when
// STRATA_WITH_CUDNN (cmake/StrataCudnn.cmake): without it every plan says so and CudaOps uses kernels/cuda's
// own attention. Compiled, never run on a GPU (docs/train.md); what runs without one (the handle's teardown
// order, the frontend's host-side graph checks) is in attention_cudnn_impl.h and tested in CI.
//
// Example (what CudaOps does for one shape):
//   CudnnAttention att(stream);                       // creates nothing on the device yet
//   const CudnnAttention::Plan& p = att.plan({B, T, NH, NKV, HD, DType::bf16});
//   if (p.supported) {                                // else p.why_not says why: use the own kernel
//     // saved: p.sizes.saved fp32 elements, kept from forward to backward; scratch: p.sizes.scratch;
//     // fwd_ws: p.forward_workspace_bytes of device memory — all from the caller, through the Device.
//     att.forward(shape, out, saved, q, k, v, fwd_ws);
//     att.backward(shape, dq, dk, dv, scratch, dout, q, k, v, out, saved);   // out kept, unchanged
//   }
//
// Semantics are kernels/cpu's attention_forward / attention_backward (kernels/cpu/ops.h): q (B,T,NH,HD),
// k and v (B,T,NKV,HD), out (B,T,NH,HD), causal (within the shape's sliding window, if it has one), scale
// 1/sqrt(HD), query head h reads key/value head h / (NH / NKV); backward WRITES dq, dk, dv (=). Tensors hold
// `dtype` (bf16 or fp16); saved and scratch are fp32 tensors whose contents only this class reads (Note
// [cuDNN attention saved state] in the .cpp). All work is enqueued on the stream given at construction;
// nothing synchronises the host.
//
// Threads: public methods take the mutex of the implementation; they may be called from any thread, but
// forward and backward enqueue on the one stream, in call order.
#pragma once

#include <cuda_runtime.h>

#include <compare>
#include <cstddef>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "kernels/ops.h"

namespace strata::kernels {

struct AttentionShape {
  int B = 0, T = 0, NH = 0, NKV = 0, HD = 0;
  // 0: causal; w >= 1: a sliding window, query t seeing keys t - w < s <= t (kernels/ops.h). CudaOps passes
  // 0 for a window no shorter than T (the same attention), so such shapes share the causal plan.
  int window = 0;
  DType dtype = DType::bf16;  // q, k, v, out and the gradients
  auto operator<=>(const AttentionShape&) const = default;
};

class CudnnAttention {
 public:
  // Whether this binary has the cuDNN path (STRATA_WITH_CUDNN at build time).
  static bool compiled_in();

  struct Plan {
    bool supported = false;
    std::string why_not;                      // when !supported: what refused it (build, GPU, shape, cuDNN)
    AttentionSizes sizes;                     // fp32 elements of saved and of backward's scratch
    std::size_t forward_workspace_bytes = 0;  // device memory forward() needs beside saved
  };

  // `stream`: the CUDA stream every call enqueues on (its device is the one used). Allocates nothing: every
  // buffer comes from the caller. No cuDNN call until the first available() or plan(). `deterministic`:
  // the backward graph asks for cuDNN's deterministic algorithm (Note [cuDNN attention determinism]).
  CudnnAttention(cudaStream_t stream, bool deterministic = true);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Whether cuDNN runs on this GPU at all (cuDNN loads, the handle is created, the GPU is sm80 or newer);
  // when not, why (also logged once). A plan may still refuse a shape.
  bool available(std::string* why_not = nullptr) const;

  // What runs where a plan is supported, in words: "cuDNN fused attention (deterministic backward)".
  std::string describe_path() const;

  // The cuDNN graphs for `shape` (forward with softmax statistics, backward), built on first use and kept:
  // supported when both build (the frontend's validate, support check and plan build) on this GPU. Not
  // for T = 1: the pinned frontend's backward refuses a one-token sequence. A logically const cache; the
  // reference stays valid for the object's life.
  const Plan& plan(const AttentionShape& shape) const;

  // out = attention(q, k, v); saved receives what backward needs. `shape` must have a supported plan.
  void forward(const AttentionShape& shape, Tensor out, Tensor saved, Tensor q, Tensor k, Tensor v,
               void* forward_workspace);
  // dq, dk, dv = the gradients of out (written); scratch is cuDNN's workspace (overwritten). out is the
  // forward's output, unchanged since: cuDNN's backward reads it (Note [cuDNN attention saved state]).
  void backward(const AttentionShape& shape, Tensor dq, Tensor dk, Tensor dv, Tensor scratch, Tensor dout,
                Tensor q, Tensor k, Tensor v, Tensor out, Tensor saved);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::kernels
