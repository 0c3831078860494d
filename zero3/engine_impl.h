// Internal to zero3: the engine, composed of its parts.
//
// Note [Engine parts]: Engine::Impl is the environment the parts read (EngineEnv, engine_state.h: the
// config, device, streams, ops, ranks, tier manager, plan and chunks, made at construction and const to
// every part), the step's bookkeeping (below: counters, loss scale, rate) and four parts, each with its own
// header and source, its own per-chunk state and a narrow interface:
//
//   ChunkCache        engine_cache.{h,cpp}    gathers (prefetched or on demand, the all-gather at N ranks),
//                                             keep or drop on release, device room, NVMe params' copies
//   GradientPath      engine_grads.{h,cpp}    gradient buffers, hand-offs, reduce-scatter, accumulation,
//                                             the norm and overflow check
//   Updater           engine_update.{h,cpp}   each chunk stepped as its route says, params written home
//   OptimizerOverlap  engine_overlap.{h,cpp}  updates during backward, rollback, deferral
//
// Each chunk's UpdateRoute (Note [Update routes]), decided by the plan, tells the parts what to do with it;
// they test no home, world size or device kind themselves. They meet through two interfaces
// (engine_gate.h): the cache and the gradient path pass an UpdateGate (Impl forwards it to the overlap),
// the updater asks a DeviceRoom (the cache) for device blocks; so no part calls back into one that calls
// it. Each keeps its own per-chunk record — the cache's CacheEntry, the gradient path's GradEntry, the
// updater's ShardStep — beside the plan's ChunkSlot, which none writes; what a part needs of the step's
// bookkeeping it is given (BackwardStart, a step's rate and factor), and what it counts (transfers, waits)
// it keeps, for Impl to read. Impl itself builds everything (engine.cpp: the device, the tiers, the chunks;
// engine_plan.cpp: the plan, the cores, the ranks agreeing), drives a step (engine_step.cpp: forward,
// backward, step() in the order of Note [The optimizer step]), measures the offload ratio (engine_ratio.cpp)
// and saves and loads checkpoints (engine_checkpoint.cpp). One training thread calls every method.
#pragma once

#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zero3/engine_cache.h"
#include "zero3/engine_checkpoints.h"
#include "zero3/engine_grads.h"
#include "zero3/engine_overlap.h"
#include "zero3/engine_state.h"
#include "zero3/engine_update.h"
#include "zero3/loss_scaler.h"
#include "zero3/lr_schedule.h"
#include "zero3/machine.h"

namespace strata::zero3 {

struct Engine::Impl final : EngineEnv, private UpdateGate {
  Impl(const Config& cfg, const model::ModelConfig& mcfg, const EngineOptions& opts);
  ~Impl();

