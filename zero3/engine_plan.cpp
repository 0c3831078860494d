// The engine's plan: what the step needs where (plan_memory, check_fits and the refusal that names the
// largest need), the cores a rank computes and optimizes on (Note [Cores]), and the ranks agreeing on the
// capacity and the overlap room (Note [Ranks agree]). engine.cpp builds the engine around it.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <limits>

#include "core/log.h"
#include "core/topology.h"
#include "model/architecture.h"
#include "zero3/engine_impl.h"

namespace strata::zero3 {

using detail::cat;

// Half of what the plans of the ranks on this machine leave of check_fits' 90% of RAM, shared evenly between
// those ranks (the other half stays free: with all of it, 13 of the 720m-byte model's 16 chunks overlapped
// on this 23 GiB machine and backward slowed under the memory pressure as much as the step gained). The
// least over ranks (Note [Ranks agree]): every rank overlaps the same chunks.
std::uint64_t Engine::Impl::overlap_room() {
  const std::uint64_t ram = host_memory();
  const std::uint64_t host = host_need_here;
  const std::vector<std::uint64_t> rooms = every_ranks(
      ram == 0 ? std::numeric_limits<std::uint64_t>::max()
               : (ram / 10 * 9 > host ? (ram / 10 * 9 - host) / 2 / std::uint64_t(ranks_here) : 0));
  return *std::min_element(rooms.begin(), rooms.end());
}

void Engine::Impl::plan_memory() {
  PlanInput in = measured_plan_input();
  const int B = int(cfg.train_micro_batch_size_per_gpu);
  const ActivationSizes sizes = activation_sizes(mcfg, B, planned_seq_len, *ops, opts.documents);
  const ActivationChoice choice = choose_activations(in, cfg.zero_optimization, checkpointing_mode(),
                                                     offload_asked(cfg.activation_checkpointing), sizes);
  checkpoint_activations = choice.checkpoint;
  if (choice.checkpoint && !offload_asked(cfg.activation_checkpointing) && comm->rank() == 0) {
    PlanInput on_device = in;
    apply_activations(on_device, sizes, {true, false});
    STRATA_LOG_INFO(
        "config: activation_checkpointing.cpu_checkpointing \"auto\" = ", choice.offload ? "true" : "false",
        ": the plan with the block inputs on the device needs ",
        format_size(zero3::plan_memory(on_device, cfg.zero_optimization).memory.device_need()),
        " of the device's ", format_size(in.device_capacity));
  }
  apply_activations(in, sizes, choice);
  Plan p = plan_with_ratio(in);
  // Note [Checkpoints off the device]: NVMe is the next tier where pinned memory would not hold them. Every
  // rank takes the same tier (Note [Ranks agree]): one collective on every rank, then the plan again with
  // the ratio already chosen (zero3::plan_memory: no collective).
  const bool too_big = plan_pinned_too_big(p.memory);
  const std::vector<std::uint64_t> asked = every_ranks(too_big ? 1 : 0);
  const std::uint64_t pinned = p.memory.pinned_activations;
  if (std::find(asked.begin(), asked.end(), 1) != asked.end() && !checkpoint_nvme_path().empty()) {
    in.checkpoints_on_nvme = true;
    p = zero3::plan_memory(in, cfg.zero_optimization);
    if (comm->rank() == 0)
      STRATA_LOG_INFO("zero3: the checkpointed block inputs (", format_size(p.memory.nvme_activations),
                      ") go to NVMe under ", checkpoint_nvme_path(), ", through ",
                      format_size(p.memory.pinned_activations),
                      " of pinned memory: with them in pinned memory (", format_size(pinned),
                      ") the host plan would exceed 90% of the machine's ", format_size(host_memory()),
                      too_big ? "" : " on another rank's machine");
  }
  plan = p.memory;
  note_activations(plan, sizes, choice);
  plan.device_headroom = dev->caps().reserved;
  checkpoints.plan(choice.checkpoint && choice.offload ? sizes.checkpoints : 0,
                   std::size_t(sizes.checkpoint_bytes), in.checkpoints_on_nvme ? Tier::nvme : Tier::pinned);
  // How long a sequence fits this device at this micro-batch (strata config and Python show it).
  plan.activation_bytes_per_token = plan.device_activations / std::uint64_t(std::max(1, B * planned_seq_len));
  plan.longest_seq_len = longest_sequence(
      in, cfg.zero_optimization, mcfg.max_seq_len,
      [&](std::int64_t T) { return activation_sizes(mcfg, B, int(T), *ops, opts.documents); },
      checkpointing_mode(), offload_asked(cfg.activation_checkpointing));
  lay_out_chunks(in, p);
  planned = std::move(in);
  report_ratio();
}

PlanInput Engine::Impl::measured_plan_input() {
  // Chunks, shards and sub-groups as zero3/placement.h lays them out — the computation `memprof estimate`
  // makes too.
  PlanInput in = plan_input(cfg, layout, mcfg.tie_embeddings, world, comm->rank(), act);
  agree_frozen_chunks();
  if (!opts.frozen_chunks.empty())
    freeze_chunks(in, opts.frozen_chunks, cfg.zero_optimization, "EngineOptions.frozen_chunks");
  // Under LoRA adapters the base is frozen by the model's own shape (model/lora.h): every base chunk but the
  // saved modules', packed in NF4 with an NF4 base; the adapters' working params off NVMe.
  if (const std::uint64_t pinned = plan_adapters(in, layout, cfg.zero_optimization);
      pinned > 0 && comm->rank() == 0)
    STRATA_LOG_INFO("zero3: the adapters' working params (", format_size(pinned),
                    ") stay in pinned host memory, not on NVMe as offload_param.device says: they change "
                    "every step, and the base streamed from NVMe is then read once a pass and never written");
  planned_seq_len = opts.seq_len > 0 ? opts.seq_len : int(mcfg.max_seq_len);
  in.device_state_by_ops = by_ops;
  in.tail_on_model_cpus = dev->caps().backend == BackendKind::host && !by_ops && !compute_cpus.empty();
  // The compute interface's scratch for the model's shapes and the engine's own reductions (the longest
  // shard), taken now so that the ops never grow it during a step; then what every Ops holds (Note
  // [Ops device memory] in kernels/ops.h).
  kernels::OpShapes shapes =
      model::architecture(mcfg).op_shapes(mcfg, int(cfg.train_micro_batch_size_per_gpu), planned_seq_len);
  for (const PlannedChunk& c : in.chunks)
    shapes.reduce_numel = std::max<std::size_t>(shapes.reduce_numel, c.shard.numel);
  ops->reserve_scratch(ops->scratch_bytes(shapes));
  const std::vector<std::uint64_t> ops_bytes =
      every_ranks(ops->device_bytes() + gather_ops->device_bytes() + grad_ops->device_bytes());
  in.ops = *std::max_element(ops_bytes.begin(), ops_bytes.end());
  in.device_capacity = dev->caps().capacity;
  return in;
}

std::optional<bool> Engine::Impl::checkpointing_mode() const {
  return opts.checkpoint_activations ? opts.checkpoint_activations : checkpointing_asked(cfg.strata);
}

Plan Engine::Impl::plan_with_ratio(PlanInput& in) {
  Plan p = zero3::plan_memory(in, cfg.zero_optimization);
  const auto& oo = cfg.zero_optimization.offload_optimizer;
  if (oo.ratio_auto && oo.device != OffloadDevice::none && cfg.zero_optimization.stage == 3) {
    keep_optimizer_on_device(in, choose_device_groups(in, p));
    p = zero3::plan_memory(in, cfg.zero_optimization);
  }
  return p;
}

void Engine::Impl::lay_out_chunks(const PlanInput& in, const Plan& p) {
  slots.resize(in.chunks.size());
  for (std::size_t i = 0; i < slots.size(); ++i) {
    ChunkSlot& s = slots[i];
    s.id = int(i);
    s.name = layout.chunk(int(i)).name;
    s.numel = in.chunks[i].numel;
    s.shard = in.chunks[i].shard;
    s.param_numel = in.chunks[i].param_numel;
    s.param_offset = in.chunks[i].param_offset;
    s.persistent = in.chunks[i].persistent;
    s.gather_block = p.gather_block[i];
    s.grad_block = p.grad_block[i];
    s.homes = in.homes_of(in.chunks[i]);
    s.route = p.routes[i];
    if (in.chunks[i].packed) {
      s.nf4 = std::make_shared<const model::Nf4Chunk>(
          model::nf4_chunk(layout.chunk(int(i)), working_dtype, mcfg.lora.double_quant));
      STRATA_CHECK(s.nf4->bytes == in.chunks[i].param_bytes, "zero3: chunk ", s.name, "'s NF4 bytes (",
                   s.nf4->bytes, ") differ from the plan's (", in.chunks[i].param_bytes, ")");
    }
  }
  groups = in.groups;
  largest_shard = p.largest_shard;
  persistent_bytes = p.persistent_bytes;
  persistent_chunks = p.persistent_chunks;
  group_window = p.group_window;
}

void Engine::Impl::report_ratio() const {
  if (comm->rank() != 0) return;
  const auto& oo = cfg.zero_optimization.offload_optimizer;
  if (plan.device_optimizer_groups > 0)
    STRATA_LOG_INFO(
        "zero3: offload_optimizer.ratio ", plan.offload_ratio, ": ", plan.device_optimizer_groups, " of ",
        groups.size(),
        " optimizer sub-groups keep master, states and gradients on the device, stepped there by ",
        by_ops ? "the compute interface's AdamW" : "the SIMD optimizer on the model's cpus",
        " beside the CPU optimizer");
  else if (oo.device != OffloadDevice::none && !oo.ratio_auto && oo.ratio < 1.0)
    STRATA_LOG_WARN("zero3: offload_optimizer.ratio ", oo.ratio, " keeps none of the ", groups.size(),
                    " optimizer sub-group", groups.size() == 1 ? "" : "s",
                    " on the device (DeepSpeed's rule: the first (1 - ratio) x sub-groups, rounded down); "
                    "lower zero_optimization.sub_group_size (now ",
                    cfg.zero_optimization.sub_group_size, " elements) to split the optimizer into more");
}

// Note [Cores]: a rank runs on the cpus the process may use (mpirun's or strata launch's binding, taskset,
// a cgroup), narrowed on cuda to those of the GPU's NUMA node when it has any. strata.cpu_optim.cores = k
// keeps the last k for the CPU optimizer — its threads are pinned there — and, on the host backend, the
// model's ops compute in an arena pinned to the others. The host backend's copies (the gather and gradient
// streams' threads and their casts and adds) are CPU work too: they run on the optimizer's cpus, which are
// idle while the model computes forward and share backward with the early updates — as a GPU's copy
// engines are not its SMs. On cuda the stream threads only enqueue, and stay unpinned, as do the NVMe
// completion threads. k = 0 shares every cpu (the optimizer pinned round-robin over all of them when
// pin_threads).
void Engine::Impl::plan_cores() {
  std::vector<int> rank = allowed_cpus();
  if (dev->caps().backend != BackendKind::host && dev->caps().numa_node >= 0) {
    const std::vector<int> near = Topology::get().cpus_of_numa(dev->caps().numa_node);
    std::vector<int> both;
    std::set_intersection(rank.begin(), rank.end(), near.begin(), near.end(), std::back_inserter(both));
    if (!both.empty()) rank = std::move(both);
  }
  const std::int64_t k = cfg.strata.cpu_optim.cores;
  if (k == 0) {
    optimizer_cpus = rank;
    return;
  }
  if (k >= std::int64_t(rank.size())) {
    std::string list;
    for (int c : rank) list += cat(list.empty() ? "" : ",", c);
    throw ConfigError(cat("strata.cpu_optim.cores: ", k, " but this rank runs on ", rank.size(), " cpu",
                          rank.size() == 1 ? "" : "s", " (", list,
                          "); leave at least one for the model and the copies (at most ", rank.size() - 1,
                          "), or 0 to share them all"));
  }
  const auto split = rank.end() - std::ptrdiff_t(k);
  optimizer_cpus.assign(split, rank.end());
  if (dev->caps().backend == BackendKind::host) compute_cpus.assign(rank.begin(), split);
  if (comm->rank() == 0)
    STRATA_LOG_INFO("zero3: the CPU optimizer runs on cpu", k == 1 ? " " : "s ", optimizer_cpus.front(),
                    k == 1 ? std::string() : cat("-", optimizer_cpus.back()),
                    compute_cpus.empty() ? std::string()
                                         : cat(", the model's ops on ", compute_cpus.size(), " other cpu",
                                               compute_cpus.size() == 1 ? "" : "s"));
}

// Note [Ranks agree]
// The plan decides which collectives a rank calls: whether a chunk stays in the cache or is all-gathered
// again, which sub-groups the device optimizer steps (and so which ranks add device gradient statistics),
// whether activations are checkpointed. Two ranks with different plans call different collectives, and a
// collective of equal block sizes does not hang: it silently mixes two blocks. So no plan input is a rank's
// own measurement: the device capacity (on cuda each rank's free memory at open) is the least over ranks,
// the compute interface's device bytes the largest, a measured choice (offload_optimizer.ratio "auto") is
// rank 0's, broadcast. The inputs that differ by design — each rank's shard — come from the layout, which
// every rank computes alike.
// Frozen chunks decide which gradients are reduced and which params all-gathered after a step: ranks
// that froze different chunks would issue different collectives. A fingerprint of the sorted set (FNV-1a
// over the ids), compared over every rank, refuses that by name before any state exists. Every rank calls
// the collective, frozen chunks or not.
void Engine::Impl::agree_frozen_chunks() {
  std::vector<int> ids = opts.frozen_chunks;
  for (int c : layout.frozen_chunks()) ids.push_back(c);  // the adapters' base, and the layout's size with it
  ids.push_back(-layout.num_chunks());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  std::uint64_t h = 1469598103934665603ull;
  for (int c : ids) h = (h ^ std::uint64_t(std::uint32_t(c))) * 1099511628211ull;
  const std::vector<std::uint64_t> all = every_ranks(h);
  for (std::size_t r = 0; r < all.size(); ++r)
    if (all[r] != all[0])
      throw ConfigError(
          cat("EngineOptions.frozen_chunks differs between ranks (rank ", r,
              " froze other chunks than rank 0, or adapts other layers); give every rank the same "
              "chunks to freeze and the same strata.lora"));
}

void Engine::Impl::agree_capacity() {
  const std::uint64_t mine = dev->caps().capacity;
  const std::vector<std::uint64_t> all = every_ranks(mine);
  const auto [least_at, most_at] = std::minmax_element(all.begin(), all.end());
  const std::uint64_t least = *least_at, most = *most_at;
  if (least == most) return;
  if (least < mine) dev->limit_capacity(least);
  if (comm->rank() == 0)
    STRATA_LOG_INFO("zero3: the ranks' device capacities differ (", format_size(least), " to ",
                    format_size(most), "); every rank plans with ", format_size(least),
                    ", so that all make the same plan");
}

std::vector<std::uint64_t> Engine::Impl::every_ranks(std::uint64_t mine) {
  std::vector<std::uint64_t> all(std::size_t(world), mine);
  if (world > 1) comm->host_all_gather(&mine, all.data(), sizeof mine);
  return all;
}

void Engine::Impl::share_host() {
  ranks_here = 1;
  host_need_here = host_need();
  if (world == 1) return;
  struct Entry {
    char host[64];
    std::uint64_t need;
  };
  Entry mine{};
  if (::gethostname(mine.host, sizeof mine.host - 1) != 0) std::strcpy(mine.host, "?");
  mine.need = host_need_here;
  std::vector<Entry> all(static_cast<std::size_t>(world));
  comm->host_all_gather(&mine, all.data(), sizeof mine);
  ranks_here = 0;
  host_need_here = 0;
  for (const Entry& e : all)
    if (std::strncmp(e.host, mine.host, sizeof mine.host) == 0) ++ranks_here, host_need_here += e.need;
}

void Engine::Impl::warm_up_communicators() {
  DeviceBuffer b(*dev, 2 * std::size_t(world) * sizeof(float), "communicator warm-up");
  float* p = static_cast<float*>(b.data());
  compute_stream->memset_async(p, 0, b.size());
  compute_stream->synchronize();
  gather_comm->all_gather(p + comm->rank(), p, 1, DType::fp32, gather_stream.get());
  grad_comm->reduce_scatter(p, p + comm->rank(), 1, DType::fp32, comm::ReduceOp::sum, grad_stream.get());
  gather_stream->synchronize();
  grad_stream->synchronize();
}

std::string Engine::Impl::checkpoint_nvme_path() const {
  const auto& z = cfg.zero_optimization;
  for (const std::vector<std::string>* p : {&z.offload_optimizer.nvme_paths, &z.offload_param.nvme_paths})
    if (!p->empty()) return p->front();
  return {};
}

bool Engine::Impl::plan_pinned_too_big(const MemoryPlan& m) const {
  return m.activation_offload && host_need(m) > host_memory() / 10 * 9;
}

std::uint64_t Engine::Impl::host_need(const MemoryPlan& m) const {
  return zero3::host_need(m, dev->caps().backend == BackendKind::host, dev->caps().capacity);
}

void Engine::Impl::check_fits() const {
  const auto& z = cfg.zero_optimization;
  // Configuration limits first: they fail whatever the machine.
  std::uint64_t largest = 0;
  std::string largest_name;
  for (const ChunkSlot& s : slots)
    if (s.shard.numel > largest) largest = s.shard.numel, largest_name = s.name;
  if (homes.param == Tier::nvme) {
    if (z.offload_param.buffer_count < 1)
      throw ConfigError(cat("zero_optimization.offload_param.buffer_count: ", z.offload_param.buffer_count,
                            "; NVMe parameter reads need at least 1 buffer"));
    // DeepSpeed reads one parameter tensor per buffer, so its default (1e8 elements) fits any tensor of
    // most models; Strata reads a whole chunk (a transformer block) per buffer, which can be larger. The
    // user's config stays valid: the buffers are sized to the largest chunk, and the plan counts them so.
    if (z.offload_param.buffer_size < largest && comm->rank() == 0)
      STRATA_LOG_WARN("zero3: zero_optimization.offload_param.buffer_size (", z.offload_param.buffer_size,
                      " elements) is smaller than chunk '", largest_name, "' (", largest,
                      " elements); Strata reads whole chunks from NVMe, so each of the ",
                      z.offload_param.buffer_count, " read buffers holds ", largest,
                      " elements (docs/train.md, \"Where the state lives\")");
  }
  const int swapped = 1 + rule.states() + (homes.grad == Tier::nvme ? 1 : 0);
  if (homes.master == Tier::nvme && z.offload_optimizer.buffer_count < swapped)
    throw ConfigError(cat(
        "zero_optimization.offload_optimizer.buffer_count: ", z.offload_optimizer.buffer_count,
        " is fewer than the ", swapped,
        " tensors per parameter the optimizer swaps "
        "(fp32 master, ",
        rule.states(), " state", rule.states() > 1 ? "s" : "",
        homes.grad == Tier::nvme ? " and the gradients" : "", "); raise it to at least ", swapped, " (",
        2 * swapped, " lets the reads of one sub-group overlap the update of another)",
        homes.grad == Tier::nvme ? ", or set strata.nvme_gradients to false (gradients in pinned host memory)"
                                 : ""));

  const DeviceCaps& caps = dev->caps();
  const std::uint64_t need = plan.device_need();
  if (need > caps.capacity) {
    std::string todo;
    if (!checkpoint_activations)
      todo += cat("checkpoint activations (strata.checkpoint_activations true or \"auto\": ",
                  format_size(plan.device_activations_checkpointed), " of activations instead of ",
                  format_size(plan.device_activations_all), "), ");
    else if (!plan.activation_offload)
      todo +=
          cat("keep the block inputs in host memory (activation_checkpointing.cpu_checkpointing true or "
              "\"auto\": ",
              format_size(plan.device_activations_other_offload), " of activations instead of ",
              format_size(plan.device_activations), "), ");
    if (plan.device_optimizer_groups > 0)
      todo += cat("raise zero_optimization.offload_optimizer.ratio (", plan.offload_ratio, " keeps ",
                  plan.device_optimizer_groups, " of ", plan.optimizer_groups,
                  " optimizer sub-groups' master, states and gradients on the device), ");
    else if (plan.device_state > 0)
      todo +=
          "set zero_optimization.offload_optimizer.device and offload_param.device to \"cpu\" or \"nvme\" "
          "(configs/zero3_cpu.json, configs/zero3_nvme.json), ";
    throw OutOfMemory(cat(
        "the model does not fit the device: ", mcfg.name, " (", mcfg.num_parameters(), " parameters) needs ",
        format_size(need), " on the device — ", format_size(plan.device_state),
        " of state (offload_param.device = ", offload_name(z.offload_param.device),
        ", offload_optimizer.device = ", offload_name(z.offload_optimizer.device), ") and a working set of ",
        format_size(plan.device_working_set), " (the largest chunk gathered in ", dtype_name(act),
        " with its fp32 gradient buffer), ", format_size(plan.device_activations),
        " of activations for a micro-batch of ", cfg.train_micro_batch_size_per_gpu, " x ", planned_seq_len,
        " tokens and ", format_size(plan.device_ops),
        " of the compute interface's workspace and scratch — and the device has ", format_size(caps.capacity),
        " (", caps.name, "). To fit, ", todo,
        "lower train_micro_batch_size_per_gpu or the sequence length (--seq-len), "
        "or raise strata.device_memory_cap (--device-memory-cap) to at least ",
        need, " bytes (docs/train.md, \"Device memory\")"));
  }
  // On the host backend the device is host memory too.
  const std::uint64_t ram = host_memory();
  const std::uint64_t host = host_need_here;
  if (ram && host > ram / 10 * 9) {
    // What the buffers are made of, each with the setting that sizes it; the advice names the largest.
    struct Part {
      std::uint64_t bytes;
      std::string what, advice;
    };
    const std::vector<Part> parts = {
        {plan.pinned_state, "state in pinned host memory",
         "set zero_optimization.offload_optimizer.device (and offload_param.device) to \"nvme\""},
        {plan.pinned_reads,
         cat("parameter read buffers (offload_param.buffer_count ", z.offload_param.buffer_count,
             " x the largest chunk)"),
         "lower zero_optimization.offload_param.buffer_count"},
        {plan.pinned_cache,
         cat("parameter cache (offload_param.max_in_cpu ", z.offload_param.max_in_cpu, ")"),
         "lower zero_optimization.offload_param.max_in_cpu"},
        {plan.pinned_optimizer,
         cat("optimizer sub-group window (offload_optimizer.buffer_count ", z.offload_optimizer.buffer_count,
             " tensors of the largest sub-group, sub_group_size ", z.sub_group_size, ")"),
         "lower zero_optimization.sub_group_size (or offload_optimizer.buffer_count)"},
        {plan.pinned_grad_window, "gradient window (shards of the largest chunk on their way to NVMe)",
         "train on more ranks (each holds 1/N of a chunk's gradients)"},
        {plan.pinned_activations,
         cat("checkpointed block inputs (activation_checkpointing.cpu_checkpointing, a micro-batch of ",
             cfg.train_micro_batch_size_per_gpu, " x ", planned_seq_len, " tokens)"),
         "name a zero_optimization.offload_optimizer.nvme_path (the block inputs then go on to NVMe), set "
         "activation_checkpointing.cpu_checkpointing to false, or lower the micro-batch or the sequence "
         "length"}};
    std::string made_of;
    const Part* largest = &parts.front();
    for (const Part& p : parts) {
      if (p.bytes == 0) continue;
      made_of += cat(made_of.empty() ? "" : ", ", format_size(p.bytes), " of ", p.what);
      if (p.bytes > largest->bytes) largest = &p;
    }
    throw OutOfMemory(cat(
        "the model does not fit host memory: ", made_of,
        plan.buffers_only ? " (the gradient and optimizer windows share one room: the larger counts)" : "",
        caps.backend == BackendKind::host ? ", and the host device," : "", " need ", format_size(host_need()),
        ranks_here > 1
            ? cat(" per rank, ", format_size(host), " for the ", ranks_here, " ranks on this machine")
            : std::string(),
        "; this machine has ", format_size(ram),
        " (offload_param.device = ", offload_name(z.offload_param.device),
        ", offload_optimizer.device = ", offload_name(z.offload_optimizer.device), "). The largest is the ",
        largest->what, ": ", largest->advice, " (docs/train.md, \"Where the state lives\")"));
  }
}

void Engine::Impl::choose_overlap() {
  planned.overlap_auto_here = dev->caps().backend != BackendKind::host || cfg.strata.cpu_optim.cores > 0;
  if (!overlap_asked(planned)) return;
  const std::uint64_t room = overlap_room();  // a collective: every rank asks alike
  std::vector<UpdateRoute> routes(slots.size());
  for (std::size_t i = 0; i < slots.size(); ++i) routes[i] = slots[i].route;
  const OverlapDecision d = zero3::plan_overlap(routes, plan, planned, room, [&](int c) {
    return overlap_copy_bytes(planned, slots[std::size_t(c)].shard.numel);
  });
  if (d.chunks == 0) {
    if (comm->rank() == 0 &&
        (!d.ratio_keeps_all || cfg.strata.overlap_optimizer == StrataConfig::Overlap::on))
      STRATA_LOG_WARN("zero3: strata.overlap_optimizer is true but ", d.why_not);
    return;
  }
  for (std::size_t i = 0; i < slots.size(); ++i) slots[i].route = routes[i];
}

}  // namespace strata::zero3
