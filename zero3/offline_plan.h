// Planning a run away from its machine: the placement context of a config, a model and a device given by
// its kind and size, as the engine plans on its own device, for `strata config --model` and
// `memprof estimate --machine`.
//
// Example:
//   zero3::OfflinePlan plan(cfg, model, {.B = 1, .T = 2048, .cuda = true, .capacity = 80ull << 30,
//                                        .host_memory = 128ull << 30});
//   zero3::PlacementOption o{.param = OffloadDevice::cpu, .optimizer = OffloadDevice::cpu};
//   zero3::plan_placement(o, plan.ctx, &rates);   // o.fits, o.why_not, o.predicted
//
// Note [The plan before the machine]: the plan is the engine's (zero3/placement.h: plan_input,
// plan_adapters, plan_memory, the checkpointing choice of Note [Checkpointing by choice]) for a device given
// by its size, so that a plan for a GPU can be made on a machine without one. The activations are the
// model's own count (Architecture::activation_bytes) with the CPU ops in the activation dtype the backend
// computes in (bf16 on cuda), which take cuda's matrix workspace as a stand-in; cuDNN's fused attention saves
// its statistics, not (B, NH, T, T), as the CPU's fused attention does. The device's capacity is what is
// given: a CUDA context's own memory is beside it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "config/config.h"
#include "core/device.h"
#include "kernels/ops.h"
#include "model/architecture.h"
#include "zero3/placement.h"
#include "zero3/step_time.h"

namespace strata::zero3 {

struct OfflineDevice {
  int B = 1, T = 1;               // a micro-batch's rows and tokens a row
  int world = 1;                  // ranks
  bool cuda = true;               // the device's kind: cuda (bf16 compute, its workspace) or the host backend
  std::uint64_t capacity = 0;     // the device's bytes
  std::uint64_t host_memory = 0;  // the host's bytes (0: unknown)
};

// Owns what the context points at: not copied or moved.
struct OfflinePlan {
  OfflinePlan(const Config& cfg, const model::ModelConfig& m, const OfflineDevice& d);
  OfflinePlan(const OfflinePlan&) = delete;
  OfflinePlan& operator=(const OfflinePlan&) = delete;

  Config cfg;
  model::ModelConfig model;
  OfflineDevice device;
  DType activation = DType::bf16;
  // The host backend's device and a stream: the CPU ops that count the activations and the ops' bytes, and
  // that measure this machine (zero3/machine.h) where no machine is described.
  std::unique_ptr<Device> dev;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<kernels::Ops> ops;
  model::ModelLayout layout;
  PlanInput in;  // the config's own placement, its ops and capacity set
  ActivationSizes sizes;
  std::optional<bool> checkpointing, activation_offload;  // what the config asks
  PlacementContext ctx;
};

}  // namespace strata::zero3