  // ---- construction (engine.cpp; the plan, cores and agreement: engine_plan.cpp) ----
  // The rank's cpus, split between the CPU optimizer and the host backend's compute (Note [Cores]).
  void plan_cores();
  // One collective on each stream's communicator, so that NCCL has made its connections (and taken their
  // device memory) before measure_capacity (Note [Device memory outside the pool] in engine.cpp).
  void warm_up_communicators();
  // The plan (placement.h) made here, in pieces: the input with what this rank measured (its ops' device
  // memory, the capacity), the checkpointing choice (Note [Checkpointing by choice]), the plan with
  // offload_optimizer.ratio "auto" chosen, the chunks laid out from it, and the ratio's log line.
  void plan_memory();
  PlanInput measured_plan_input();
  // strata.checkpoint_activations, or EngineOptions' choice over it; empty for "auto".
  std::optional<bool> checkpointing_mode() const;
  Plan plan_with_ratio(PlanInput& in);
  void lay_out_chunks(const PlanInput& in, const Plan& p);
  void report_ratio() const;
  // offload_optimizer.ratio "auto": how many sub-groups keep the optimizer on the device (plan_memory;
  // `in` planned with none there). Note [Offload ratio].
  int choose_device_groups(const PlanInput& in, const Plan& offloaded);
  // Elements a second of the CPU optimizer (pinned memory) and of the device optimizer (device memory),
  // measured on `n` elements.
  double cpu_optimizer_rate(std::size_t n);
  double device_optimizer_rate(std::size_t n);
  // Note [Ranks agree] (engine_plan.cpp): the device capacity every rank plans with, the least over ranks.
  void agree_capacity();
  // Every rank froze the same chunks (EngineOptions.frozen_chunks), or ConfigError (a collective).
  void agree_frozen_chunks();
  // Every rank's `mine`, in rank order (a collective): plan inputs a rank measures on its own.
  std::vector<std::uint64_t> every_ranks(std::uint64_t mine);
  // Host memory the plan takes: pinned state and staging, and on the host backend the device too.
  std::uint64_t host_need() const { return host_need(plan); }
  std::uint64_t host_need(const MemoryPlan& m) const;
  // Whether plan `m`, its block inputs in pinned memory, would take more than check_fits' 90% of the host.
  bool plan_pinned_too_big(const MemoryPlan& m) const;
  // Where NVMe swap files go: offload_optimizer's nvme_path when it swaps, else offload_param's; empty
  // when neither names one.
  std::string checkpoint_nvme_path() const;
  // The machine's memory, or EngineTestHooks::host_memory.
  std::uint64_t host_memory() const {
    return opts.testing.host_memory > 0 ? opts.testing.host_memory : physical_memory();
  }
  // The ranks sharing this rank's machine (its host name) and the host memory their plans take together:
  // the host-memory checks weigh what the machine holds against all of them (share_host, after plan_memory).
  void share_host();
  int ranks_here = 1;
  std::uint64_t host_need_here = 0;
  void check_fits() const;
  // ---- the step-time model (engine_auto.cpp) ----
  // Note [Placement auto]: offload devices "auto" resolved to the fastest placement that fits (rank 0's
  // choice on every rank), the table logged; ConfigError-like OutOfMemory naming the smallest change
  // when none fits. Measures the rates where "auto" or EngineOptions.predict_step asks.
  void choose_placement();
  // The homes of the config's placement, and the refusal of an optimizer the device has not.
  void settle_homes();
  // The prediction for the plan in force, once the routes are final (after choose_overlap).
  void predict();
  void measure_rates(bool nvme);
  bool rates_measured = false;
  MachineRates rates;
  StepPrediction predicted;
  std::vector<PlacementOption> placement_options;
  int placement_chosen = -1;
  void open_tiers();
  void init_chunks();
  // Places `bytes` from `src` as the valid copy of `id` in its home tier (through pinned memory for NVMe).
  tiering::Move put(tiering::TensorId id, Tier home, const void* src, std::size_t bytes);
  // The overlap's room for its rollback copies: half of what the plans of the ranks on this machine leave
  // of check_fits' 90% of RAM, shared between them, the least over ranks (a collective).
  std::uint64_t overlap_room();
  // The optimizer overlapped with backward where the config asks for it (placement's overlap_asked and
  // plan_overlap, over the chunks' routes and overlap_room()): the routes and the memory plan updated, or
  // a warning saying why not.
  void choose_overlap();

  // ---- the step (engine_step.cpp) ----
  // step() in the order of Note [The optimizer step]: the gradients and the overlap's work settled, the
  // norm, whether the step applies (the loss scaler, or a finite norm), the update (apply_update: the
  // early updates kept or undone, the rest made or deferred, what follows the step), then the result made
  // from the step's losses and the bookkeeping reset (close_step).
  StepResult step();
  void settle_for_step();
  bool step_applies(bool finite);
  void apply_update(const GradScale& gs, double lr);
  void close_step(StepResult& r);
  // Ends the open pass without recording it (a forward that failed or whose backward will not run).
  void abandon_pass();
  // The model's backward returns with its ops still running (Note [Device work in stream order]); the next
  // forward or step() waits for them first, counting the wait as backward's time (StepTimes).
  void settle_backward();
  // Note [Loss weighting]: the step's counted targets and Σ counted × loss over every rank (a collective at
  // several ranks), the least and most counted of a micro-batch, and whether every backward was weighed by
  // the step's count.
  struct StepCounts {
    double counted_loss_sum = 0;
    std::int64_t counted = 0, least = 0, most = 0;
    bool weighed_by_count = false;
  };
  StepCounts step_counts();

