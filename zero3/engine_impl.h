// Internal to zero3: the engine's state. One training thread calls every method; the gather and gradient
// streams run host functions that touch only the buffers they were handed and a slot's `error`.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cpu_optim/cpu_optim.h"
#include "nvme/engine.h"
#include "nvme/swap_store.h"
#include "tiering/trace_writer.h"
#include "zero3/engine.h"
#include "zero3/loss_scaler.h"
#include "zero3/lr_schedule.h"

namespace strata::zero3 {

using tiering::Tier;
using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// StepTimes.wait: the time the host was blocked while the compute stream had nothing running. Where the
// backend measures the stream's busy time (host: the model's ops run on the compute stream's thread), a
// block that only waited for computation to drain counts nothing; on cuda busy_seconds is 0, so the
// figure is the blocked time.
struct WaitTimer {
  explicit WaitTimer(const Stream& compute) : compute_(compute), busy0_(compute.busy_seconds()) {}
  double idle_seconds() const {
    const double blocked = seconds_since(t0_);
    return std::clamp(blocked - (compute_.busy_seconds() - busy0_), 0.0, blocked);
  }

 private:
  const Stream& compute_;
  Clock::time_point t0_ = Clock::now();
  double busy0_;
};

// One chunk: its shard's five tensors in the tier manager, its gathered copy on the device, its gradient
// buffer, its optimizer step counter.
struct ChunkSlot {
  int id = 0;
  std::string name;         // "block.3"
  std::size_t numel = 0;    // gathered elements (padded_numel)
  comm::ShardRange shard;   // this rank's slice of the chunk
  tiering::ShardTensors t;  // param (working dtype), grad, master, exp_avg, exp_avg_sq (fp32)
  // Their homes: the config's (Impl::homes), or with master, states and gradients on the device when
  // offload_optimizer.ratio keeps the chunk's sub-group there.
  tiering::ShardHomes h;
  // How it is updated, as the plan decided (Note [Update routes] in placement.cpp).
  UpdateRoute route;
  // Below stage3_param_persistence_threshold: kept gathered after release whatever its reuse distance
  // (in the cache, which gives way to what the model holds: Note [Device room]).
  bool persistent = false;
  // Device budget bytes (allocator blocks) of its gathered copy (activation dtype) and gradient buffer
  // (fp32).
  std::uint64_t gather_block = 0, grad_block = 0;

  // Stable addresses of the tensors whose home is the device or pinned host memory (pinned in the tier
  // manager, so never moved); null for NVMe-resident ones.
  void* param_home = nullptr;  // (shard.numel) working dtype
  float* grad = nullptr;       // (shard.numel) fp32 accumulator
  float* master = nullptr;     // (shard.numel) fp32
  float* exp_avg = nullptr;    // (shard.numel) fp32
  float* exp_avg_sq = nullptr;

  // The gathered working params, widened to fp32, on the device. `gathered` and `gradbuf` are registered
  // once and pinned; their device blocks come and go (allocate, then evict of a never-valid copy frees).
  enum class Gather : std::uint8_t { absent, in_flight, ready, held };
  Gather g = Gather::absent;
  tiering::TensorId gathered = 0;
  void* gptr = nullptr;               // (numel) in the ops' activation dtype (act)
  std::unique_ptr<Event> ready;       // recorded on the gather stream after the widening pass
  const Event* reader = nullptr;      // the last work reading the gathered block: `ready` or `computed`
  std::unique_ptr<Event> computed;    // the compute stream's work so far on this chunk (computed())
  std::unique_ptr<Event> handed_off;  // the gradient stream's copy of the gradient buffer
  std::exception_ptr error;           // set by that pass before `ready` completes
  bool pins_param = false;            // the gather holds a pin on the param's pinned copy (NVMe home)
  bool counts_nvme_read = false;      // the gather occupies one of offload_param.buffer_count buffers
  std::uint64_t last_use = 0;

