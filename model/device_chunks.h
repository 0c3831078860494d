// strata/model/device_chunks.h: every chunk resident in device memory — the parameters in the compute
// interface's activation dtype, the gradients as fp32 accumulators — for runs whose whole model fits the
// device: the compute-only ceiling of bench/step and the model tests on each backend.
//
// Example:
//   InMemoryChunks ref{ModelLayout(cfg)};
//   ref.init(1);
//   DeviceChunks chunks(dev, ops, ref);                 // copies ref's fp32 parameters onto the device
//   LlamaModel m(cfg, {.checkpoint_activations = true, .device = &dev, .ops = &ops});
//   m.forward(chunks, ...), m.backward(chunks);       // gradients add into chunks.grad_tensor(c)
//   ops.adamw(master, chunks.grad_tensor(c), m, v, chunks.param_tensor(c), ...);
#pragma once

#include <vector>

#include "core/device.h"
#include "kernels/ops.h"
#include "model/chunk.h"

namespace strata::model {

class DeviceChunks final : public ChunkProvider {
 public:
  // Allocates every chunk on `dev` (counted against its cap) and fills the parameters from `ref`'s,
  // rounded to the activation dtype on the device; gradients zero. Synchronises `ops`' stream.
  DeviceChunks(Device& dev, kernels::Ops& ops, const InMemoryChunks& ref);

  const ModelLayout& layout() const override { return layout_; }
  ChunkView acquire(int id) override;
  void release(int) override {}
  float* acquire_grads(int id) override;
  void release_grads(int) override {}

  // Chunk `id` on the device: its parameters (padded_numel, activation dtype) and gradients (fp32).
  kernels::Tensor param_tensor(int id);
  kernels::Tensor grad_tensor(int id);
  // Chunk `id`'s gradients copied to the host (waits for the stream).
  std::vector<float> grads(int id);

 private:
  ModelLayout layout_;
  kernels::Ops& ops_;
  std::vector<DeviceBuffer> params_, grads_;
};

}  // namespace strata::model
