// The engine's construction: the device, NVMe store and tier manager, and the registration and
// initialisation of every chunk; the memory plan and the up-front checks are engine_plan.cpp's. Also the
// thin public wrappers.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "comm/devices.h"
#include "core/log.h"
#include "core/topology.h"
#include "cpu_optim/cpu_optim.h"
#include "kernels/cpu/ops.h"
#include "model/architecture.h"
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
  d.check_thread_device = opts.testing.check_thread_device;
  return d;
}

}  // namespace

EngineEnv::EngineEnv(const Config& c, const model::ModelConfig& m, const EngineOptions& o)
    : cfg(c),
      mcfg(m),
      // One rank: chunks padded to 64 elements. N ranks: each shard a whole number of the gradient norm's
      // blocks, so the norm sums the same partials in the same order at any world size (Note [Ranks]).
      layout(model::architecture((m.validate("model"), m)).layout(m, layout_options(c.world_size))),
      opts(o),
      rule(c.optimizer) {}

Engine::Impl::Impl(const Config& c, const model::ModelConfig& m, const EngineOptions& o)
    : EngineEnv(c, m, o), scaler(c.fp16), sched(c.scheduler, c.optimizer.lr) {
  dev = open_device(device_options(cfg, opts));
  if (opts.communicator) {
    comm = opts.communicator;
  } else {
    owned_comm = comm::make_communicator(*dev);
    comm = owned_comm.get();
  }
  world = comm->world_size();
  // (offload_param and NVMe offload need stage 3: the config refuses them below it, as DeepSpeed does.)
  if (world != cfg.world_size)
    throw ConfigError(cat("the config was resolved for world_size ", cfg.world_size, " but ", world,
                          " ranks are training (", comm->name(),
                          "); load the config with the launcher's world size (train_batch_size = "
                          "train_micro_batch_size_per_gpu x gradient_accumulation_steps x ranks)"));
  // The plan's engine-wide facts (Note [Update routes]), copied.
  const EngineFacts facts = engine_facts(cfg, world);
  replicated = facts.replicated;
  working_dtype = facts.working;
  by_ops = !dev->caps().host_addressable || opts.testing.device_state_by_ops;
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
                           .workspace_bytes = opts.testing.ops_workspace_bytes,
                           .deterministic_attention = cfg.strata.deterministic_attention});
  act = ops->caps().activation;
  // On the host backend with cores of the optimizer's own, the copies run there too (Note [Cores]).
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
  // With strata.cpu_optim.cores the optimizer has that many threads on its own cpus (Note [Cores]).
  opt = std::make_unique<cpu_optim::Optimizer>(cpu_optim::Options{
      .simd = cfg.strata.cpu_optim.simd,
      .threads = cfg.strata.cpu_optim.cores > 0 ? int(cfg.strata.cpu_optim.cores) : int(cfg.strata.threads),
      .pin = cfg.strata.cpu_optim.pin_threads,
      .cpus = optimizer_cpus});
  // Offload devices "auto" are chosen here (Note [Placement auto] in engine_auto.cpp), with the rates
  // measured when asked; then the homes follow from the config.
  choose_placement();
  settle_homes();
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
  choose_overlap();
  predict();
  overlap.open();
}

void Engine::Impl::settle_homes() {
  const auto& z = cfg.zero_optimization;
  homes = shard_homes(cfg);
  // The device optimizer is the compute interface's AdamW; the others run on the CPU only.
  const bool partial = partial_offload(z);
  if (by_ops && !rule.adam_family() && (homes.master == Tier::device || partial))
    throw ConfigError(
        cat("optimizer.type ", rule.name(),
            homes.master == Tier::device ? " with offload_optimizer.device = none"
                                         : " with offload_optimizer.ratio below 1",
            " needs an optimizer on the device, and the ", to_string(dev->caps().backend), " backend (",
            dev->caps().name, ") has only Adam and AdamW there: use optimizer.type AdamW, or ",
            homes.master == Tier::device ? "set zero_optimization.offload_optimizer.device to \"cpu\""
                                         : "set zero_optimization.offload_optimizer.ratio to 1",
            " (the CPU optimizers have all four)"));
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
  // Note [Drive rates from the swap] (zero3/machine.h): what this run's swap got of its drives, for the
  // next prediction, where this run predicted (measured rates, not given ones).
  if (aio && rates_measured && !opts.testing.machine_rates) {
    try {
      std::vector<std::string> dirs;
      const auto& z = cfg.zero_optimization;
      if (homes.master == Tier::nvme || homes.grad == Tier::nvme) dirs = z.offload_optimizer.nvme_paths;
      if (dirs.empty() && homes.param == Tier::nvme) dirs = z.offload_param.nvme_paths;
      record_swap_rate(*dev, int(allowed_cpus().size()), dirs, aio->stats());
    } catch (const std::exception& e) {
      STRATA_LOG_WARN("rates: cannot record the drive's rate (", e.what(), ")");
    }
  }
  if (trace) {
    try {
      trace->close();
    } catch (const std::exception& e) {
      STRATA_LOG_WARN("zero3: memprof trace: ", e.what());
    }
  }
}