  // The gradient buffer handed to the model (device, fp32, numel), between acquire_grads and release.
  tiering::TensorId gradbuf = 0;
  float* gbuf = nullptr;    // non-null while handed out
  bool grads_fresh = true;  // no gradient has reached this chunk yet this step
  // The route sums its gradients on the device (Note [Gradients off the device]; stage 1's local
  // accumulator: Note [Stage 1 accumulates locally]) and crosses to the shard once per step. `acc` (device,
  // fp32: shard.numel, the local one numel) is live from the step's first hand-off to its flush; while it
  // is, the shard holds nothing.
  bool accumulates() const {
    return route.grads == UpdateRoute::Grads::device_accumulator ||
           route.grads == UpdateRoute::Grads::local_accumulator;
  }
  tiering::TensorId accbuf = 0;
  float* acc = nullptr;

  cpu_optim::ShardStep opt;
};

// Bytes of RAM (0: unknown).
std::uint64_t physical_memory();

// The optimizer overlapped with backward: Note [Optimizer overlap] in engine_overlap.cpp.
struct OptimizerOverlap {
  enum class State : std::uint8_t { idle, queued, done, failed };
  // Where the rollback copies of the chunks updated during backward (UpdateRoute.overlap) are in `backup`
  // (byte offsets; the copies of a chunk are its master, optimizer states and working params, in that
  // order).
  std::vector<std::size_t> backup_at;   // per chunk (overlapped chunks only)
  std::unique_ptr<std::byte[]> backup;  // plan.overlap_host bytes
  // The pass (hand-offs are counted by the engine: Impl::handoffs_expected, handoffs_seen).
  bool armed = false;  // this backward ends the step's accumulation: final hand-offs start updates
  // The last applied step clipped: the next one probably will too, so it is not updated early.
  bool last_clipped = false;
  // What the updates made during this backward assumed: the step applies unclipped.
  double lr = 0;
  float factor = 1;
  std::int64_t step_no = 0;
  std::vector<std::unique_ptr<Event>> final_grads;  // per chunk: its last hand-off, on its stream
  std::vector<cpu_optim::ShardStep> before;         // per chunk: its ShardStep before the update
  std::vector<char> copied;  // per chunk: the worker has started overwriting (its copies are whole)
  // Per chunk: its gradients' statistics, taken by the worker from the final gradients (every chunk whose
  // gradients the CPU reduces, eligible or not), for step()'s norm: the same function on the same bytes.
  // Ready until the next backward or a cancellation.
  struct GradStats {
    bool ready = false;
    double sum_sq = 0;
    bool finite = true;
    std::vector<double> blocks;  // world > 1: the per-block partials
  };
  std::vector<GradStats> grad_stats;
  // The worker thread and its queue of chunks; `state` is read and written under `mu`.
  std::vector<State> state;
  std::thread worker;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<int> queue;
  int running = 0;
  bool stop = false;
  std::exception_ptr error;  // the first update that failed
  // Work made during backward (updates, gradient statistics) queued or running: what undo and wait wait
  // for.
  int early_pending = 0;
  // Updates step() left to the worker (deferred[c]), with the step's rate, factor and number; they run
  // while the next forward starts, each chunk before its gather or gradients (overlap_settle).
  std::vector<char> deferred;
  int deferred_pending = 0;
  double deferred_lr = 0;
  float deferred_factor = 1;
  std::int64_t deferred_step = 0;
  std::exception_ptr deferred_error;
  OverlapStats stats;
};

struct Engine::Impl final : prefetch::FetchTarget {
  Impl(const Config& cfg, const model::ModelConfig& mcfg, const EngineOptions& opts);
  ~Impl() override;

