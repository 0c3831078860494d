// Placement and the memory plan (zero3/placement.h; the formulas are in docs/train.md, "Device memory").
#include "zero3/placement.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "cpu_optim/rule.h"
#include "model/architecture.h"
#include "model/nf4_chunk.h"
#include "tiering/caching_allocator.h"

namespace strata::zero3 {

using tiering::Tier;

Tier home_of(OffloadDevice d) {
  return d == OffloadDevice::none ? Tier::device : d == OffloadDevice::cpu ? Tier::pinned : Tier::nvme;
}

OffloadDevice offload_of(Tier home) {
  return home == Tier::device   ? OffloadDevice::none
         : home == Tier::pinned ? OffloadDevice::cpu
                                : OffloadDevice::nvme;
}

const char* offload_name(OffloadDevice d) {
  return offload_device_name(d);
}

const char* offload_name(Tier home) {
  return offload_device_name(offload_of(home));
}

tiering::ShardHomes shard_homes(const Config& cfg) {
  const ZeroConfig& z = cfg.zero_optimization;
  tiering::ShardHomes h;
  h.param = home_of(z.offload_param.device);
  h.master = h.optim = home_of(z.offload_optimizer.device);
  h.grad = h.optim == Tier::device                              ? Tier::device
           : h.optim == Tier::nvme && cfg.strata.nvme_gradients ? Tier::nvme
                                                                : Tier::pinned;
  return h;
}

tiering::ShardHomes device_optimizer_homes(const tiering::ShardHomes& offloaded) {
  tiering::ShardHomes h = offloaded;
  h.master = h.optim = h.grad = Tier::device;
  return h;
}

int device_optimizer_groups(double ratio, int groups) {
  const double kept = (1.0 - ratio) * double(groups);
  return std::clamp(int(std::floor(kept * (1 + 1e-9))), 0, groups);
}

bool partial_offload(const ZeroConfig& z) {
  const auto& oo = z.offload_optimizer;
  return oo.device != OffloadDevice::none && z.stage == 3 && (oo.ratio_auto || oo.ratio < 1.0);
}

void keep_optimizer_on_device(PlanInput& in, int groups) {
  for (PlannedChunk& c : in.chunks) c.device_optimizer = false;
  for (int g = 0; g < std::min<int>(groups, int(in.groups.size())); ++g)
    for (int c : in.groups[std::size_t(g)]) in.chunks[std::size_t(c)].device_optimizer = true;
}

EngineFacts engine_facts(const Config& cfg, int world) {
  const ZeroConfig& z = cfg.zero_optimization;
  return {.replicated = world > 1 && z.stage<3, .local_accumulation = world> 1 && z.stage == 1,
          .working = cfg.bf16.enabled   ? DType::bf16
                     : cfg.fp16.enabled ? DType::fp16
                                        : DType::fp32,
          .optimizer_states = cpu_optim::Rule(cfg.optimizer).states()};
}

namespace {

// Optimizer sub-groups of the chunks that train: transfers move whole shards, so a chunk larger than
// sub_group_size is a sub-group of its own. Then a numeric offload_optimizer.ratio's partial offload
// (stage 3; "auto" is the engine's choice, made after it measures).
void group_chunks(PlanInput& in, const ZeroConfig& z) {
  in.groups.clear();
  std::uint64_t acc = 0;
  for (int i = 0; i < int(in.chunks.size()); ++i) {
    if (in.chunks[std::size_t(i)].frozen) continue;
    const std::uint64_t n = in.chunks[std::size_t(i)].shard.numel;
    if (in.groups.empty() || acc + n > z.sub_group_size) {
      in.groups.emplace_back();
      acc = 0;
    }
    in.groups.back().push_back(i);
    acc += n;
  }
  const auto& oo = z.offload_optimizer;
  if (oo.device != OffloadDevice::none && z.stage == 3 && !oo.ratio_auto)
    keep_optimizer_on_device(in, device_optimizer_groups(oo.ratio, int(in.groups.size())));
}

}  // namespace

PlanInput plan_input(const Config& cfg, const std::vector<ChunkSize>& chunks, int world, int rank,
                     DType activation) {
  const ZeroConfig& z = cfg.zero_optimization;
  const EngineFacts f = engine_facts(cfg, world);
  const bool replicated = f.replicated;
  PlanInput in;
  in.homes = shard_homes(cfg);
  in.optimizer_states = f.optimizer_states;
  in.working = f.working;
  in.activation = activation;
  in.accumulation_steps = int(std::max<std::int64_t>(1, cfg.gradient_accumulation_steps));
  in.local_accumulation = f.local_accumulation;
  in.overlap = cfg.strata.overlap_optimizer;
  in.world = world;
  in.replicated = replicated;
  for (const ChunkSize& cs : chunks) {
    PlannedChunk c;
    c.numel = cs.padded_numel;
    c.shard = comm::shard_range(cs.padded_numel, world, rank);
    c.param_numel = replicated ? c.numel : c.shard.numel;
    c.param_offset = replicated ? c.shard.offset : 0;
    c.persistent = cs.numel < z.stage3_param_persistence_threshold;
    in.chunks.push_back(c);
  }
  group_chunks(in, z);
  return in;
}

void freeze_chunks(PlanInput& in, const std::vector<int>& chunks, const ZeroConfig& z, const char* what) {
  for (int c : chunks) {
    if (c < 0 || c >= int(in.chunks.size()))
      throw ConfigError(detail::cat(what, ": chunk ", c, " does not exist (the model has ", in.chunks.size(),
                                    " chunks, 0 to ", int(in.chunks.size()) - 1, ")"));
    in.chunks[std::size_t(c)].frozen = true;
  }
  group_chunks(in, z);
}

// Note [Adapters off NVMe]: with offload_param nvme the base streams from NVMe, read once a pass and never
// written. The adapters (and saved modules) change every step: at home on NVMe each step would write them
// back and each pass read them again. They are the small part (r (in + out) per adapted module), so their
// working params stay in pinned host memory, which the plan counts, and the optimizer may then overlap
// with backward for them; strata train says so with the bytes. Their master and optimizer states stay
// where offload_optimizer says.
std::uint64_t plan_adapters(PlanInput& in, const model::ModelLayout& layout, const ZeroConfig& z) {
  const model::LoraSpec& lora = layout.config().lora;
  if (!lora.active()) return 0;
  const std::vector<int> base = layout.frozen_chunks();
  if (!base.empty()) freeze_chunks(in, base, z, "the adapters' frozen base");
  if (lora.nf4_base)
    for (int c : base) {
      const model::ChunkLayout& cl = layout.chunk(c);
      if (!model::nf4_quantizes(cl)) continue;
      PlannedChunk& pc = in.chunks[std::size_t(c)];
      pc.packed = true;
      pc.param_bytes = model::nf4_chunk(cl, in.working, lora.double_quant).bytes;
      pc.param_numel = pc.numel;
      pc.param_offset = pc.shard.offset;
    }
  std::uint64_t pinned = 0;
  if (in.homes.param == Tier::nvme)
    for (PlannedChunk& c : in.chunks)
      if (!c.frozen) c.params_pinned = true, pinned += in.param_bytes(c);
  return pinned;
}

PlanInput plan_input(const Config& cfg, const model::ModelLayout& layout, bool tied_embeddings, int world,
                     int rank, DType activation) {
  std::vector<ChunkSize> sizes;
  for (int i = 0; i < layout.num_chunks(); ++i)
    sizes.push_back({.numel = layout.chunk(i).numel, .padded_numel = layout.chunk(i).padded_numel});
  PlanInput in = plan_input(cfg, sizes, world, rank, activation);
  if (tied_embeddings && layout.head_chunk() != layout.embedding_chunk())
    in.head = layout.head_chunk(), in.embedding = layout.embedding_chunk();
  return in;
}

// Note [Update routes]: how each chunk is updated is one decision, made here from the homes, the ranks,
// the device and the memory plan, and carried in a value (UpdateRoute) that the engine's gradient path
// (zero3/engine_grads.cpp), updater (engine_update.cpp) and overlap (engine_overlap.cpp) read. The routes:
//
//   gradients   device_shard        offload_optimizer none, or a sub-group the ratio keeps on the device
//               pinned_shard        offload_optimizer cpu / nvme: copied off the device at each hand-off
//                                   into the host shard (pinned; or, grads_nvme, through a pinned block to
//                                   NVMe, read back with the states: strata.nvme_gradients)
//               device_accumulator  host shard, gradient_accumulation_steps > 1 and room on the device
//               local_accumulator   stage 1 at N ranks with room: the whole chunk, reduced once a step
//   reduced     none (one rank) | every_handoff (reduce-scatter) | once_a_step (the local accumulator's)
//   stepped by  cpu_optimizer       master in addressable memory (pinned; the host backend's device)
//               nvme_pipeline       master on NVMe: by sub-group through the swap pipeline
//               device_ops          master on a device reached by stream work only (cuda): the ops' AdamW
//               model_cpus          master kept on the host backend's device by offload_optimizer.ratio
//   params      home | staged (to a device reached by streams) | nvme (a pinned copy written out)
//   overlap     updated during backward; defer: else after step() on the overlap's worker (plan_overlap)
//   tail        the model's idle cpus may take it after backward (host backend, optimizer cores of its own)
//
// and what the other parts need to know of the chunk, so that none of them tests a home, the world size,
// the device kind or the stage itself:
//
//   gathered    from param_home; all_gather: stage 3 at N ranks; lockstep: N ranks (Note [Ranks])
//   handed off  to the grad_shard's tier, ending on the compute stream (a device shard at one rank) or the
//               gradient stream
//   norm        device | device_ranks (the compute interface's reductions) | host | host_blocks (N ranks)
//   after step  gathers_wait_update (a device home reached by streams), all_gather_after_step (stages 1
//               and 2 at N ranks: replicated params)
//
// Engine-wide facts (replicated params, the working dtype, the optimizer's states: engine_facts) and
// whether the overlap runs for which chunks (overlap_asked, plan_overlap) are decided here too; the
// engine copies them.
// strata train prints them with the plan (docs/train.md, "How each chunk is updated").
namespace {

UpdateRoute route_of(const PlanInput& in, std::size_t c, bool accumulate) {
  using R = UpdateRoute;
  const tiering::ShardHomes h = in.homes_of(in.chunks[c]);
  R r;
  if (in.chunks[c].frozen) {  // gathered as any other; nothing else happens to it
    r.trains = false;
    r.param_home = h.param;
    r.all_gather = in.world > 1 && !in.replicated && !in.chunks[c].packed;
    r.lockstep = in.world > 1;
    return r;
  }
  if (in.local_accumulation && accumulate)
    r.grads = R::Grads::local_accumulator;
  else if (h.grad == Tier::device)
    r.grads = R::Grads::device_shard;
  else
    r.grads = accumulate ? R::Grads::device_accumulator : R::Grads::pinned_shard;
  r.grads_nvme = h.grad == Tier::nvme;
  r.reduce = in.world == 1                            ? R::Reduce::none
             : r.grads == R::Grads::local_accumulator ? R::Reduce::once_a_step
                                                      : R::Reduce::every_handoff;
  if (h.master == Tier::nvme)
    r.stepper = R::Stepper::nvme_pipeline;
  else if (h.master == Tier::device && in.device_state_by_ops)
    r.stepper = R::Stepper::device_ops;
  else if (in.chunks[c].device_optimizer)
    r.stepper = R::Stepper::model_cpus;
  else
    r.stepper = R::Stepper::cpu_optimizer;
  // The device optimizer writes a device home in place; the CPU's new params reach it through staging.
  if (h.param == Tier::nvme)
    r.params = R::Params::nvme;
  else if (h.param == Tier::device && in.device_state_by_ops && r.stepper != R::Stepper::device_ops)
    r.params = R::Params::staged;
  r.tail = in.tail_on_model_cpus && h.param != Tier::nvme && r.stepper == R::Stepper::cpu_optimizer;
  r.param_home = h.param;
  r.all_gather = in.world > 1 && !in.replicated;
  r.lockstep = in.world > 1;
  r.grad_shard = h.grad;
  r.handoff = h.grad == Tier::device && in.world == 1 ? R::Handoff::compute_stream : R::Handoff::grad_stream;
  if (r.stepper == R::Stepper::device_ops)
    r.norm = in.world > 1 ? R::Norm::device_ranks : R::Norm::device;
  else
    r.norm = in.world > 1 ? R::Norm::host_blocks : R::Norm::host;
  r.gathers_wait_update = in.device_state_by_ops && h.param == Tier::device;
  r.all_gather_after_step = in.replicated;
  return r;
}

}  // namespace

nlohmann::json to_json(const MemoryPlan& p) {
  return {{"device_state", p.device_state},
          {"device_working_set", p.device_working_set},
          {"device_activations", p.device_activations},
          {"checkpoint_activations", p.checkpoint_activations},
          {"device_activations_checkpointed", p.device_activations_checkpointed},
          {"device_activations_all", p.device_activations_all},
          {"activation_offload", p.activation_offload},
          {"device_checkpoint_window", p.device_checkpoint_window},
          {"pinned_activations", p.pinned_activations},
          {"nvme_activations", p.nvme_activations},
          {"device_activations_other_offload", p.device_activations_other_offload},
          {"device_ops", p.device_ops},
          {"device_accumulators", p.device_accumulators},
          {"device_accumulator_bytes", p.device_accumulator_bytes},
          {"device_cache", p.device_cache},
          {"device_headroom", p.device_headroom},
          {"longest_seq_len", p.longest_seq_len},
          {"activation_bytes_per_token", p.activation_bytes_per_token},
          {"device_need", p.device_need()},
          {"pinned_state", p.pinned_state},
          {"pinned_staging", p.pinned_staging},
          {"pinned_budget", p.pinned_budget},
          {"pinned_reads", p.pinned_reads},
          {"pinned_cache", p.pinned_cache},
          {"pinned_optimizer", p.pinned_optimizer},
          {"pinned_grad_window", p.pinned_grad_window},
          {"buffers_only", p.buffers_only},
          {"param_cache", p.param_cache},
          {"nvme_state", p.nvme_state},
          {"nvme_params", p.nvme_params},
          {"nvme_budget", p.nvme_budget},
          {"optimizer_groups", p.optimizer_groups},
          {"device_optimizer_groups", p.device_optimizer_groups},
          {"offload_ratio", p.offload_ratio},
          {"overlap_groups", p.overlap_groups},
          {"overlap_host", p.overlap_host}};
}

std::string describe(const MemoryPlan& p, tiering::Tier grad_home, bool each_rank) {
  const char* per = each_rank ? " (each rank)" : "";
  std::string out = detail::cat(
      "device plan", per, ": state ", format_size(p.device_state, 1), " + working set ",
      format_size(p.device_working_set, 1), " + activations ", format_size(p.device_activations, 1),
      " (checkpointing ", p.checkpoint_activations ? "on" : "off", ", ",
      p.checkpoint_activations ? "off" : "on", ": ",
      format_size(p.checkpoint_activations ? p.device_activations_all : p.device_activations_checkpointed, 1),
      ")",
      p.checkpoint_activations
          ? detail::cat(
                " with the block inputs ",
                p.activation_offload
                    ? detail::cat(
                          p.nvme_activations > 0
                              ? detail::cat("on NVMe (", format_size(p.nvme_activations, 1), ", through ",
                                            format_size(p.pinned_activations, 1), " of pinned memory")
                              : detail::cat("in pinned host memory (", format_size(p.pinned_activations, 1)),
                          "; ", kCheckpointWindow,
                          " on the device at once: ", format_size(p.device_checkpoint_window, 1), ")")
                    : "on the device",
                " (activation_checkpointing.cpu_checkpointing ", p.activation_offload ? "off" : "on", ": ",
                format_size(p.device_activations_other_offload, 1), ")")
          : std::string(),
      " + compute workspace ", format_size(p.device_ops, 1), " + gradient accumulators ",
      format_size(p.device_accumulator_bytes, 1), " (", p.device_accumulators, " chunks) + chunk cache ",
      format_size(p.device_cache, 1),
      p.device_headroom > 0
          ? detail::cat(", beside ", format_size(p.device_headroom, 1), " kept for the CUDA libraries")
          : std::string(),
      " (docs/train.md, \"Device memory\")\n");
  // Host memory: what the state keeps pinned and the buffers the config asks for (NVMe swap buffers, the
  // gradient window and staging); with both offloads on NVMe, only buffers (Note [Gradients through NVMe]).
  out +=
      detail::cat("host plan", per, ": pinned state ", format_size(p.pinned_state, 1), " + buffers ",
                  format_size(p.pinned_staging, 1),
                  p.activation_offload ? detail::cat(" + activations ", format_size(p.pinned_activations, 1))
                                       : std::string(),
                  " (pinned pool budget ", format_size(p.pinned_budget, 1), "), NVMe state ",
                  format_size(p.nvme_state, 1),
                  p.nvme_activations > 0 ? detail::cat(" + activations ", format_size(p.nvme_activations, 1))
                                         : std::string(),
                  "; fp32 gradients ",
                  grad_home == tiering::Tier::nvme     ? "on NVMe"
                  : grad_home == tiering::Tier::pinned ? "in pinned host memory"
                                                       : "on the device",
                  "\n");
  return out;
}

std::string describe(const UpdateRoute& r) {
  using R = UpdateRoute;
  if (!r.trains) return "frozen: gathered only (no gradients, no optimizer)";
  // In the order of the enumerators.
  static constexpr const char* grads[] = {"gradients in the device shard", "gradients to the pinned shard",
                                          "gradients summed on the device, to the pinned shard once a step",
                                          "whole-chunk gradients summed on the device"};
  static constexpr const char* reduce[] = {"", ", reduce-scattered at every hand-off",
                                           ", reduce-scattered once a step"};
  static constexpr const char* stepper[] = {
      "; CPU optimizer", "; CPU optimizer through the NVMe swap pipeline",
      "; device optimizer (compute stream)", "; device optimizer (the model's cpus)"};
  // The same where the host shard is on NVMe (never the device's routes; NVMe needs stage 3, so never
  // stage 1's local accumulator).
  static constexpr const char* grads_nvme[] = {
      nullptr, "gradients to NVMe", "gradients summed on the device, to NVMe once a step", nullptr};
  const int g = int(r.grads);
  std::string s = r.grads_nvme && grads_nvme[g] ? grads_nvme[g] : grads[g];
  s += reduce[int(r.reduce)];
  s += stepper[int(r.stepper)];
  if (r.params == R::Params::staged) s += ", params staged to the device";
  if (r.params == R::Params::nvme) s += ", params written to NVMe";
  if (r.overlap) s += ", overlapped with backward";
  if (r.defer) s += r.overlap ? " (else deferred)" : ", deferred to the next forward";
  if (r.tail) s += ", shared with the model's cpus";
  return s;
}

std::vector<ConfigRoute> config_routes(const Config& cfg, bool by_ops) {
  const ZeroConfig& z = cfg.zero_optimization;
  // Two chunks of a sub-group each (sub_group_size elements), padded for the world size.
  const std::uint64_t n = std::max<std::uint64_t>(1, z.sub_group_size), m = chunk_multiple(cfg.world_size);
  const ChunkSize size{.numel = n, .padded_numel = (n + m - 1) / m * m};
  PlanInput in = plan_input(cfg, {size, size}, cfg.world_size, 0, DType::fp32);
  in.device_state_by_ops = by_ops;
  in.tail_on_model_cpus = !by_ops && cfg.strata.cpu_optim.cores > 0;
  in.device_capacity = std::numeric_limits<std::uint64_t>::max() / 2;  // room for every accumulator
  const bool partial = partial_offload(z);
  keep_optimizer_on_device(in, partial ? 1 : 0);
  const Plan p = plan_memory(in, z);
  if (!partial) return {{"every chunk", p.routes[1]}};
  return {{"offloaded", p.routes[1]}, {"kept on the device by offload_optimizer.ratio", p.routes[0]}};
}

std::string describe(const std::vector<UpdateRoute>& routes, const std::string& indent) {
  std::string s;
  for (std::size_t a = 0; a < routes.size();) {
    std::size_t b = a + 1;
    while (b < routes.size() && routes[b] == routes[a]) ++b;
    if (!s.empty()) s += "\n";
    s += indent;
    s += b == a + 1 ? "chunk " + std::to_string(a)
                    : "chunks " + std::to_string(a) + "-" + std::to_string(b - 1);
    s += ": " + describe(routes[a]);
    a = b;
  }
  return s;
}

bool overlap_asked(const PlanInput& in) {
  using OV = StrataConfig::Overlap;
  // "auto": where the model computes on a device and the optimizer in pinned host memory — the CPU is
  // otherwise idle during backward. On the host backend only when the optimizer has cores of its own
  // (strata.cpu_optim.cores, Note [Cores]): sharing them, the early updates slow backward as much as they
  // save (measured: bench/RESULTS.md).
  return in.overlap == OV::on ||
         (in.overlap == OV::automatic && in.homes.master == Tier::pinned && in.overlap_auto_here);
}

std::uint64_t overlap_copy_bytes(const PlanInput& in, std::uint64_t shard_numel) {
  constexpr std::uint64_t kCopyAlign = 64;
  const std::uint64_t per =
      4 * std::uint64_t(1 + in.optimizer_states) + std::uint64_t(dtype_bytes(in.working));
  return (shard_numel * per + kCopyAlign - 1) / kCopyAlign * kCopyAlign;
}

OverlapDecision plan_overlap(std::vector<UpdateRoute>& routes, MemoryPlan& m, const PlanInput& in,
                             std::uint64_t room, const std::function<std::uint64_t(int chunk)>& copy_bytes) {
  OverlapDecision d;
  if (in.homes.master == Tier::nvme)
    d.why_not =
        "the optimizer runs after backward: offload_optimizer.device is nvme (its states are swapped by "
        "sub-group after backward)";
  else if (in.homes.master == Tier::device && in.device_state_by_ops)
    d.why_not =
        "the optimizer runs after backward: the optimizer runs on the device (offload_optimizer.device none)";
  else if (std::any_of(in.chunks.begin(), in.chunks.end(), [&](const PlannedChunk& c) {
             return !c.frozen && in.homes_of(c).param == Tier::nvme;
           }))
    d.why_not =
        "the optimizer runs after backward: offload_param.device is nvme (new working params go through the "
        "NVMe tier after backward)";
  else if (routes.empty())
    d.why_not = "the model has no chunks";
  if (!d.why_not.empty()) return d;
  const int C = int(routes.size());
  std::uint64_t total = 0;
  for (int i = C; i-- > 0;) {                      // backward finishes the last chunks first
    if (!routes[std::size_t(i)].trains) continue;  // frozen: nothing to update
    // offload_optimizer.ratio keeps the first chunks' optimizer on the device: the device optimizer's.
    if (routes[std::size_t(i)].device_optimizer()) break;
    const std::uint64_t b = copy_bytes(i);
    if (total + b > room) break;
    total += b;
    ++d.chunks;
  }
  if (d.chunks == 0) {
    d.ratio_keeps_all = routes.back().device_optimizer();
    d.why_not = d.ratio_keeps_all
                    ? "offload_optimizer.ratio keeps every sub-group on the device: the device "
                      "optimizer runs after backward"
                    : "no room in host memory for the rollback copies (" + format_size(copy_bytes(C - 1)) +
                          " for the last chunk): the optimizer runs after backward";
    return d;
  }
  for (int i = C, marked = 0; i-- > 0 && marked < d.chunks;)
    if (routes[std::size_t(i)].trains) routes[std::size_t(i)].overlap = true, ++marked;
  // The others are left to the worker after step() where the update is made in place: the CPU optimizer,
  // the params written at their home, and no all-gather of the params after the step.
  for (UpdateRoute& r : routes)
    r.defer = r.trains && !in.replicated && r.stepper == UpdateRoute::Stepper::cpu_optimizer &&
              r.params == UpdateRoute::Params::home;
  m.overlap_groups = int(std::count_if(in.groups.begin(), in.groups.end(), [&](const std::vector<int>& g) {
    return std::any_of(g.begin(), g.end(), [&](int c) { return routes[std::size_t(c)].overlap; });
  }));
  m.overlap_host = total;
  return d;
}

std::optional<bool> checkpointing_asked(const StrataConfig& s) {
  if (s.checkpoint_activations == StrataConfig::Checkpointing::automatic) return std::nullopt;
  return s.checkpoint_activations == StrataConfig::Checkpointing::on;
}

bool checkpointing_for(PlanInput in, const ZeroConfig& z, std::optional<bool> fixed,
                       std::uint64_t activations_all) {
  if (fixed) return *fixed;
  in.activations = activations_all;
  return plan_memory(in, z).memory.device_need() > in.device_capacity;
}

std::optional<bool> offload_asked(const ActivationCheckpointingConfig& a) {
  using C = ActivationCheckpointingConfig::CpuCheckpointing;
  if (a.cpu_checkpointing == C::automatic) return std::nullopt;
  return a.cpu_checkpointing == C::on;
}

ActivationSizes activation_sizes(const model::ModelConfig& m, int B, int T, const kernels::Ops& ops,
                                 bool documents) {
  const model::Architecture& arch = model::architecture(m);
  const model::Architecture::Checkpoints k = arch.checkpoints(m, B, T, ops);
  return {.all = arch.activation_bytes(m, B, T, false, ops, false, documents),
          .checkpointed = arch.activation_bytes(m, B, T, true, ops, false, documents),
          .offloaded = arch.activation_bytes(m, B, T, true, ops, true, documents),
          .checkpoints = k.count,
          .checkpoint_bytes = k.bytes};
}

void note_activations(MemoryPlan& p, const ActivationSizes& a, ActivationChoice c) {
  p.checkpoint_activations = c.checkpoint;
  p.device_activations_checkpointed = a.checkpointed;
  p.device_activations_all = a.all;
  PlanInput other;
  apply_activations(other, a, {true, !(c.checkpoint && c.offload)});
  p.device_activations_other_offload = other.activations + other.checkpoint_window;
}

void apply_activations(PlanInput& in, const ActivationSizes& a, ActivationChoice c) {
  const bool off = c.checkpoint && c.offload;
  in.activations = !c.checkpoint ? a.all : off ? a.offloaded : a.checkpointed;
  const tiering::AllocatorOptions da = tiering::device_allocator_options(tiering::TierOptions{});
  in.checkpoint_window =
      off ? std::uint64_t(std::min(kCheckpointWindow, a.checkpoints)) *
                std::uint64_t(tiering::CachingAllocator::block_bytes(da, std::size_t(a.checkpoint_bytes)))
          : 0;
  in.checkpoint_host = off ? std::uint64_t(a.checkpoints) * a.checkpoint_bytes : 0;
  in.checkpoint_bytes = off ? a.checkpoint_bytes : 0;
}

ActivationChoice choose_activations(PlanInput in, const ZeroConfig& z, std::optional<bool> checkpointing,
                                    std::optional<bool> offload, const ActivationSizes& a) {
  ActivationChoice c;
  c.checkpoint = checkpointing_for(in, z, checkpointing, a.all);
  if (!c.checkpoint) return {false, false};
  if (offload) {
    c.offload = *offload;
    return c;
  }
  apply_activations(in, a, {true, false});
  c.offload = plan_memory(in, z).memory.device_need() > in.device_capacity;
  return c;
}

std::int64_t longest_sequence(PlanInput in, const ZeroConfig& z, std::int64_t max_tokens,
                              const std::function<ActivationSizes(std::int64_t T)>& sizes,
                              std::optional<bool> checkpointing, std::optional<bool> offload) {
  auto fits = [&](std::int64_t T) {
    const ActivationSizes a = sizes(T);
    for (ActivationChoice c : {ActivationChoice{false, false}, {true, false}, {true, true}}) {
      if (checkpointing && *checkpointing != c.checkpoint) continue;
      if (offload && c.checkpoint && *offload != c.offload) continue;
      apply_activations(in, a, c);
      if (plan_memory(in, z).memory.device_need() <= in.device_capacity) return true;
    }
    return false;
  };
  if (max_tokens < 1 || !fits(1)) return 0;
  std::int64_t lo = 1, hi = max_tokens;  // fits(lo); the answer is in [lo, hi]
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid))
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

