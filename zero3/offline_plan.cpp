#include "zero3/offline_plan.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/workspace_standin.h"

namespace strata::zero3 {

OfflinePlan::OfflinePlan(const Config& c, const model::ModelConfig& m, const OfflineDevice& d)
    : cfg(c),
      model(m),
      device(d),
      activation(d.cuda || c.bf16.enabled ? DType::bf16 : DType::fp32),
      dev(open_device({.backend = "host", .ordinal = 0, .memory_cap = 0})),
      stream(dev->create_stream("offline-plan")),
      ops(kernels::make_cpu_ops(
          *dev, *stream,
          {.matmul = activation, .workspace_bytes = d.cuda ? kernels::kCudaWorkspaceBytes : 0})),
      layout(model::architecture(model).layout(model, layout_options(d.world))) {
  in = plan_input(cfg, layout, model.tie_embeddings, d.world, 0, activation);
  plan_adapters(in, layout, cfg.zero_optimization);
  in.device_state_by_ops = d.cuda;
  in.device_capacity = d.capacity;
  // The ops' device bytes, counted by the CPU ops computing in `activation` (Note [The plan before the
  // machine]).
  kernels::OpShapes shapes = model::architecture(model).op_shapes(model, d.B, d.T);
  for (const PlannedChunk& ch : in.chunks)
    shapes.reduce_numel = std::max<std::size_t>(shapes.reduce_numel, ch.shard.numel);
  in.ops = (d.cuda ? kernels::kCudaWorkspaceBytes : 0) + ops->scratch_bytes(shapes);
  sizes = activation_sizes(model, d.B, d.T, *ops);
  checkpointing = checkpointing_asked(cfg.strata);
  activation_offload = offload_asked(cfg.activation_checkpointing);
  const auto& z = cfg.zero_optimization;
  ctx = PlacementContext{
      .cfg = &cfg,
      .model = &model,
      .layout = &layout,
      .world = d.world,
      .rank = 0,
      .activation = activation,
      .base = in,
      .frozen_chunks = {},
      .B = d.B,
      .T = d.T,
      .sizes = [this](std::int64_t t) { return activation_sizes(model, device.B, int(t), *ops); },
      .checkpointing = checkpointing,
      .activation_offload = activation_offload,
      .host_backend = !d.cuda,
      .overlap_auto_here = d.cuda || cfg.strata.cpu_optim.cores > 0,
      .checkpoints_nvme_path = !z.offload_optimizer.nvme_paths.empty() || !z.offload_param.nvme_paths.empty(),
      .host_memory = d.host_memory,
      .local_ranks = 1};
}

}  // namespace strata::zero3