  // ---- construction (engine.cpp) ----
  // The rank's cpus, split between the CPU optimizer and the host backend's compute (Note [Cores]).
  void plan_cores();
  std::vector<int> compute_cpus, optimizer_cpus;
  // One collective on each stream's communicator, so that NCCL has made its connections (and taken their
  // device memory) before measure_capacity (Note [Device memory outside the pool] in engine.cpp).
  void warm_up_communicators();
  void plan_memory();
  // offload_optimizer.ratio "auto": how many sub-groups keep the optimizer on the device (plan_memory;
  // `in` planned with none there). Note [Offload ratio].
  int choose_device_groups(const PlanInput& in, const Plan& offloaded);
  // Elements a second of the CPU optimizer (pinned memory) and of the device optimizer (device memory),
  // measured on `n` elements.
  double cpu_optimizer_rate(std::size_t n);
  double device_optimizer_rate(std::size_t n);
  // Note [Ranks agree] (engine.cpp): the device capacity every rank plans with, the least over ranks.
  void agree_capacity();
  // Every rank's `mine`, in rank order (a collective): plan inputs a rank measures on its own.
  std::vector<std::uint64_t> every_ranks(std::uint64_t mine);
  // Host memory the plan takes: pinned state and staging, and on the host backend the device too.
  std::uint64_t host_need() const;
  // The ranks sharing this rank's machine (its host name) and the host memory their plans take together:
  // the host-memory checks weigh what the machine holds against all of them (share_host, after plan_memory).
  void share_host();
  int ranks_here = 1;
  std::uint64_t host_need_here = 0;
  void check_fits() const;
  void open_tiers();
  void init_chunks();
  // Places `bytes` from `src` as the valid copy of `id` in its home tier (through pinned memory for NVMe).
  tiering::Move put(tiering::TensorId id, Tier home, const void* src, std::size_t bytes);
  // Synchronous copies between host memory and device memory, on the compute stream (ordered after the
  // ops that wrote the device side): initialisation and checkpoints when `by_ops`.
  void to_device(void* dst, const void* src, std::size_t bytes);
  void from_device(void* dst, const void* src, std::size_t bytes);
  std::size_t wd_bytes() const;

  // ---- chunks on the device (engine_chunks.cpp) ----
  std::uint64_t numel(int c) const override;
  prefetch::Residency residency(int c) override;
  bool start_fetch(int c, bool demand) override;
  void wait_fetch(int c) override;
  std::uint64_t live_numel() const override;
  void finish_fetch(ChunkSlot& s);
  void drop_gathered(ChunkSlot& s);
  void drop_all_gathered();
  // The chunk cache (Note [Device room] in engine_chunks.cpp): gathered chunks not held, ready or in
  // flight, and the device bytes they take.
  bool cached(const ChunkSlot& s) const;
  std::uint64_t cache_bytes() const;
  // The trace position of the next acquire of `s` not yet made in this pass; -1: none (or unknown).
  std::int64_t next_use(const ChunkSlot& s) const;
  // The cached chunk to drop first: the one used furthest in the future (never again: first of all),
  // then the least recently used. With `for_position` >= 0 (a prefetch for that position) only chunks
  // used after it qualify. Null when none does.
  ChunkSlot* victim(std::int64_t for_position);
  // Drops cached chunks, victim() first, until the cache plus `more` bytes fits plan.device_cache.
  // False when that cannot be done with the chunks victim(for_position) allows.
  bool fit_cache(std::uint64_t more, std::int64_t for_position);
  // A device block for `id`. A prefetch (demand false) gets null when the allocator refuses; a demand
  // drops cached chunks until it fits (OutOfMemory when none is left).
  void* device_alloc(tiering::TensorId id, bool demand);
  void trim_param_cache();
  model::ChunkView acquire(int c);
  void release(int c);
  float* acquire_grads(int c);
  void release_grads(int c);
  // Copies a live device accumulator into its (empty) pinned shard on the gradient stream and frees it
  // after the copy; flush_accumulators does so for every live one (the end of the step's last backward,
  // and step()).
  void flush_accumulator(ChunkSlot& s);
  void flush_accumulators();
  // Hands this rank's slice `src` (in device block `buffer`, freed once read) to the chunk's fp32 gradient
  // shard: copied into it when it is empty this step, else added (Note [Gradients off the device]).
  void hand_to_shard(ChunkSlot& s, const float* src, tiering::TensorId buffer, bool final);
  // Stage 1's local accumulator: reduce-scattered, its slice handed to the shard, freed (Note [Stage 1
  // accumulates locally]).
  void flush_local_accumulator(ChunkSlot& s);
  // dst += src (fp32, one add per element) on the CPU optimizer's threads: the gradient stream's add of a
  // staged gradient into a pinned shard.
  void add_on_host(float* dst, const float* src, std::size_t n);
  void sync_grads();
  // Gradient hand-offs per chunk in the last complete backward (0: unknown) and in this one: a chunk's
  // hand-off is final in the step's last backward when it is its expected-th (Note [Gradients off the
  // device]; the optimizer overlap starts updates there too).
  std::vector<int> handoffs_expected, handoffs_seen;
  bool last_micro = true;  // the backward in progress ends the step's accumulation
  bool final_handoff(const ChunkSlot& s) const {
    const int e = handoffs_expected[std::size_t(s.id)];
    return last_micro && e > 0 && handoffs_seen[std::size_t(s.id)] == e;
  }
  // Records the compute stream's work enqueued so far into s.computed and returns it. Waits and frees made
  // after it take that point (an event's later records do not move them).
  Event& computed(ChunkSlot& s);