LinkBytes link_bytes_per_step(const PlanInput& in, const Plan& p) {
  using R = UpdateRoute;
  LinkBytes b;
  const std::uint64_t micro = std::uint64_t(std::max(1, in.accumulation_steps));
  for (std::size_t c = 0; c < in.chunks.size(); ++c) {
    const PlannedChunk& pc = in.chunks[c];
    const R& r = p.routes[c];
    if (r.param_home != Tier::device) b.gathers += 2 * micro * in.param_bytes(pc);
    if (!r.trains) continue;
    const std::uint64_t shard = pc.shard.numel * sizeof(float);
    if (r.grads == R::Grads::pinned_shard) b.gradients += micro * shard;
    if (r.grads == R::Grads::device_accumulator) b.gradients += shard;
    if (r.params == R::Params::staged) b.params += pc.shard.numel * std::uint64_t(dtype_bytes(in.working));
  }
  return b;
}

Plan plan_memory(const PlanInput& in, const ZeroConfig& z) {
  Plan p;
  MemoryPlan& m = p.memory;
  const tiering::ShardHomes& homes = in.homes;
  const std::uint64_t working_bytes = dtype_bytes(in.working);
  std::uint64_t total = 0, largest_group = 0, largest_read = 0;
  for (const PlannedChunk& c : in.chunks) {
    total += c.shard.numel;
    // A read buffer holds one whole chunk's working copy (packed: its packed bytes).
    if (in.homes_of(c).param == Tier::nvme)
      largest_read = std::max(largest_read, c.packed ? c.param_bytes : c.numel * working_bytes);
    // The shard buffers (gradient staging, update scratch) serve the chunks that train.
    if (!c.frozen) p.largest_shard = std::max<std::uint64_t>(p.largest_shard, c.shard.numel);
  }
  for (const auto& g : in.groups) {
    std::uint64_t n = 0;
    for (int c : g) n += in.chunks[std::size_t(c)].shard.numel;
    largest_group = std::max(largest_group, n);
  }
  // Device bytes are counted as the device allocator counts them (its options are the tier manager's;
  // see tiering/caching_allocator.h, Note [exact segments]), so the plan is what the step can peak at.
  const tiering::AllocatorOptions da = tiering::device_allocator_options(tiering::TierOptions{});
  auto block = [&](std::uint64_t bytes) {
    return std::uint64_t(tiering::CachingAllocator::block_bytes(da, bytes));
  };
  auto add = [&](Tier t, std::uint64_t shard_bytes) {
    std::uint64_t& sum = t == Tier::device   ? m.device_state
                         : t == Tier::pinned ? m.pinned_state
                                             : m.nvme_state;
    sum += t == Tier::device ? block(shard_bytes) : shard_bytes;
  };
  bool grads_on_device = false, grads_pinned = false, grads_nvme = false, stepped_on_host = false;
  for (const PlannedChunk& c : in.chunks) {
    const std::uint64_t n = c.shard.numel;
    const tiering::ShardHomes h = in.homes_of(c);
    p.gather_block.push_back(block(c.numel * dtype_bytes(in.activation)));
    p.grad_block.push_back(c.frozen ? 0 : block(c.numel * sizeof(float)));
    add(h.param, in.param_bytes(c));
    if (h.param == Tier::nvme) m.nvme_params += in.param_bytes(c);
    if (c.frozen) continue;  // its working copy only
    add(h.grad, n * 4);
    add(h.master, n * 4);
    for (int i = 0; i < in.optimizer_states; ++i) add(h.optim, n * 4);
    grads_on_device = grads_on_device || h.grad == Tier::device;
    grads_pinned = grads_pinned || h.grad == Tier::pinned;
    grads_nvme = grads_nvme || h.grad == Tier::nvme;
    stepped_on_host = stepped_on_host || h.master != Tier::device;
  }
  m.optimizer_groups = int(in.groups.size());
  for (const auto& g : in.groups)
    if (!g.empty() && in.chunks[std::size_t(g.front())].device_optimizer) ++m.device_optimizer_groups;
  if (homes.master != Tier::device && !in.groups.empty())
    m.offload_ratio = 1.0 - double(m.device_optimizer_groups) / double(in.groups.size());
  // The working set: what the model holds at once — one chunk with its gradient buffer, or (tied
  // embeddings) the head's and the embedding's together while the head runs. Persistent chunks are kept
  // after release whatever their reuse distance, but in the cache: they give way to the working set like
  // any kept chunk (zero3/engine_cache.cpp, Note [Device room]).
  auto held = [&](int c) { return p.gather_block[std::size_t(c)] + p.grad_block[std::size_t(c)]; };
  for (int c = 0; c < int(in.chunks.size()); ++c) {
    if (in.chunks[std::size_t(c)].persistent)
      p.persistent_bytes += p.gather_block[std::size_t(c)], ++p.persistent_chunks;
    m.device_working_set = std::max(m.device_working_set, held(c));
  }
  if (in.head >= 0 && in.embedding >= 0)
    m.device_working_set = std::max(m.device_working_set, held(in.head) + held(in.embedding));
  m.device_activations = in.activations + in.checkpoint_window;
  m.activation_offload = in.checkpoint_window > 0 || in.checkpoint_host > 0;
  m.device_checkpoint_window = in.checkpoint_window;
  m.pinned_activations = in.checkpoint_host;
  if (in.checkpoints_on_nvme && in.checkpoint_host > 0) {
    m.nvme_activations = in.checkpoint_host;
    m.pinned_activations =
        std::min(in.checkpoint_host, std::uint64_t(kCheckpointWindow + 1) * in.checkpoint_bytes);
  }
  m.device_ops = in.ops;
  // Per-chunk gradient squared norms and non-finite flags, 16 bytes a chunk, when the compute interface
  // reduces device-home gradients.
  if (in.device_state_by_ops && grads_on_device) m.device_state += block(in.chunks.size() * 16);
  std::uint64_t room = in.device_capacity > m.device_need() ? in.device_capacity - m.device_need() : 0;
  // Device accumulators (MemoryPlan.device_accumulators): chunk by chunk while the room above two of the
  // largest gathered chunks holds them.
  std::vector<char> accumulate(in.chunks.size(), 0);
  std::uint64_t two_chunks = 0, largest_gather = 0;
  for (std::uint64_t b : p.gather_block) largest_gather = std::max(largest_gather, b);
  two_chunks = 2 * largest_gather;
  if (in.accumulation_steps > 1 && room > two_chunks) {
    std::uint64_t spare = room - two_chunks;
    for (std::size_t c = 0; c < in.chunks.size(); ++c) {
      // A shard accumulator where the shard is already on the device would add nothing; stage 1's local
      // ones hold the whole chunk, before the reduction.
      if (in.chunks[c].frozen) continue;
      if (!in.local_accumulation && in.homes_of(in.chunks[c]).grad == Tier::device) continue;
      const std::uint64_t b =
          block((in.local_accumulation ? in.chunks[c].numel : in.chunks[c].shard.numel) * sizeof(float));
      if (b > spare) continue;
      accumulate[c] = 1;
      spare -= b;
      ++m.device_accumulators;
      m.device_accumulator_bytes += b;
    }
  }
  m.device_cache = room - m.device_accumulator_bytes;

  // Note [Host memory bounded by buffers]: the pinned pool's buffers, by when they are in use.
  //   reads     parameter reads from NVMe in flight (forward, backward, and the next forward's prefetch)
  //   cache     pinned copies kept after a read, up to offload_param.max_in_cpu elements
  //   grads     gradient shards on their way to NVMe, and their staging (backward; drained before the step)
  //   optimizer the swap pipeline's sub-group window, with the new working params on their way home (step)
  // With the params and the optimizer on NVMe and the gradients too, the optimizer runs after backward
  // (plan_overlap: no early updates, nothing deferred), so the gradient window and the optimizer's are
  // never in use at once and share their room; and the cache is not kept, so that pinned memory is the
  // buffers' and nothing grows with the model or with max_in_cpu. Elsewhere the windows add up, and the
  // cache too.
  std::uint64_t reads = 0, grad_window = 0, optimizer = 0;
  if (homes.param == Tier::nvme) {
    // A read buffer holds one whole chunk, whatever buffer_size says (Engine::check_fits warns).
    reads = std::uint64_t(std::max<std::int64_t>(1, z.offload_param.buffer_count)) * largest_read;
    m.param_cache = std::min<std::uint64_t>(z.offload_param.max_in_cpu, total);
  }
  if (homes.master == Tier::nvme) {
    // Each swapped sub-group holds its master, states and (on NVMe) gradients in pinned buffers.
    const std::size_t swapped = std::size_t(1 + in.optimizer_states + (grads_nvme ? 1 : 0));
    p.group_window = std::max<std::size_t>(1, std::size_t(z.offload_optimizer.buffer_count) / swapped);
    optimizer = p.group_window * largest_group * 4 * swapped;
  }
  // Gradient shards on their way to NVMe and their staging block (Note [Gradients through NVMe]).
  if (grads_nvme) grad_window = (kNvmeGradWindow + 1) * p.largest_shard * sizeof(float);
  if (homes.param != Tier::pinned && homes.master != Tier::device)
    optimizer += largest_group * working_bytes;  // new working params on their way home
  const bool buffers_only = homes.param == Tier::nvme && homes.master == Tier::nvme && grads_nvme;
  if (buffers_only) m.param_cache = 0;
  const std::uint64_t cache = m.param_cache * working_bytes;
  std::uint64_t staging =
      reads + cache + (buffers_only ? std::max(grad_window, optimizer) : grad_window + optimizer);
  m.pinned_staging = staging;
  m.pinned_reads = reads, m.pinned_cache = cache, m.pinned_optimizer = optimizer;
  m.pinned_grad_window = grad_window, m.buffers_only = buffers_only;
  const std::uint64_t slab = 64ull << 20;
  m.pinned_budget = m.pinned_state + staging + 2 * slab + (staging + m.pinned_state) / 16;
  // The block inputs off the device (Note [Checkpoints off the device]): in the pool beside the state.
  m.pinned_budget += m.pinned_activations + m.pinned_activations / 16;
  // The gradient staging buffer (accumulation into a pinned shard) is pinned memory of the engine's own,
  // outside the tier manager's budget; so is the parameter staging of device-home params stepped on the
  // host.
  if (grads_pinned) m.pinned_staging += p.largest_shard * sizeof(float);
  if (in.device_state_by_ops && homes.param == Tier::device && stepped_on_host)
    m.pinned_staging += p.largest_shard * working_bytes;
  if (const std::uint64_t nvme = m.nvme_state + m.nvme_activations; nvme > 0)
    m.nvme_budget = nvme + nvme / 16 + (64ull << 20);
  p.routes.reserve(in.chunks.size());
  for (std::size_t c = 0; c < in.chunks.size(); ++c) p.routes.push_back(route_of(in, c, accumulate[c] != 0));
  return p;
}

}  // namespace strata::zero3