  // ---- checkpoints (engine_checkpoint.cpp) ----
  // The adapters' base as Engine::set_base named it (null: none), and whether a checkpoint writes chunk
  // `s`'s working params (not those of a frozen chunk of a named base).
  nlohmann::json base_identity;
  // An NF4 base's chunks never are (Note [NF4 base] in model/nf4_chunk.h): their base is always named.
  bool keeps_params(const ChunkSlot& s) const {
    return (base_identity.is_null() && !s.nf4) || s.route.trains;
  }
  std::string save(const std::string& dir, const nlohmann::json& client_state, const model::DataLoader* data,
                   const std::string& tag);
  nlohmann::json load(const std::string& dir, const std::string& tag, model::DataLoader* data);
  // Warns when the saved run's global batch or schedule differ from this config's (Note [Resuming with
  // other settings]).
  void warn_changed_settings(const std::string& path, const nlohmann::json& meta) const;
  nlohmann::json chunk_table() const;      // [{"name", "numel", "padded_numel"}] of this layout
  std::uint64_t checkpoint_bytes() const;  // Engine::checkpoint_bytes

  // The step's bookkeeping: the loss scale and the rate, the steps taken, the backwards since the last
  // step, and the times of the step in progress (the parts' waits are added at step()).
  LossScaler scaler;
  LrSchedule sched;
  std::int64_t global_step = 0, applied_steps = 0, skipped = 0;
  int micro_steps = 0;  // backwards since the last step()
  StepTimes times;
  // What the next backward is (Engine::backward): whether it ends the step's accumulation and what an
  // unclipped step would apply.
  BackwardStart backward_start() const;
  // Engine::transfer_stats: the cache's and the gradient path's counts, merged when asked.
  TransferStats transfers;

  // The model checkpoints activations (plan_memory decides, Note [Checkpointing by choice]).
  bool checkpoint_activations = true;
  // From plan_memory: the chunks that stay gathered all pass and their device bytes, and the tokens per
  // sequence the activations are planned for.
  std::uint64_t persistent_bytes = 0;
  int persistent_chunks = 0, planned_seq_len = 0;
  std::unique_ptr<Event> updated;       // the compute stream after the step's device updates
  std::unique_ptr<Event> backward_end;  // the compute stream after the last backward's ops
  // The step in progress.
  bool forward_open = false;  // Engine::forward ran; its backward has not (the pass is open)
  std::int64_t forward_tokens = 0;
  std::int64_t forward_counted = 0;  // its targets that count (>= 0)
  float forward_loss = 0;
  double loss_sum = 0;
  std::int64_t tokens = 0;
  // Note [Loss weighting] (engine_step.cpp): this rank's micro-batches since the last step —
  // Σ counted × loss, Σ counted, the least and most counted, and whether every backward was given the
  // step's count (weighed by tokens).
  double counted_loss_sum = 0;
  std::int64_t counted = 0;
  std::int64_t counted_min = INT64_MAX, counted_max = INT64_MIN;
  bool weighed_by_count = true;

  // The parts (Note [Engine parts]), each built on those before it: the cache and the gradient path pass
  // the gate (UpdateGate, below: the overlap's), the updater asks the cache for room, the overlap drives
  // the updater. The overlap last, so that its worker stops first.
  ChunkCache cache{*this, *this};
  GradientPath grads{*this, cache, *this};
  Updater updater{*this, cache};
  OptimizerOverlap overlap{*this, updater};
  // The block inputs off the device (plan_memory says whether), offered to training forwards only.
  CheckpointOffload checkpoints{*this};
  bool training_forward = false;

 private:
  // UpdateGate (engine_gate.h): the overlap's.
  void settle(int c) override { overlap.settle(c); }
  void undo(UndoAs as) override { overlap.undo(as); }
  void handed_off(const ChunkSlot& s, Stream& on, int seen, int expected) override {
    overlap.handed_off(s, on, seen, expected);
  }
  const ShardNorm* early_stats(std::size_t c) const override { return overlap.early_stats(c); }
};

}  // namespace strata::zero3