  // ---- the step (engine_step.cpp) ----
  StepResult step();
  // Ends the open pass without recording it (a forward that failed or whose backward will not run).
  void abandon_pass();
  // The squared norm and finiteness of every chunk's gradients (zeroing the shards no gradient reached),
  // summed in chunk order.
  void grad_stats(double& sum_sq, bool& finite);
  // The update of a chunk whose master lives on the device and `by_ops`: the compute interface's AdamW on
  // the compute stream, writing the new working params to their home (through the device's scratch of
  // pinned staging when that home is host memory).
  void update_chunk_on_device(ChunkSlot& s, void* out, double lr, float factor, std::int64_t step_no);
  // The config's Adam/AdamW hyper-parameters at rate `lr`, for the device optimizer (Ops::adamw).
  kernels::Ops::AdamW device_adamw(double lr) const;
  // The host backend's device optimizer: the SIMD CPU optimizer with its own threads on the cpus the
  // model's ops compute on (compute_cpus; every cpu when the cores are shared), run from the compute
  // stream. Made on first use.
  cpu_optim::Optimizer& host_device_optimizer();
  std::unique_ptr<cpu_optim::Optimizer> device_opt;
  // The host backend's direct path: the device optimizer's updates enqueued by update_group (their new
  // working params written straight home), finished by finish_device_updates after the CPU optimizer's
  // share of the step: the compute stream is waited for and the params' writes issued.
  std::vector<int> device_updates;
  void update_on_model_cpus(ChunkSlot& s, double lr, float factor, std::int64_t step_no);  // enqueues one
  void finish_device_updates(std::vector<tiering::Move>& writes);
  void update_group(const std::vector<int>& group, double lr, float grad_factor, std::int64_t step_no,
                    std::vector<tiering::Move>& writes);
  // The chunks not updated during backward, with the optimizer in addressable memory: update_group, with a
  // share of the CPU optimizer's work on the model's idle cpus (Note [The optimizer's tail]).
  void update_rest(const std::vector<int>& chunks, double lr, float grad_factor, std::int64_t step_no,
                   std::vector<tiering::Move>& writes);
  // The CPU optimizer's update of one chunk (`with`: another cpu_optim::Optimizer than `opt`).
  void update_chunk(ChunkSlot& s, float* master, float* m, float* v, void* out, double lr, float factor,
                    std::int64_t step_no, cpu_optim::Optimizer* with = nullptr);
  void* param_out(ChunkSlot& s);
  void param_written(ChunkSlot& s, std::vector<tiering::Move>& writes);
  std::vector<tiering::TensorId> optimizer_tensors(const ChunkSlot& s) const;

