// The engine's construction: the memory plan and the up-front checks, the device, NVMe store and tier
// manager, and the registration and initialisation of every chunk. Also the thin public wrappers.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <limits>
#include <thread>

#include "comm/devices.h"
#include "core/log.h"
#include "core/topology.h"
#include "cpu_optim/cpu_optim.h"
#include "kernels/cpu/ops.h"
#include "zero3/engine_impl.h"

namespace strata::zero3 {

int configure_threads(Config& cfg, int local_ranks) {
  if (cfg.strata.threads == 0 && local_ranks > 1)
    cfg.strata.threads =
        std::max<std::int64_t>(1, std::int64_t(std::thread::hardware_concurrency()) / local_ranks);
  const int threads = cfg.strata.threads > 0 ? int(cfg.strata.threads)
                                             : int(std::max(1u, std::thread::hardware_concurrency()));
  kernels::cpu::set_blas_threads(threads);
  return threads;
}
std::uint64_t physical_memory() {
  long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? std::uint64_t(pages) * std::uint64_t(page) : 0;
}

namespace {

using detail::cat;

DeviceOptions device_options(const Config& cfg, const EngineOptions& opts) {
  DeviceOptions d;
  if (!opts.backend.empty()) {
    d.backend = opts.backend;
  } else {
    d.backend = cfg.strata.backend == StrataConfig::Backend::host   ? "host"
                : cfg.strata.backend == StrataConfig::Backend::cuda ? "cuda"
                                                                    : "auto";
  }
  // Each rank on a machine takes its own GPU: strata.device + the local rank, or the local rank's entry
  // of STRATA_LOCAL_DEVICES, which `strata launch` sets (Note [STRATA_LOCAL_DEVICES] in comm/devices.h).
  d.ordinal = comm::local_device_ordinal(int(cfg.strata.device), comm::rank_from_env().local_rank);
  d.memory_cap = opts.device_memory_cap ? opts.device_memory_cap : cfg.strata.device_memory_cap;
  d.check_thread_device = opts.check_thread_device;
  return d;
}

nvme::AioOptions aio_options(const Config& cfg) {
  nvme::AioOptions a;
  switch (cfg.strata.aio.backend) {
    case StrataConfig::AioBackend::automatic:
      a.backend = nvme::Backend::auto_select;
      break;
    case StrataConfig::AioBackend::io_uring:
      a.backend = nvme::Backend::io_uring;
      break;
    case StrataConfig::AioBackend::libaio:
      a.backend = nvme::Backend::libaio;
      break;
    case StrataConfig::AioBackend::psync:
      a.backend = nvme::Backend::psync;
      break;
  }
  a.block_size = std::size_t(cfg.aio.block_size);
  a.queue_depth = int(cfg.aio.queue_depth);
  a.intra_op_parallelism = int(cfg.aio.intra_op_parallelism);
  a.single_submit = cfg.aio.single_submit;
  a.overlap_events = cfg.aio.overlap_events;
  return a;
}

}  // namespace

EngineState::EngineState(const Config& c, const model::ModelConfig& m, const EngineOptions& o)
    : cfg(c),
      mcfg(m),
      // One rank: chunks padded to 64 elements. N ranks: each shard a whole number of the gradient norm's
      // blocks, so the norm sums the same partials in the same order at any world size (Note [Ranks]).
      layout((m.validate("model"), m), {.tensor_align = 16, .chunk_multiple = chunk_multiple(c.world_size)}),
      opts(o),
      scaler(c.fp16),
      sched(c.scheduler, c.optimizer.lr) {}

Engine::Impl::Impl(const Config& c, const model::ModelConfig& m, const EngineOptions& o)
    : EngineState(c, m, o) {
  dev = open_device(device_options(cfg, opts));
  if (opts.communicator) {
    comm = opts.communicator;
  } else {
    owned_comm = comm::make_communicator(*dev);
    comm = owned_comm.get();
  }
  world = comm->world_size();
  replicated = world > 1 && cfg.zero_optimization.stage < 3;
  // (offload_param and NVMe offload need stage 3: the config refuses them below it, as DeepSpeed does.)
  if (world != cfg.world_size)
    throw ConfigError(cat("the config was resolved for world_size ", cfg.world_size, " but ", world,
                          " ranks are training (", comm->name(),
                          "); load the config with the launcher's world size (train_batch_size = "
                          "train_micro_batch_size_per_gpu x gradient_accumulation_steps x ranks)"));
  wd = cfg.bf16.enabled ? DType::bf16 : cfg.fp16.enabled ? DType::fp16 : DType::fp32;
  const auto& z = cfg.zero_optimization;
  homes = shard_homes(cfg);
  n_states = cfg.optimizer.type == OptimizerType::Adam || cfg.optimizer.type == OptimizerType::AdamW ? 2 : 1;
  by_ops = !dev->caps().host_addressable || opts.device_state_by_ops;
  // The device optimizer is the compute interface's AdamW; the others run on the CPU only.
  const bool partial = partial_offload(z);
  if (by_ops && n_states != 2 && (homes.master == Tier::device || partial))
    throw ConfigError(
        cat("optimizer.type ", cfg.optimizer.type == OptimizerType::Lion ? "Lion" : "Adagrad",
            homes.master == Tier::device ? " with offload_optimizer.device = none"
                                         : " with offload_optimizer.ratio below 1",
            " needs an optimizer on the device, and the ", to_string(dev->caps().backend), " backend (",
            dev->caps().name, ") has only Adam and AdamW there: use optimizer.type AdamW, or ",
            homes.master == Tier::device ? "set zero_optimization.offload_optimizer.device to \"cpu\""
                                         : "set zero_optimization.offload_optimizer.ratio to 1",
            " (the CPU optimizers have all four)"));
  // Note [Device memory outside the pool]: everything that takes device memory of its own — the
  // communicators (NCCL's buffers), the streams, the compute interface (the matrix products' workspace,
  // the attention library's handle, the ops' scratch) — exists before the plan reads the device's
  // capacity, so the plan counts what was taken through the Device (MemoryPlan.device_ops) and the
  // capacity excludes what the libraries took beside it (MemoryPlan.device_headroom).
  compute_stream = dev->create_stream("zero3-compute");
  gather_stream = dev->create_stream("zero3-gather");
  grad_stream = dev->create_stream("zero3-grads");
  if (world > 1) {  // collective: every rank dups in this order
    gather_comm = comm->dup();
    grad_comm = comm->dup();
  }
  // bf16 training has bf16 activations on every backend (cuda always does; the CPU ops with matmul bf16:
  // kernels/cpu/ops.h, "bf16 activations"), the products taking bf16 operands with fp32 accumulation.
  // fp16 and fp32 training compute in fp32 on the CPU.
  plan_cores();
  ops = kernels::make_ops(*dev, *compute_stream,
                          {.matmul = cfg.bf16.enabled ? DType::bf16 : DType::fp32,
                           .cpus = compute_cpus,
                           .workspace_bytes = opts.ops_workspace_bytes,
                           .deterministic_attention = cfg.strata.deterministic_attention});
  act = ops->caps().activation;
  // Note [Cores]: on the host backend with cores of the optimizer's own, the copies run there too.
  const std::vector<int> copy_cpus =
      dev->caps().backend == BackendKind::host && !compute_cpus.empty() && cfg.strata.cpu_optim.pin_threads
          ? optimizer_cpus
          : std::vector<int>{};
  gather_ops =
      kernels::make_ops(*dev, *gather_stream, {.cpus = copy_cpus, .role = kernels::OpsRole::runtime});
  grad_ops = kernels::make_ops(*dev, *grad_stream, {.cpus = copy_cpus, .role = kernels::OpsRole::runtime});
  // NCCL connects its communicators lazily, at their first collective, taking device buffers then: one
  // small collective on each before the capacity is read (a few bytes, all ranks in the same order).
  if (world > 1) warm_up_communicators();
  dev->measure_capacity();
  agree_capacity();
  // Note [Cores]: with strata.cpu_optim.cores the optimizer has that many threads on its own cpus.
  opt = std::make_unique<cpu_optim::Optimizer>(cpu_optim::Options{
      .simd = cfg.strata.cpu_optim.simd,
      .threads = cfg.strata.cpu_optim.cores > 0 ? int(cfg.strata.cpu_optim.cores) : int(cfg.strata.threads),
      .pin = cfg.strata.cpu_optim.pin_threads,
      .cpus = optimizer_cpus});
  plan_memory();
  share_host();
  check_fits();
  open_tiers();

  cache.open();
  if (!copy_cpus.empty())
    for (Stream* st : {gather_stream.get(), grad_stream.get()})
      st->host_fn([copy_cpus] {  // the stream's one thread, from its first piece of work on
        try {
          pin_current_thread(copy_cpus);
        } catch (const Error& e) {
          STRATA_WARN_ONCE("zero3: cannot pin the copy streams to the optimizer's cpus (", e.what(),
                           "); they run unpinned");
        }
      });
  init_chunks();
  grads.open();
  updater.open();
  overlap.plan([this] { return overlap_room(); });
}

// Half of what the plans of the ranks on this machine leave of check_fits' 90% of RAM, shared evenly between
// those ranks (the other half stays free: with all of it, 13 of the 720m-byte model's 16 chunks overlapped
// on this 23 GiB machine and backward slowed under the memory pressure as much as the step gained). The
// least over ranks (Note [Ranks agree]): every rank overlaps the same chunks.
std::uint64_t Engine::Impl::overlap_room() {
  const std::uint64_t ram = physical_memory();
  const std::uint64_t host = host_need_here;
  const std::vector<std::uint64_t> rooms = every_ranks(
      ram == 0 ? std::numeric_limits<std::uint64_t>::max()
               : (ram / 10 * 9 > host ? (ram / 10 * 9 - host) / 2 / std::uint64_t(ranks_here) : 0));
  return *std::min_element(rooms.begin(), rooms.end());
}

Engine::Impl::~Impl() {
  overlap.stop();
  try {
    if (compute_stream) compute_stream->synchronize();
    if (grad_stream) grad_stream->synchronize();
    if (gather_stream) gather_stream->synchronize();
  } catch (const std::exception& e) {
    STRATA_LOG_WARN("zero3: a transfer failed while shutting down: ", e.what());
  }
  if (trace) {
    try {
      trace->close();
    } catch (const std::exception& e) {
      STRATA_LOG_WARN("zero3: memprof trace: ", e.what());
    }
  }
}

void Engine::Impl::plan_memory() {
  // Chunks, shards and sub-groups as zero3/placement.h lays them out — the computation `memprof estimate`
  // makes too.
  PlanInput in = plan_input(cfg, layout, mcfg.tie_embeddings, world, comm->rank(), act);
  planned_seq_len = opts.seq_len > 0 ? opts.seq_len : int(mcfg.max_seq_len);
  in.device_state_by_ops = by_ops;
  in.tail_on_model_cpus = dev->caps().backend == BackendKind::host && !by_ops && !compute_cpus.empty();
  // The compute interface's scratch for the model's shapes and the engine's own reductions (the longest
  // shard), taken now so that the ops never grow it during a step; then what every Ops holds (Note
  // [Ops device memory] in kernels/ops.h).
  kernels::OpShapes shapes = model::op_shapes(mcfg, int(cfg.train_micro_batch_size_per_gpu), planned_seq_len);
  for (const PlannedChunk& c : in.chunks)
    shapes.reduce_numel = std::max<std::size_t>(shapes.reduce_numel, c.shard.numel);
  ops->reserve_scratch(ops->scratch_bytes(shapes));
  const std::vector<std::uint64_t> ops_bytes =
      every_ranks(ops->device_bytes() + gather_ops->device_bytes() + grad_ops->device_bytes());
  in.ops = *std::max_element(ops_bytes.begin(), ops_bytes.end());
  in.device_capacity = dev->caps().capacity;
  const auto activations = [&](bool ckpt) {
    return model::activation_bytes(mcfg, int(cfg.train_micro_batch_size_per_gpu), planned_seq_len, ckpt,
                                   *ops);
  };
  const std::uint64_t with_ckpt = activations(true), without = activations(false);
  // Note [Checkpointing by choice]: an explicit choice (EngineOptions, or strata.checkpoint_activations
  // true / false) stands, and a plan that does not fit then fails as any other. "auto" keeps every
  // activation when the plan without checkpointing fits the device (recomputing costs about a third of a
  // step), and checkpoints otherwise.
  using CK = StrataConfig::Checkpointing;
  if (opts.checkpoint_activations) {
    ckpt = *opts.checkpoint_activations;
  } else if (cfg.strata.checkpoint_activations != CK::automatic) {
    ckpt = cfg.strata.checkpoint_activations == CK::on;
  } else {
    in.activations = without;
    ckpt = zero3::plan_memory(in, cfg.zero_optimization).memory.device_need() > in.device_capacity;
  }
  in.activations = ckpt ? with_ckpt : without;
  Plan p = zero3::plan_memory(in, cfg.zero_optimization);
  const auto& oo = cfg.zero_optimization.offload_optimizer;
  if (oo.ratio_auto && oo.device != OffloadDevice::none && cfg.zero_optimization.stage == 3) {
    keep_optimizer_on_device(in, choose_device_groups(in, p));
    p = zero3::plan_memory(in, cfg.zero_optimization);
  }
  plan = p.memory;
  plan.checkpoint_activations = ckpt;
  plan.device_headroom = dev->caps().reserved;
  plan.device_activations_checkpointed = with_ckpt;
  plan.device_activations_all = without;
  slots.resize(in.chunks.size());
  for (std::size_t i = 0; i < slots.size(); ++i) {
    ChunkSlot& s = slots[i];
    s.id = int(i);
    s.name = layout.chunk(int(i)).name;
    s.numel = in.chunks[i].numel;
    s.shard = in.chunks[i].shard;
    s.persistent = in.chunks[i].persistent;
    s.gather_block = p.gather_block[i];
    s.grad_block = p.grad_block[i];
    s.h = in.homes_of(in.chunks[i]);
    s.route = p.routes[i];
  }
  groups = in.groups;
  planned = std::move(in);
  if (plan.device_optimizer_groups > 0 && comm->rank() == 0)
    STRATA_LOG_INFO(
        "zero3: offload_optimizer.ratio ", plan.offload_ratio, ": ", plan.device_optimizer_groups, " of ",
        groups.size(),
        " optimizer sub-groups keep master, states and gradients on the device, stepped there by ",
        by_ops ? "the compute interface's AdamW" : "the SIMD optimizer on the model's cpus",
        " beside the CPU optimizer");
  else if (oo.device != OffloadDevice::none && !oo.ratio_auto && oo.ratio < 1.0 && comm->rank() == 0)
    STRATA_LOG_WARN("zero3: offload_optimizer.ratio ", oo.ratio, " keeps none of the ", groups.size(),
                    " optimizer sub-group", groups.size() == 1 ? "" : "s",
                    " on the device (DeepSpeed's rule: the first (1 - ratio) x sub-groups, rounded down); "
                    "lower zero_optimization.sub_group_size (now ",
                    cfg.zero_optimization.sub_group_size, " elements) to split the optimizer into more");
  largest_shard = p.largest_shard;
  persistent_bytes = p.persistent_bytes;
  persistent_chunks = p.persistent_chunks;
  group_window = p.group_window;
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

std::uint64_t Engine::Impl::host_need() const {
  const DeviceCaps& caps = dev->caps();
  return plan.pinned_state + plan.pinned_staging +
         (caps.backend == BackendKind::host ? std::min(caps.capacity, plan.device_need()) : 0);
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
  const int swapped = 1 + n_states + (homes.grad == Tier::nvme ? 1 : 0);
  if (homes.master == Tier::nvme && z.offload_optimizer.buffer_count < swapped)
    throw ConfigError(cat(
        "zero_optimization.offload_optimizer.buffer_count: ", z.offload_optimizer.buffer_count,
        " is fewer than the ", swapped,
        " tensors per parameter the optimizer swaps "
        "(fp32 master, ",
        n_states, " state", n_states > 1 ? "s" : "", homes.grad == Tier::nvme ? " and the gradients" : "",
        "); raise it to at least ", swapped, " (", 2 * swapped,
        " lets the reads of one sub-group overlap the update of another)",
        homes.grad == Tier::nvme ? ", or set strata.nvme_gradients to false (gradients in pinned host memory)"
                                 : ""));

  const DeviceCaps& caps = dev->caps();
  const std::uint64_t need = plan.device_need();
  if (need > caps.capacity) {
    std::string todo;
    if (!ckpt)
      todo += cat("checkpoint activations (strata.checkpoint_activations true or \"auto\": ",
                  format_size(plan.device_activations_checkpointed), " of activations instead of ",
                  format_size(plan.device_activations_all), "), ");
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
  const std::uint64_t ram = physical_memory();
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
         "train on more ranks (each holds 1/N of a chunk's gradients)"}};
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

void Engine::Impl::open_tiers() {
  const auto& z = cfg.zero_optimization;
  if (plan.nvme_state > 0) {
    // One store for both: its swap files striped over every directory listed (one per drive).
    const std::vector<std::string>& paths = z.offload_optimizer.device == OffloadDevice::nvme
                                                ? z.offload_optimizer.nvme_paths
                                                : z.offload_param.nvme_paths;
    if (z.offload_optimizer.device == OffloadDevice::nvme && z.offload_param.device == OffloadDevice::nvme &&
        z.offload_param.nvme_paths != z.offload_optimizer.nvme_paths)
      STRATA_WARN_ONCE("offload_param.nvme_path (", strata::detail::join(z.offload_param.nvme_paths),
                       ") differs from offload_optimizer.nvme_path (",
                       strata::detail::join(z.offload_optimizer.nvme_paths),
                       "); both parameters and optimizer states are swapped under the latter");
    aio = std::make_unique<nvme::AioEngine>(aio_options(cfg));
    nvme::SwapOptions so;
    so.nvme_path = paths.front();
    so.stripe_paths.assign(paths.begin() + 1, paths.end());
    so.capacity = plan.nvme_budget;
    // What the bytes are, so that the free-space refusal shows which setting moves them.
    std::string what;
    if (plan.nvme_params > 0)
      what =
          cat(format_size(plan.nvme_params), " of ", dtype_name(wd), " working parameters (offload_param)");
    if (plan.nvme_state > plan.nvme_params)
      what += cat(
          what.empty() ? "" : " and ", format_size(plan.nvme_state - plan.nvme_params),
          " of fp32 master weights, ", n_states, " optimizer state", n_states > 1 ? "s" : "",
          homes.grad == Tier::nvme ? " and gradients" : "", " (offload_optimizer, ",
          4 * (1 + n_states + (homes.grad == Tier::nvme ? 1 : 0)), " bytes a parameter",
          homes.grad == Tier::nvme ? "; strata.nvme_gradients false keeps the gradients in host memory" : "",
          ")");
    so.capacity_why =
        cat(what, world > 1 ? cat(" for this rank's shard (rank ", comm->rank(), " of ", world, ")") : "",
            ", plus ", format_size(plan.nvme_budget - plan.nvme_state),
            " of room for extent alignment and reuse (1/16 of that + 64 MiB)");
    // Each rank its own swap file: ranks on one machine may share nvme_path.
    so.name = world > 1 ? cat("zero3-rank", comm->rank()) : std::string("zero3");
    swap = std::make_unique<nvme::SwapStore>(*aio, so);
  }
  tiering::TierOptions to;
  to.pinned_budget = plan.pinned_budget;
  // The model allocates its activations, and the compute interface its workspace and scratch, from the
  // device beside the pool: the pool gets the rest.
  to.device_budget = dev->caps().capacity - plan.device_activations - plan.device_ops;
  tm = std::make_unique<tiering::TierManager>(*dev, to, swap.get());
  if (!cfg.strata.memprof.path.empty())
    trace = std::make_unique<tiering::TraceWriter>(
        *tm, tiering::TraceOptions{.path = cfg.strata.memprof.path,
                                   .sample_interval_ms = cfg.strata.memprof.sample_interval_ms,
                                   .config = cfg.to_json()});
}

tiering::Move Engine::Impl::put(tiering::TensorId id, Tier home, const void* src, std::size_t bytes) {
  if (home == Tier::nvme) {
    void* p = tm->allocate(id, Tier::pinned);
    std::memcpy(p, src, bytes);
    tm->mark_written(id, Tier::pinned);
    return tm->evict(id, Tier::pinned, Tier::nvme);
  }
  void* p = tm->allocate(id, home);
  if (home == Tier::device && by_ops)
    to_device(p, src, bytes);
  else
    std::memcpy(p, src, bytes);
  tm->mark_written(id, home);
  return {};
}

void EngineState::to_device(void* dst, const void* src, std::size_t bytes) {
  compute_stream->copy_async(dst, src, bytes, CopyKind::host_to_device);
  compute_stream->synchronize();
}

void EngineState::from_device(void* dst, const void* src, std::size_t bytes) {
  compute_stream->copy_async(dst, src, bytes, CopyKind::device_to_host);
  compute_stream->synchronize();
}

void Engine::Impl::init_chunks() {
  namespace kc = kernels::cpu;
  const std::uint64_t seed = std::uint64_t(cfg.strata.seed);
  std::vector<float> full, zeros;
  std::vector<std::uint16_t> half;
  std::vector<tiering::Move> writes;
  for (ChunkSlot& s : slots) {
    const std::size_t n = s.shard.numel;
    s.t = tm->register_shard({.prefix = s.name,
                              .chunk = s.id,
                              .shard = comm->rank(),
                              .numel = n,
                              .working = wd,
                              .param_numel = param_numel(s),
                              .homes = s.h});
    full.assign(s.numel, 0.0f);
    if (opts.init_params)
      opts.init_params(layout.chunk(s.id), full.data());
    else
      model::init_chunk(layout, s.id, seed, full.data());
    const float* mine = full.data() + s.shard.offset;
    writes.push_back(put(s.t.master, s.h.master, mine, n * 4));
    // The working params: this rank's shard, or the whole chunk when replicated (stages 1 and 2).
    const float* params = replicated ? full.data() : mine;
    const std::size_t pn = param_numel(s);
    if (wd == DType::fp32) {
      writes.push_back(put(s.t.param, homes.param, params, pn * 4));
    } else {
      half.resize(pn);
      if (wd == DType::bf16)
        kc::cast_f32_to_bf16(half.data(), params, pn);
      else
        kc::cast_f32_to_f16(half.data(), params, pn);
      writes.push_back(put(s.t.param, homes.param, half.data(), pn * 2));
    }
    zeros.assign(n, 0.0f);
    for (tiering::TensorId st : optimizer_tensors(s))
      if (st != s.t.master) writes.push_back(put(st, s.h.optim, zeros.data(), n * 4));
    if (s.h.grad != Tier::nvme) tm->allocate(s.t.grad, s.h.grad);  // NVMe: written by the first hand-off
    // Tensors at home on the device or in pinned memory stay there (their addresses are used directly);
    // NVMe-resident ones come and go through pinned memory.
    for (tiering::TensorId id : {s.t.param, s.t.grad, s.t.master, s.t.exp_avg, s.t.exp_avg_sq}) {
      const tiering::TensorInfo info = tm->info(id);
      if (info.desc.home != Tier::nvme && info.allocated) tm->pin(id);
    }
    if (homes.param != Tier::nvme) s.param_home = tm->data(s.t.param, homes.param);
    if (s.h.grad != Tier::nvme) s.grad = static_cast<float*>(tm->data(s.t.grad, s.h.grad));
    if (s.h.master != Tier::nvme) {
      s.master = static_cast<float*>(tm->data(s.t.master, s.h.master));
      if (cfg.optimizer.type != OptimizerType::Adagrad)
        s.exp_avg = static_cast<float*>(tm->data(s.t.exp_avg, s.h.optim));
      if (cfg.optimizer.type != OptimizerType::Lion)
        s.exp_avg_sq = static_cast<float*>(tm->data(s.t.exp_avg_sq, s.h.optim));
    }
    for (const tiering::Move& w : writes) w.wait();
    writes.clear();
    // The device-side buffers the model reads and writes (blocks allocated only while in use).
    s.gathered = tm->register_tensor({.name = s.name + ".gathered",
                                      .kind = tiering::Kind::param,
                                      .dtype = act,
                                      .bytes = s.numel * dtype_bytes(act),
                                      .home = Tier::device,
                                      .chunk = s.id,
                                      .shard = -1});
    s.gradbuf = tm->register_tensor({.name = s.name + ".gradbuf",
                                     .kind = tiering::Kind::grad,
                                     .dtype = DType::fp32,
                                     .bytes = s.numel * sizeof(float),
                                     .home = Tier::device,
                                     .chunk = s.id,
                                     .shard = -1});
    tm->pin(s.gathered);
    tm->pin(s.gradbuf);
    if (s.accumulates()) {  // its device accumulator (Note [Gradients off the device]), a block while live
      s.accbuf = tm->register_tensor(
          {.name = s.name + ".grad_acc",
           .kind = tiering::Kind::grad,
           .dtype = DType::fp32,
           .bytes = (s.route.grads == UpdateRoute::Grads::local_accumulator ? s.numel : s.shard.numel) *
                    sizeof(float),
           .home = Tier::device,
           .chunk = s.id,
           .shard = -1});  // transient, as the gradient buffer
      tm->pin(s.accbuf);
    }
  }
  STRATA_LOG_INFO("zero3: ", mcfg.name, " (", mcfg.num_parameters(), " parameters, ", slots.size(),
                  " chunks, ", groups.size(), " optimizer sub-group", groups.size() > 1 ? "s" : "", ") on ",
                  dev->caps().name, " (", ops->caps().name, "): state ", format_size(plan.device_state),
                  " device, ", format_size(plan.pinned_state), " pinned host, ", format_size(plan.nvme_state),
                  " NVMe");
  if (persistent_bytes > plan.device_cache)
    STRATA_LOG_INFO("zero3: the device's chunk cache (", format_size(plan.device_cache), ") cannot keep the ",
                    persistent_chunks, " chunk", persistent_chunks > 1 ? "s" : "",
                    " below stage3_param_persistence_threshold (", format_size(persistent_bytes),
                    ") gathered: they are gathered again when the room is needed; a device cap of ",
                    dev->caps().capacity - plan.device_cache + persistent_bytes, " bytes keeps them");
}

Event& EngineState::computed(ChunkSlot& s) {
  if (!s.computed) s.computed = dev->create_event();
  compute_stream->record(*s.computed);
  return *s.computed;
}

std::vector<tiering::TensorId> EngineState::optimizer_tensors(const ChunkSlot& s) const {
  switch (cfg.optimizer.type) {
    case OptimizerType::Adagrad:
      return {s.t.master, s.t.exp_avg_sq};
    case OptimizerType::Lion:
      return {s.t.master, s.t.exp_avg};
    default:
      return {s.t.master, s.t.exp_avg, s.t.exp_avg_sq};
  }
}

// ------------------------------------------------------------------------------------------ public API

Engine::Engine(const Config& cfg, const model::ModelConfig& mcfg, EngineOptions opts)
    : impl_(std::make_unique<Impl>(cfg, mcfg, opts)) {}

Engine::~Engine() = default;

const model::ModelLayout& Engine::layout() const {
  return impl_->layout;
}
model::ChunkView Engine::acquire(int id) {
  return impl_->cache.acquire(id);
}
void Engine::release(int id) {
  impl_->cache.release(id);
}
float* Engine::acquire_grads(int id) {
  return impl_->grads.acquire_grads(id);
}
void Engine::release_grads(int id) {
  impl_->grads.release_grads(id);
}
StepResult Engine::step() {
  impl_->dev->bind_thread();  // Note [thread device] in core/device.h: whichever thread calls
  return impl_->step();
}
std::string Engine::save_checkpoint(const std::string& dir, const nlohmann::json& client_state,
                                    const model::DataLoader* data, const std::string& tag) {
  impl_->dev->bind_thread();
  impl_->overlap.settle(-1);   // the last step's updates left to the worker
  impl_->overlap.undo(false);  // the state as of the last step (a later step redoes the updates)
  return impl_->save(dir, client_state, data, tag);
}
nlohmann::json Engine::load_checkpoint(const std::string& dir, const std::string& tag,
                                       model::DataLoader* data) {
  impl_->dev->bind_thread();
  impl_->overlap.settle(-1);
  impl_->overlap.undo(false);
  return impl_->load(dir, tag, data);
}
std::int64_t Engine::global_step() const {
  return impl_->global_step;
}
std::int64_t Engine::skipped_steps() const {
  return impl_->skipped;
}
double Engine::loss_scale() const {
  return impl_->scaler.scale();
}
double Engine::lr() const {
  return impl_->sched.lr();
}
int Engine::micro_batch() const {
  return int(impl_->cfg.train_micro_batch_size_per_gpu);
}
comm::Communicator& Engine::communicator() {
  return *impl_->comm;
}
int Engine::accumulation_steps() const {
  return int(impl_->cfg.gradient_accumulation_steps);
}
const Config& Engine::config() const {
  return impl_->cfg;
}
std::uint64_t Engine::checkpoint_bytes() const {
  return impl_->checkpoint_bytes();
}

const MemoryPlan& Engine::plan() const {
  return impl_->plan;
}
std::vector<UpdateRoute> Engine::update_routes() const {
  std::vector<UpdateRoute> r;
  for (const ChunkSlot& s : impl_->slots) r.push_back(s.route);
  return r;
}
const prefetch::PrefetchStats& Engine::prefetch_stats() const {
  return impl_->cache.prefetcher().stats();
}
const TransferStats& Engine::transfer_stats() const {
  return impl_->transfers;
}
nvme::IoStats Engine::nvme_stats() const {
  return impl_->aio ? impl_->aio->stats() : nvme::IoStats{};
}
const OverlapStats& Engine::overlap_stats() const {
  return impl_->overlap.stats();
}
const UpdateStats& Engine::update_stats() const {
  return impl_->updates;
}
tiering::TierManager& Engine::tiers() {
  return *impl_->tm;
}
Device& Engine::device() {
  return *impl_->dev;
}
kernels::Ops& Engine::ops() {
  return *impl_->ops;
}
model::ModelOptions Engine::model_options() {
  return {.checkpoint_activations = impl_->ckpt, .device = impl_->dev.get(), .ops = impl_->ops.get()};
}

}  // namespace strata::zero3
