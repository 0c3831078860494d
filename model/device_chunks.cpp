#include "model/device_chunks.h"

#include "core/dtype.h"

namespace strata::model {

using kernels::Tensor;

DeviceChunks::DeviceChunks(Device& dev, kernels::Ops& ops, const InMemoryChunks& ref)
    : layout_(ref.layout()), ops_(ops) {
  const DType act = ops.caps().activation;
  for (int c = 0; c < layout_.num_chunks(); ++c) {
    const std::size_t n = layout_.chunk(c).padded_numel;
    params_.emplace_back(dev, n * dtype_bytes(act), "device chunks: parameters");
    grads_.emplace_back(dev, n * sizeof(float), "device chunks: gradients");
    // fp32 staged on the device, then cast to the activation dtype there.
    DeviceBuffer staged(dev, n * sizeof(float), "device chunks: staging");
    ops.stream().copy_async(staged.data(), ref.params(c), n * sizeof(float), CopyKind::host_to_device);
    ops.cast(param_tensor(c), Tensor{staged.data(), DType::fp32, n});
    ops.zero(grad_tensor(c));
    ops.stream().synchronize();  // before `staged` is freed
  }
}

ChunkView DeviceChunks::acquire(int id) {
  return {&layout_.chunk(id), params_.at(std::size_t(id)).data(), ops_.caps().activation};
}

float* DeviceChunks::acquire_grads(int id) {
  return static_cast<float*>(grads_.at(std::size_t(id)).data());
}

Tensor DeviceChunks::param_tensor(int id) {
  return Tensor{params_.at(std::size_t(id)).data(), ops_.caps().activation, layout_.chunk(id).padded_numel};
}

Tensor DeviceChunks::grad_tensor(int id) {
  return Tensor{grads_.at(std::size_t(id)).data(), DType::fp32, layout_.chunk(id).padded_numel};
}

std::vector<float> DeviceChunks::grads(int id) {
  std::vector<float> g(layout_.chunk(id).padded_numel);
  ops_.stream().copy_async(g.data(), grads_.at(std::size_t(id)).data(), g.size() * sizeof(float),
                           CopyKind::device_to_host);
  ops_.stream().synchronize();
  return g;
}

}  // namespace strata::model