  // ---- the optimizer overlapped with backward (engine_overlap.cpp) ----
  // Decides whether and for which chunks (constructor, after init_chunks); null `overlap` when off.
  void plan_overlap();
  // Engine::backward: before the model's backward (whether this one ends the step's accumulation) and
  // after it (`ok`: it completed; its hand-off counts become the expected ones).
  void overlap_begin_backward();
  void overlap_end_backward(bool ok);
  // release_grads, after the hand-off is enqueued: the chunk's last one this backward starts its
  // update (on the worker).
  void overlap_handed_off(ChunkSlot& s, Stream& on);
  // Waits for the worker; rethrows the first failed update (after undoing every update).
  void overlap_wait();
  // Undoes every update made during backward (exactly: the copies are put back), counting it as a
  // rollback (step) or a cancellation (anything else). No-op when there is none.
  void overlap_undo(bool rollback);
  // Whether chunk c was updated during this step's backward (after overlap_wait).
  bool overlap_done(std::size_t c) const;
  // step(): chunk c's update made during backward stands: its new working params to a device home.
  void overlap_keep(std::size_t c);
  void overlap_worker();
  void overlap_update(int c);
  void overlap_grad_stats(int c);  // on the worker: chunk c's GradStats
  // step(): leaves the updates of chunks whose route defers them to the worker (in order).
  void overlap_defer(const std::vector<int>& chunks, double lr, float factor, std::int64_t step_no);
  // Waits for chunk c's deferred update (c < 0: every one); rethrows one that failed.
  void overlap_settle(int c);
  // What a chunk's copies hold, in their order in `backup`: master, the optimizer's states, and the
  // working params unless they are staged (UpdateRoute::Params::staged: a device home reached by stream
  // work only), whose new values then follow the copies (overlap_staging).
  std::vector<std::pair<void*, std::size_t>> overlap_regions(ChunkSlot& s) const;
  std::byte* overlap_staging(const ChunkSlot& s) const;
  void overlap_stop();  // ~Impl: joins the worker
  std::unique_ptr<OptimizerOverlap> overlap;

  // ---- checkpoints (engine_checkpoint.cpp) ----
  std::string save(const std::string& dir, const nlohmann::json& client_state, const model::DataLoader* data,
                   const std::string& tag);
  nlohmann::json load(const std::string& dir, const std::string& tag, model::DataLoader* data);
  nlohmann::json chunk_table() const;
  std::uint64_t checkpoint_bytes()
      const;  // Engine::checkpoint_bytes  // [{"name", "numel", "padded_numel"}] of this layout
  // Calls fn(ptr) with a host-readable copy of tensor `id` (fetched from NVMe into pinned memory if that is
  // the only copy, and dropped again after).
  template <typename Fn>
  void with_host_copy(tiering::TensorId id, Fn&& fn) {
    const tiering::TierMask valid = tm->info(id).valid;
    if (tiering::has(valid, Tier::pinned)) return fn(static_cast<const void*>(tm->data(id, Tier::pinned)));
    if (tiering::has(valid, Tier::device)) {
      if (!by_ops) return fn(static_cast<const void*>(tm->data(id, Tier::device)));
      std::vector<std::byte> host(tm->info(id).desc.bytes);
      from_device(host.data(), tm->data(id, Tier::device), host.size());
      return fn(static_cast<const void*>(host.data()));
    }
    tm->pin(id);
    try {
      tm->fetch(id, Tier::pinned).wait();
      fn(static_cast<const void*>(tm->data(id, Tier::pinned)));
    } catch (...) {
      tm->unpin(id);
      throw;
    }
    tm->unpin(id);
    tm->evict(id, Tier::pinned, Tier::nvme);  // the NVMe copy is still valid: the pinned one is dropped
  }

  Config cfg;
  model::ModelConfig mcfg;
  model::ModelLayout layout;
  EngineOptions opts;
  bool ckpt =
      true;  // the model checkpoints activations (plan_memory decides, Note [Checkpointing by choice])
  DType wd = DType::bf16;  // working dtype
  tiering::ShardHomes homes;
  int n_states = 2;  // optimizer state tensors per parameter besides the master (Adam 2, Adagrad 1, Lion 1)

