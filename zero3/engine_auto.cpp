// Offload targets chosen for the user, and the step the plan in force is predicted to take.
//
// Note [Placement auto]: zero_optimization.offload_param.device and offload_optimizer.device may be "auto".
// Before the plan, the engine measures this machine (zero3/machine.h, Note [Measured rates]) and plans every
// placement the config allows (placement_candidates: none / cpu / nvme for each "auto" device, the other as
// given; NVMe where its nvme_path is named; stage 3 for params and NVMe) exactly as plan_memory will plan
// the one it takes — the checkpointing and block-input choices, the overlap where it applies — then asks
// whether it fits the device (device_need against the capacity) and the host (85% of RAM: Note [Host room
// for auto] in step_time.h; shared by the ranks on this machine), and predicts its step (zero3/step_time.h).
// The fastest that fits is taken; a placement within 1% of a less offloaded one earlier in the order loses to
// it. Every rank takes rank 0's choice (its rates may differ a little from another's), so every rank plans
// alike (Note [Ranks agree]). Rank 0 logs the table it chose from and the choice; strata train's `train:`
// line then names the placement as for a fixed one. When nothing fits, the refusal names the smallest change
// that would: an nvme_path where a placement through NVMe would fit, else the longest row that fits the least
// demanding placement, else the device it would need.
#include <algorithm>

#include "comm/comm.h"
#include "core/log.h"
#include "core/topology.h"
#include "zero3/engine_impl.h"

namespace strata::zero3 {

using detail::cat;

void Engine::Impl::measure_rates(bool nvme) {
  if (rates_measured) return;
  if (opts.testing.machine_rates) {
    rates = *opts.testing.machine_rates;
    rates_measured = true;
    return;
  }
  const int B = int(cfg.train_micro_batch_size_per_gpu);
  const int T = opts.seq_len > 0 ? opts.seq_len : int(mcfg.max_seq_len);
  const std::vector<std::string> dirs = nvme ? nvme_dirs(cfg) : std::vector<std::string>{};
  MeasureKit kit{.dev = *dev,
                 .compute = *compute_stream,
                 .copy = *gather_stream,
                 .ops = *ops,
                 .activation = act,
                 .working = working_dtype,
                 .cpu_optimizer = [this](std::size_t n) { return cpu_optimizer_rate(n); },
                 .device_optimizer = [this](std::size_t n) { return device_optimizer_rate(n); },
                 .optimizer = opt.get(),
                 .nvme_dirs = dirs,
                 .aio = aio_options(cfg),
                 .cores = int(allowed_cpus().size())};
  rates = measure_machine(kit, mcfg, B, T);
  rates.host_memory = host_memory();
  rates_measured = true;
}

void Engine::Impl::choose_placement() {
  auto& z = cfg.zero_optimization;
  const bool param_auto = z.offload_param.device_auto, optimizer_auto = z.offload_optimizer.device_auto;
  const auto nvme_named = [&](const OffloadParamConfig& p, const OffloadOptimizerConfig& o) {
    return ((p.device == OffloadDevice::nvme || p.device_auto) && !p.nvme_paths.empty()) ||
           ((o.device == OffloadDevice::nvme || o.device_auto) && !o.nvme_paths.empty());
  };
  if (opts.predict_step || param_auto || optimizer_auto)
    measure_rates(nvme_named(z.offload_param, z.offload_optimizer));
  if (!param_auto && !optimizer_auto) return;
  const int B = int(cfg.train_micro_batch_size_per_gpu);
  PlacementContext ctx{
      .cfg = &cfg,
      .model = &mcfg,
      .layout = &layout,
      .world = world,
      .rank = comm->rank(),
      .activation = act,
      .base = measured_plan_input(),  // the measured fields (ops, capacity)
      .frozen_chunks = opts.frozen_chunks,
      .B = B,
      .T = planned_seq_len,
      .sizes = [&](std::int64_t t) { return activation_sizes(mcfg, B, int(t), *ops, opts.documents); },
      .checkpointing = checkpointing_mode(),
      .activation_offload = offload_asked(cfg.activation_checkpointing),
      .host_backend = dev->caps().backend == BackendKind::host,
      .overlap_auto_here = dev->caps().backend != BackendKind::host || cfg.strata.cpu_optim.cores > 0,
      .checkpoints_nvme_path = !checkpoint_nvme_path().empty(),
      .host_memory = host_memory(),
      .local_ranks = std::max(1, comm::rank_from_env().local_size)};
  placement_options = placement_candidates(z, param_auto, optimizer_auto);
  const int mine = zero3::choose_placement(placement_options, ctx, rates);
  const int chosen = int(std::int64_t(every_ranks(std::uint64_t(mine + 1)).front()) - 1);  // rank 0's
  placement_chosen = chosen;
  const std::string table = placements_table(placement_options, chosen);
  if (comm->rank() == 0)
    STRATA_LOG_INFO("zero3: offload placements for ", mcfg.name, " at ", B, " x ", planned_seq_len,
                    " tokens on ", dev->caps().name, " (", format_size(dev->caps().capacity, 1), "; rates ",
                    rates.source, "):\n", table);
  if (chosen < 0)
    throw OutOfMemory(cat("zero_optimization offload devices \"auto\": no placement of ", mcfg.name, " (",
                          mcfg.num_parameters(), " parameters) at ", B, " x ", planned_seq_len,
                          " tokens fits the device (", format_size(dev->caps().capacity, 1),
                          ") and this machine's host memory:\n", table,
                          "The smallest change that fits: ", smallest_change(placement_options, ctx),
                          " (docs/train.md, \"Offload placement auto\")"));
  const PlacementOption& c = placement_options[std::size_t(chosen)];
  z.offload_param.device = c.param;
  z.offload_optimizer.device = c.optimizer;
  z.offload_param.device_auto = z.offload_optimizer.device_auto = false;
  if (comm->rank() == 0)
    STRATA_LOG_INFO("config: offload placement \"auto\" = ", placement_name(c), ": the fastest that fits, ",
                    c.predicted.step, " s a step predicted (bottleneck: ", c.predicted.bottleneck, ")");
}

void Engine::Impl::predict() {
  if (!rates_measured) return;
  Plan p;
  p.memory = plan;
  p.routes.reserve(slots.size());
  for (const ChunkSlot& s : slots) p.routes.push_back(s.route);
  predicted = predict_step(
      step_model(mcfg, int(cfg.train_micro_batch_size_per_gpu), planned_seq_len, planned, p), rates);
  if (comm->rank() == 0)
    STRATA_LOG_INFO("zero3: step predicted ", predicted.step, " s (bottleneck ", predicted.bottleneck,
                    "): the pass ", predicted.pass, " s (compute ", predicted.compute, ", host link ",
                    predicted.link, ", NVMe ", predicted.nvme_pass, ", collectives ", predicted.collectives,
                    "), the update after it ", predicted.update, " s (CPU optimizer ",
                    predicted.cpu_optimizer, ", NVMe ", predicted.nvme_optimizer, ", device optimizer ",
                    predicted.device_optimizer, ")",
                    predicted.missing.empty() ? "" : cat("; ", predicted.missing, " is not known: left out"));
}

const StepPrediction& Engine::predicted_step() const {
  return impl_->predicted;
}
const MachineRates& Engine::machine_rates() const {
  return impl_->rates;
}
const std::vector<PlacementOption>& Engine::placements() const {
  return impl_->placement_options;
}
int Engine::chosen_placement() const {
  return impl_->placement_chosen;
}

}  // namespace strata::zero3