void Engine::Impl::open_tiers() {
  const auto& z = cfg.zero_optimization;
  if (plan.nvme_state > 0 || plan.nvme_activations > 0) {
    // One store for both: its swap files striped over every directory listed (one per drive). The block
    // inputs alone on NVMe take whichever nvme_path the config names (checkpoint_nvme_path).
    const std::vector<std::string>& paths =
        z.offload_optimizer.device == OffloadDevice::nvme ||
                (plan.nvme_state == 0 && !z.offload_optimizer.nvme_paths.empty())
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
      what = cat(format_size(plan.nvme_params), " of ", dtype_name(working_dtype),
                 " working parameters (offload_param)");
    if (plan.nvme_state > plan.nvme_params)
      what += cat(
          what.empty() ? "" : " and ", format_size(plan.nvme_state - plan.nvme_params),
          " of fp32 master weights, ", rule.states(), " optimizer state", rule.states() > 1 ? "s" : "",
          homes.grad == Tier::nvme ? " and gradients" : "", " (offload_optimizer, ",
          4 * (1 + rule.states() + (homes.grad == Tier::nvme ? 1 : 0)), " bytes a parameter",
          homes.grad == Tier::nvme ? "; strata.nvme_gradients false keeps the gradients in host memory" : "",
          ")");
    if (plan.nvme_activations > 0)
      what += cat(what.empty() ? "" : " and ", format_size(plan.nvme_activations),
                  " of checkpointed block inputs (activation_checkpointing.cpu_checkpointing)");
    so.capacity_why =
        cat(what, world > 1 ? cat(" for this rank's shard (rank ", comm->rank(), " of ", world, ")") : "",
            ", plus ", format_size(plan.nvme_budget - plan.nvme_state - plan.nvme_activations),
            " of room for extent alignment and reuse (1/16 of that + 64 MiB)");
    // Each rank its own swap file: ranks on one machine may share nvme_path.
    so.name = world > 1 ? cat("zero3-rank", comm->rank()) : std::string("zero3");
    swap = std::make_unique<nvme::SwapStore>(*aio, so);
  }
  tiering::TierOptions to;
  to.pinned_budget = plan.pinned_budget;
  // The model allocates its activations, and the compute interface its workspace and scratch, from the
  // device beside the pool: the pool gets the rest.
  // (The block inputs off the device are the pool's: Note [Checkpoints off the device].)
  to.device_budget =
      dev->caps().capacity - (plan.device_activations - plan.device_checkpoint_window) - plan.device_ops;
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

void EngineEnv::to_device(void* dst, const void* src, std::size_t bytes) const {
  compute_stream->copy_async(dst, src, bytes, CopyKind::host_to_device);
  compute_stream->synchronize();
}

void EngineEnv::from_device(void* dst, const void* src, std::size_t bytes) const {
  compute_stream->copy_async(dst, src, bytes, CopyKind::device_to_host);
  compute_stream->synchronize();
}

void Engine::Impl::init_chunks() {
  namespace kc = kernels::cpu;
  const std::uint64_t seed = std::uint64_t(cfg.strata.seed);
  std::vector<float> full, zeros;
  std::vector<std::uint16_t> half;
  std::vector<std::byte> packed;
  std::vector<tiering::Move> writes;
  const model::Architecture& arch = model::architecture(mcfg);
  for (ChunkSlot& s : slots) {
    const std::size_t n = s.shard.numel;
    const bool trains = s.route.trains;
    s.tensors = tm->register_shard({.prefix = s.name,
                                    .chunk = s.id,
                                    .shard = comm->rank(),
                                    .numel = n,
                                    .working = working_dtype,
                                    .param_numel = s.param_numel,
                                    .param_bytes = s.nf4 ? s.nf4->bytes : 0,
                                    .homes = s.homes,
                                    .param_only = !trains});  // frozen: its working copy alone
    full.assign(s.numel, 0.0f);
    if (opts.init_params)
      opts.init_params(layout.chunk(s.id), full.data());
    else
      arch.init_chunk(layout, s.id, seed, full.data());
    const float* mine = full.data() + s.shard.offset;
    if (trains) writes.push_back(put(s.tensors.master, s.homes.master, mine, n * 4));
    // The working params: this rank's shard, or the whole chunk when replicated (stages 1 and 2).
    const float* params = replicated ? full.data() : mine;
    const std::size_t pn = s.param_numel;
    if (s.nf4) {  // the whole chunk, packed (Note [NF4 base] in model/nf4_chunk.h)
      packed.resize(s.nf4->bytes);
      s.nf4_offsets = model::pack_nf4(*s.nf4, full.data(), packed.data());
      writes.push_back(put(s.tensors.param, s.homes.param, packed.data(), packed.size()));
    } else if (working_dtype == DType::fp32) {
      writes.push_back(put(s.tensors.param, s.homes.param, params, pn * 4));
    } else {
      half.resize(pn);
      if (working_dtype == DType::bf16)
        kc::cast_f32_to_bf16(half.data(), params, pn);
      else
        kc::cast_f32_to_f16(half.data(), params, pn);
      writes.push_back(put(s.tensors.param, s.homes.param, half.data(), pn * 2));
    }
    zeros.assign(n, 0.0f);
    for (tiering::TensorId st : optimizer_tensors(s))
      if (st != s.tensors.master) writes.push_back(put(st, s.homes.optim, zeros.data(), n * 4));
    if (trains && s.homes.grad != Tier::nvme)
      tm->allocate(s.tensors.grad, s.homes.grad);  // NVMe: written by the first hand-off
    // Tensors at home on the device or in pinned memory stay there (their addresses are used directly);
    // NVMe-resident ones come and go through pinned memory.
    for (tiering::TensorId id :
         {s.tensors.param, s.tensors.grad, s.tensors.master, s.tensors.exp_avg, s.tensors.exp_avg_sq}) {
      if (id == 0) continue;  // a frozen chunk's: not registered
      const tiering::TensorInfo info = tm->info(id);
      if (info.desc.home != Tier::nvme && info.allocated) tm->pin(id);
    }
    if (s.homes.param != Tier::nvme) s.param_home = tm->data(s.tensors.param, s.homes.param);
    if (trains && s.homes.grad != Tier::nvme)
      s.grad = static_cast<float*>(tm->data(s.tensors.grad, s.homes.grad));
    if (trains && s.homes.master != Tier::nvme) {
      s.master = static_cast<float*>(tm->data(s.tensors.master, s.homes.master));
      if (rule.keeps_exp_avg()) s.exp_avg = static_cast<float*>(tm->data(s.tensors.exp_avg, s.homes.optim));
      if (rule.keeps_exp_avg_sq())
        s.exp_avg_sq = static_cast<float*>(tm->data(s.tensors.exp_avg_sq, s.homes.optim));
    }
    for (const tiering::Move& w : writes) w.wait();
    writes.clear();
    // The device-side buffers the model reads and writes (blocks allocated only while in use): the
    // gathered copy, the cache's; the gradient buffer and accumulator, the gradient path's.
    cache.add_chunk(s);
    grads.add_chunk(s);
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

std::vector<tiering::TensorId> EngineEnv::optimizer_tensors(const ChunkSlot& s) const {
  if (!s.route.trains) return {};  // frozen: no master, no states
  std::vector<tiering::TensorId> ids{s.tensors.master};
  if (rule.keeps_exp_avg()) ids.push_back(s.tensors.exp_avg);
  if (rule.keeps_exp_avg_sq()) ids.push_back(s.tensors.exp_avg_sq);
  return ids;
}

// ------------------------------------------------------------------------------------------ public API

Engine::Engine(const Config& cfg, const model::ModelConfig& mcfg, EngineOptions opts)
    : impl_(std::make_unique<Impl>(cfg, mcfg, opts)) {}

Engine::~Engine() = default;

bool Engine::trains(int id) const {
  return impl_->slots.at(std::size_t(id)).route.trains;
}

model::CheckpointStore* Engine::checkpoint_store() {
  Impl& im = *impl_;
  return im.training_forward && im.checkpoints.active() ? &im.checkpoints : nullptr;
}

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
  impl_->overlap.settle_all();  // the last step's updates left to the worker
  impl_->overlap.undo(
      UndoAs::cancellation);  // the state as of the last step (a later step redoes the updates)
  return impl_->save(dir, client_state, data, tag);
}
nlohmann::json Engine::load_checkpoint(const std::string& dir, const std::string& tag,
                                       model::DataLoader* data) {
  impl_->dev->bind_thread();
  impl_->overlap.settle_all();
  impl_->overlap.undo(UndoAs::cancellation);
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
  // The cache counts the gathers, the gradient path the rest.
  Impl& im = *impl_;
  const TransferStats& c = im.cache.transfers();
  im.transfers = im.grads.transfers();
  im.transfers.gathers = c.gathers;
  im.transfers.gather_bytes = c.gather_bytes;
  im.transfers.gather_host_waits = c.gather_host_waits;
  return im.transfers;
}
nvme::IoStats Engine::nvme_stats() const {
  return impl_->aio ? impl_->aio->stats() : nvme::IoStats{};
}
const OverlapStats& Engine::overlap_stats() const {
  return impl_->overlap.stats();
}
Engine::CheckpointMoves Engine::checkpoint_moves() const {
  return {impl_->checkpoints.moved_out(), impl_->checkpoints.moved_back()};
}
const UpdateStats& Engine::update_stats() const {
  return impl_->updater.stats();
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
  return {.checkpoint_activations = impl_->checkpoint_activations,
          .device = impl_->dev.get(),
          .ops = impl_->ops.get()};
}

}  // namespace strata::zero3