  std::unique_ptr<Device> dev;
  // The ranks: `comm` for the training thread's collectives (norms, losses, checkpoints), one dup for
  // each stream that issues collectives in its own order (gathers, gradients). `owned_comm` when the
  // engine made it. Note [Ranks] in engine_chunks.cpp.
  std::unique_ptr<comm::Communicator> owned_comm, gather_comm, grad_comm;
  comm::Communicator* comm = nullptr;
  int world = 1;
  // ZeRO stages 1 and 2 over N ranks: every rank keeps the whole chunk's working params (at home on the
  // device); only the gradients (stage 2), the master and the optimizer states are partitioned. Then the
  // param tensor is the chunk, and this rank's slice of it starts at shard.offset.
  bool replicated = false;
  std::size_t param_numel(const ChunkSlot& s) const { return replicated ? s.numel : s.shard.numel; }
  std::size_t param_offset(const ChunkSlot& s) const { return replicated ? s.shard.offset : 0; }
  // This rank's slice of the working params at their home (device or pinned memory).
  void* my_params(const ChunkSlot& s) const {
    return static_cast<char*>(s.param_home) + param_offset(s) * dtype_bytes(wd);
  }
  std::unique_ptr<nvme::AioEngine> aio;
  std::unique_ptr<nvme::SwapStore> swap;
  std::unique_ptr<tiering::TierManager> tm;
  std::unique_ptr<tiering::TraceWriter> trace;
  // The streams, then the compute interface on each (declared after them: destroyed first, as an Ops
  // waits for its stream's work when it goes). Only `ops` has the model role (the matrix products'
  // workspace, the attention library's handle); the copy streams' are runtime-role (kernels/ops.h).
  std::unique_ptr<Stream> gather_stream, grad_stream, compute_stream;
  std::unique_ptr<kernels::Ops> ops;         // on compute_stream: the model's ops, gradient adds
  std::unique_ptr<kernels::Ops> gather_ops;  // on gather_stream: the gathers' casts
  std::unique_ptr<kernels::Ops> grad_ops;    // on grad_stream: reduced and accumulated gradients
  DType act = DType::fp32;                   // the ops' activation dtype: gathered chunks hold it
  // State at home on the device is reached by stream work only (EngineOptions.device_state_by_ops, or a
  // device the CPU cannot address): the CPU never dereferences a device pointer.
  bool by_ops = false;
  // by_ops: the per-chunk gradient statistics on the device (16 bytes a chunk: the fp64 squared norm and
  // the int32 non-finite flag), a tensor of the device state; and pinned staging for new working params
  // that the CPU optimizer computes for a device home (largest shard, working dtype).
  tiering::TensorId stats_id = 0;
  char* stats = nullptr;
  PinnedBuffer param_staging;
  std::unique_ptr<Event> updated;       // the compute stream after the step's device updates
  std::unique_ptr<Event> backward_end;  // the compute stream after the last backward's ops
  // The model's backward returns with its ops still running (Note [Device work in stream order]); the
  // next forward or step() waits for them first, counting the wait as backward's time (StepTimes).
  void settle_backward();
  // Pinned staging for a gradient buffer on its way to a pinned shard that already holds gradients
  // (accumulation): copied off the device here, then added on the host. (padded_numel of the largest chunk)
  PinnedBuffer grad_staging;
  // From plan_memory: the largest shard (elements), the chunks that stay gathered all pass and their device
  // bytes, and the tokens per sequence the activations are planned for.
  std::uint64_t largest_shard = 0, persistent_bytes = 0;
  int persistent_chunks = 0, planned_seq_len = 0;
  std::unique_ptr<prefetch::Prefetcher> pf;
  std::unique_ptr<cpu_optim::Optimizer> opt;
  LossScaler scaler;
  LrSchedule sched;
  MemoryPlan plan;

  std::vector<ChunkSlot> slots;
  // What the plan was made from (plan_overlap plans on it too).
  PlanInput planned;
  std::vector<std::vector<int>> groups;  // optimizer sub-groups: consecutive chunks, <= sub_group_size
  std::size_t group_window = 1;          // NVMe sub-groups whose states may be in pinned memory at once

  // NVMe-resident parameters: reads in flight (<= offload_param.buffer_count) and the pinned copies kept
  // as a cache (<= offload_param.max_in_cpu elements), least recently used first.
  int nvme_param_reads = 0;
  std::deque<int> param_cache;
  std::uint64_t param_cache_numel = 0;

  TransferStats transfers;
  UpdateStats updates;

  std::int64_t global_step = 0, applied_steps = 0, skipped = 0;
  bool in_pass = false;
  int acquiring = -1;  // the chunk acquire() is making resident (never dropped to make room meanwhile)
  std::uint64_t use_clock = 0;
  // The step in progress.
  bool forward_open = false;  // Engine::forward ran; its backward has not (the pass is open)
  std::int64_t forward_tokens = 0;
  float forward_loss = 0;
  int micro_steps = 0;
  double loss_sum = 0;
  std::int64_t tokens = 0;
  StepTimes times;
};

}  // namespace strata::zero3
