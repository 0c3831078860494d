// The model on every backend's compute interface against the CPU reference run (InMemoryChunks and the
// model's own host device): the same weights and batch give the same loss, logits and parameter gradients
// — bit for bit on the host backend, within stated bf16 bounds on cuda (skipped without a GPU, with the
// reason). The parameters and gradients live in device memory (model::DeviceChunks), as the engine's do,
// and the model's activations count against the device's cap.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "kernels/workspace_standin.h"
#include "model/chunk.h"
#include "model/device_chunks.h"
#include "model/llama.h"
#include "tests/core/device_fixture.h"

namespace strata::model {
namespace {

using kernels::Tensor;

// ||a - b|| / ||b||, infinite when anything is NaN.
double rel_l2(const float* a, const float* b, std::size_t n) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

ModelConfig gqa_model() {
  ModelConfig c = ModelConfig::preset("tiny");
  c.name = "backend-test";
  c.n_heads = 4;
  c.n_kv_heads = 2;
  return c;
}

struct Batch {
  int B = 2, T = 12;
  std::vector<std::int32_t> inputs, targets;
};
Batch batch(const ModelConfig& cfg) {
  Batch b;
  for (int i = 0; i < b.B * b.T; ++i) {
    b.inputs.push_back(std::int32_t((i * 37 + 11) % cfg.vocab_size));
    b.targets.push_back(i % 7 == 3 ? -1 : std::int32_t((i * 53 + 5) % cfg.vocab_size));
  }
  return b;
}

class ModelOnBackend : public strata::testing::DeviceTest {};

TEST_P(ModelOnBackend, LossLogitsAndEveryGradientMatchTheCpuReference) {
  const ModelConfig cfg = gqa_model();
  const Batch b = batch(cfg);
  InMemoryChunks ref{ModelLayout(cfg)};
  ref.init(5);
  ref.zero_grads();
  LlamaModel cpu(cfg, {.checkpoint_activations = true});
  const float want_loss = cpu.forward(ref, b.inputs.data(), b.targets.data(), b.B, b.T);
  const std::vector<float> want_logits = cpu.logits();
  cpu.backward(ref, 0.5f);

  std::unique_ptr<Device> dev = open();
  std::unique_ptr<Stream> s = dev->create_stream("model-test");
  std::unique_ptr<kernels::Ops> ops = kernels::make_ops(*dev, *s);
  DeviceChunks chunks(*dev, *ops, ref);
  LlamaModel m(cfg, {.checkpoint_activations = true, .device = dev.get(), .ops = ops.get()});
  const float loss = m.forward(chunks, b.inputs.data(), b.targets.data(), b.B, b.T);
  const std::vector<float> logits = m.logits();
  m.backward(chunks, 0.5f);

  const bool exact = GetParam() == "host";
  // bf16 storage of weights and activations: about 3 significant digits per value, compounded over the
  // layers; fp32 accumulation everywhere.
  if (exact) {
    EXPECT_EQ(loss, want_loss);
    EXPECT_EQ(0, std::memcmp(logits.data(), want_logits.data(), logits.size() * sizeof(float)));
  } else {
    EXPECT_NEAR(loss, want_loss, 2e-2 * std::abs(want_loss));
    EXPECT_LT(rel_l2(logits.data(), want_logits.data(), logits.size()), 3e-2);
  }
  for (int c = 0; c < chunks.layout().num_chunks(); ++c) {
    const std::vector<float> g = chunks.grads(c);
    for (const TensorSpec& t : chunks.layout().chunk(c).tensors) {
      const float* got = g.data() + t.offset;
      const float* want = ref.grads(c) + t.offset;
      if (exact)
        EXPECT_EQ(0, std::memcmp(got, want, t.numel * sizeof(float))) << t.hf_name;
      else
        EXPECT_LT(rel_l2(got, want, t.numel), 6e-2) << t.hf_name;
    }
  }
}

TEST_P(ModelOnBackend, ActivationsCountAgainstTheDeviceCap) {
  const ModelConfig cfg = gqa_model();
  const Batch b = batch(cfg);
  InMemoryChunks ref{ModelLayout(cfg)};
  ref.init(5);
  // Room for the compute interface's own bytes (its matrix-product workspace: cuBLASLt's on cuda, the
  // stand-in of tests/common/workspace_standin.cpp on the host) and the chunks, but not for the
  // activations of this batch.
  std::unique_ptr<Device> probe = open();
  std::unique_ptr<Stream> ps = probe->create_stream("probe");
  std::unique_ptr<kernels::Ops> pops = kernels::make_ops(*probe, *ps);
  const std::size_t act = LlamaModel::activation_bytes(cfg, b.B, b.T, true, *pops);
  std::size_t chunk_bytes = 0;
  for (const ChunkLayout& c : ref.layout().chunks())
    chunk_bytes += c.padded_numel * (dtype_bytes(pops->caps().activation) + sizeof(float));
  std::unique_ptr<Device> dev = open(pops->device_bytes() + chunk_bytes + act / 2);
  std::unique_ptr<Stream> s = dev->create_stream("model-test");
  std::unique_ptr<kernels::Ops> ops = kernels::make_ops(*dev, *s);
  DeviceChunks chunks(*dev, *ops, ref);
  LlamaModel m(cfg, {.checkpoint_activations = true, .device = dev.get(), .ops = ops.get()});
  try {
    m.forward(chunks, b.inputs.data(), b.targets.data(), b.B, b.T);
    FAIL() << "activations of " << act << " bytes fitted in " << act / 2;
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("activations"), std::string::npos) << e.what();
  }
  EXPECT_LE(dev->memory_stats().peak_in_use, dev->caps().capacity);
}

// A model-role compute interface takes cuda's matrix-product workspace from the device on every backend —
// cuBLASLt's on cuda, on the host the CPU ops' stand-in (Note [Workspace stand-in] in
// kernels/workspace_standin.h), so that a device cap computed without it fails in CI as on a GPU — and a
// runtime-role one takes none; OpsOptions.workspace_bytes sets it for one object.
TEST_P(ModelOnBackend, AModelComputeInterfaceTakesCudasWorkspaceFromTheDevice) {
  std::unique_ptr<Device> dev = open();
  std::unique_ptr<Stream> s = dev->create_stream("model-test");
  const std::size_t before = dev->memory_stats().in_use;
  std::unique_ptr<kernels::Ops> model_ops = kernels::make_ops(*dev, *s);
  EXPECT_EQ(model_ops->device_bytes(), kernels::kCudaWorkspaceBytes);
  EXPECT_EQ(dev->memory_stats().in_use, before + kernels::kCudaWorkspaceBytes);
  std::unique_ptr<kernels::Ops> runtime_ops =
      kernels::make_ops(*dev, *s, {.role = kernels::OpsRole::runtime});
  std::unique_ptr<kernels::Ops> without = kernels::make_ops(*dev, *s, {.workspace_bytes = 0});
  EXPECT_EQ(runtime_ops->device_bytes(), 0u);
  EXPECT_EQ(without->device_bytes(), 0u);
  EXPECT_EQ(dev->memory_stats().in_use, before + kernels::kCudaWorkspaceBytes);
}

STRATA_INSTANTIATE_BACKENDS(ModelOnBackend);

}  // namespace
}  // namespace strata::model
