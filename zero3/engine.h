// strata/zero3/engine.h: the ZeRO-3 offload engine — owns the model's chunks in their tiers, makes them
// resident on the device for the model (model::ChunkProvider), takes gradients off the device as each
// chunk's backward ends, and runs the optimizer step where the config puts the optimizer states.
//
// Example:
//   strata::Config cfg = strata::Config::load("configs/zero3_cpu.json");
//   auto mcfg = strata::model::ModelConfig::preset("10m");
//   strata::zero3::Engine engine(cfg, mcfg, {.backend = "host", .device_memory_cap = 1ull << 30,
//                                             .seq_len = 256});
//   auto model = strata::model::make_model(mcfg, engine.model_options());  // on the engine's device
//   strata::model::DataLoader data(file, {.batch_size = engine.micro_batch(), .seq_len = 256, ...});
//   for (int i = 0; i < 100; ++i) {
//     strata::zero3::StepResult r = engine.train_batch(*model, data);  // accumulation steps + optimizer
//     std::printf("step %lld loss %.4f\n", (long long)r.step, r.loss);
//   }
//   engine.save_checkpoint("ckpt", {{"epoch", 1}}, &data);           // ckpt/global_step100, ckpt/latest
//   strata::model::save_weights("model.safetensors", engine, strata::DType::bf16);
//
// Where each tensor of a chunk's shard lives (DESIGN.md §2), from zero_optimization:
//   working params  offload_param none: device | cpu: pinned host | nvme: NVMe (up to max_in_cpu elements
//                   cached in pinned host memory)
//   fp32 gradient   offload_optimizer none: device | cpu: pinned host | nvme: NVMe, through a pinned window
//                   (strata.nvme_gradients false: pinned host) — summed on the device across a step's
//                   micro-batches where the plan has room (MemoryPlan.device_accumulators)
//   fp32 master, optimizer states   offload_optimizer none: device | cpu: pinned host | nvme: NVMe
// The working dtype is bf16 (bf16.enabled), fp16 (fp16.enabled) or fp32 (neither).
//
// Note [Device work in stream order]: the engine owns three streams of the device — compute (the model's
// ops, through the compute interface kernels/ops.h, and gradient adds into device-home shards), gather
// and gradients — and orders them by events, never by synchronising the device in the steady state. A
// gather is one cast on the gather stream from the working params (device or pinned memory; an NVMe home
// is read into pinned memory first) into the chunk's gathered block, in the ops' activation dtype; acquire
// makes the compute stream wait for its `ready` event (the host waits only for a gather from NVMe, whose
// read it must see land). release records the compute stream's last use, and the gathered block is freed
// after it. A gradient buffer is zeroed on the compute stream; release_grads either adds it into a
// device-home shard on the compute stream or has the gradient stream wait for the compute stream and take
// it: into the chunk's device accumulator when the plan gave it one (crossing to host memory once a step),
// else off the device (into pinned staging, then a host add, when the shard already holds gradients). The
// model's backward returns without waiting for its ops (ChunkProvider::orders_grads_by_stream); the host
// waits where it reads: the forward's loss, and step(). The
// device memory cap counts everything on the device: state, gathered chunks, gradient buffers and the
// model's activations (MemoryPlan; docs/train.md, "Device memory"). State at home on the device is still
// initialised and stepped through its address, so with it the engine needs a host-addressable device.
//
// Note [Same losses in every placement]: the arithmetic never depends on where a tensor lives. Every
// placement initialises the same fp32 master and rounds it to the working dtype the same way; gradients
// reach their fp32 shard through the same copy-or-add; the global norm is summed chunk by chunk in double;
// the optimizer is cpu_optim over whole chunks (results independent of the split into calls and threads);
// and the new working params are cpu_optim's rounding of the new master. So on the host backend the same
// seed gives bit-identical losses for every offload_param × offload_optimizer combination (a test checks
// all nine).
//
// Threads: acquire/release/step and the rest are called from one training thread. The engine's copy
// streams and the tier manager's movers run alongside it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "comm/comm.h"
#include "config/config.h"
#include "core/device.h"
#include "kernels/ops.h"
#include "model/chunk.h"
#include "model/config.h"
#include "model/data_loader.h"
#include "model/trainable.h"
#include "prefetch/prefetch.h"
#include "tiering/manager.h"
#include "zero3/placement.h"
#include "zero3/step_time.h"

namespace strata::zero3 {

// What tests set to reach the engine's paths without the hardware or the failure they need (a device the
// CPU cannot address, another workspace, a thread on the wrong device, an overflow, other measured rates).
// A run leaves them at their defaults: strata train and strata.initialize never set them.
struct EngineTestHooks {
  // Treat the device's memory as not host-addressable even where it is (the host backend): model state at
  // home on the device is then initialised, reduced, updated and checkpointed by stream work — copies and
  // the compute interface's ops, the device optimizer among them — exactly as on cuda. For tests of that
  // path without a GPU; a device whose memory the CPU cannot address always takes it.
  bool device_state_by_ops = false;
  // The compute interface's matrix-product workspace (kernels::OpsOptions::workspace_bytes): no value,
  // the implementation's own (cuda: cuBLASLt's 32 MiB; the CPU: the process's stand-in, 0 in the product
  // and cuda's size in the engine and model tests, Note [Workspace stand-in] in kernels/workspace_standin.h).
  std::optional<std::size_t> ops_workspace_bytes = std::nullopt;
  // The host backend refuses a device call from a thread not bound to the device (core/device.h,
  // Note [thread device]; DeviceOptions::check_thread_device), so that a thread of the engine's that
  // would touch another rank's GPU on cuda is found without one. Use a strata.device other than 0.
  bool check_thread_device = false;
  // The host memory the plan weighs against (0: the machine's), so that a test can make pinned memory too
  // small for the block inputs (Note [Checkpoints off the device]).
  std::uint64_t host_memory = 0;
  // Called on the training thread with chunk `chunk`'s gradient buffer (numel fp32, device
  // memory the CPU addresses) once the model's ops have written it and before it is handed to the shard —
  // to put an overflow into the backward that ends a step. Null: not called.
  std::function<void(int chunk, float* grads, std::size_t numel)> gradient_hook = nullptr;
  // offload_optimizer.ratio "auto" passes this rank's measured rates (elements a second of
  // the CPU optimizer and of the device optimizer) through it before choosing, so that a test can give
  // ranks different measurements. Null: not called.
  std::function<void(double& cpu_rate, double& device_rate)> measured_rates = nullptr;
  // The step-time model's rates (zero3/step_time.h) in place of measuring this machine: a placement
  // "auto" or a prediction then does not depend on the machine the test runs on.
  std::optional<MachineRates> machine_rates = std::nullopt;
};

struct EngineOptions {
  // Command-line overrides of strata.backend ("auto", "host", "cuda"; "" keeps the config's) and of
  // strata.device_memory_cap (bytes; 0 keeps the config's).
  std::string backend;
  std::uint64_t device_memory_cap = 0;
  // The tokens per sequence the model will run at (0: the model's max_seq_len) and whether it checkpoints
  // activations: the device plan reserves the activations of a micro-batch of that shape (what the
  // model's Architecture::activation_bytes says for the engine's ops). No value:
  // strata.checkpoint_activations decides ("auto": on only when the activations without checkpointing
  // would not fit the device).
  int seq_len = 0;
  std::optional<bool> checkpoint_activations = std::nullopt;
  // Measure this machine (zero3/machine.h) and predict the step of the plan (zero3/step_time.h):
  // Engine::predicted_step. Offload devices "auto" measure and predict whatever this says.
  bool predict_step = false;
  // The training rows pack documents kept apart (model/packed_docs.h: the model's forwards get positions):
  // the plan counts the attention buffers of the path that keeps them apart (on cuda, kernels/cuda's own
  // kernel: Note [attention paths] in kernels/cuda/ops.cpp).
  bool documents = false;
  // The ranks to train over (not owned; the engine dup()s it for its streams). Null: the launcher's
  // (comm::make_communicator: MPI or NCCL under mpirun, else a single rank). Its world size must be the
  // config's world_size.
  comm::Communicator* communicator = nullptr;
  // The initial parameters, chunk by chunk: fills `out` with the full fp32 parameters of `chunk` (the
  // engine's layout of it: padded_numel floats, zero-filled, tensors at its offsets) in place of the seeded
  // random initialisation — e.g. model::WeightsSource::read_chunk for `strata train --init-from`. Called
  // once per chunk in chunk order on every rank; each rank keeps its shard. Null: the model's
  // Architecture::init_chunk with strata.seed (model/architecture.h).
  std::function<void(const model::ChunkLayout& chunk, float* out)> init_params = nullptr;
  // Chunks whose parameters do not train (the base a model's adapters train beside): each keeps only its
  // working copy, in offload_param's tier — no gradient buffer, fp32 master, gradient shard, optimizer
  // state, reduction or update (UpdateRoute::trains false, zero3/placement.h). The model computes no
  // gradient of their parameters (model::ChunkProvider::trains). Checkpoints hold their working params.
  std::vector<int> frozen_chunks = {};
  EngineTestHooks testing = {};
};

// Seconds of one optimizer step (its accumulation micro-steps included). `wait` is the part of the
// others spent blocked on transfers while the compute stream had nothing running: acquires waiting for
// gathers, the optimizer waiting for NVMe reads and writes, gradients still being copied off the device.
// On the host backend a block that only waited for queued computation counts nothing (the stream's
// busy_seconds); on cuda, which does not measure that, it is the blocked time.
struct StepTimes {
  double forward = 0, backward = 0, optimizer = 0, wait = 0, total = 0;
};

struct StepResult {
  std::int64_t step = 0;  // optimizer steps taken so far, skipped ones included (DeepSpeed's global_steps)
  // The step's loss over every rank's micro-batches, weighed as strata.loss_weighting says (Note [Loss
  // weighting] in engine_step.cpp): the mean over every counted target, or the mean of the micro-batches'
  // means.
  double loss = 0;
  bool applied = true;       // false: skipped (fp16 overflow, or non-finite gradients)
  double grad_norm = 0;      // global L2 norm of the unscaled gradients
  double lr = 0;             // the rate this step used
  double loss_scale = 1;     // the scale its gradients were computed with
  std::int64_t tokens = 0;   // the micro-batches' targets, every rank
  std::int64_t counted = 0;  // of those, the ones that count (a target below 0 does not), every rank
  StepTimes times;
};

// The engine's own transfers (the tier manager counts its moves separately, tiers().snapshot().moves).
// COUNT / SUM since construction.
struct TransferStats {
  std::uint64_t gathers = 0;       // COUNT of chunks made resident on the device
  std::uint64_t gather_bytes = 0;  // SUM of working-param bytes read for them (the host-to-device traffic)
  // COUNT of acquires whose gather the training thread waited for on the host: only gathers from an NVMe
  // home (the host must see the read land); the others the compute stream waits for (Note [Gather]).
  std::uint64_t gather_host_waits = 0;
  std::uint64_t grad_handoffs = 0;  // COUNT of gradient buffers handed to their fp32 shard
  std::uint64_t grad_bytes = 0;     // SUM of their (shard) bytes
  // COUNT and SUM of fp32 gradient shards copied off the device into host memory: one a hand-off, or one
  // a step for a chunk the plan lets accumulate on the device (Note [Gradients off the device]).
  std::uint64_t grad_offloads = 0;
  std::uint64_t grad_offload_bytes = 0;
  // COUNT and SUM of the gradient reductions across ranks (reduce-scatters) and the bytes each sent in:
  // one a hand-off, or one a step for a stage-1 chunk summed locally (Note [Stage 1 accumulates locally]).
  std::uint64_t grad_reductions = 0;
  std::uint64_t grad_reduction_bytes = 0;
  // COUNT and SUM of fp32 gradient shards written to NVMe (gradients through NVMe: one a crossing to the
  // host), and read back to accumulate into (a hand-off to a shard that already holds gradients this step);
  // the swap pipeline's reads of them with the optimizer states are not counted here (Note [Gradients
  // through NVMe] in zero3/engine_grads.cpp).
  std::uint64_t grad_nvme_writes = 0;
  std::uint64_t grad_nvme_write_bytes = 0;
  std::uint64_t grad_nvme_reads = 0;
  std::uint64_t grad_nvme_read_bytes = 0;
};

// Who stepped the chunks after backward: COUNT of chunk updates since construction, by the optimizer that
// made them (those made during backward, or left to the overlap's worker, are OverlapStats').
struct UpdateStats {
  std::uint64_t cpu_optimizer = 0;     // the CPU optimizer (pinned or NVMe-swapped state)
  std::uint64_t device_optimizer = 0;  // the compute interface's AdamW, on the device
  // The host backend's device optimizer on the model's cpus: the sub-groups offload_optimizer.ratio keeps
  // on the device, and the share the model's idle cpus take (Note [The optimizer's tail]).
  std::uint64_t model_cpus = 0;
};

// The optimizer overlapped with backward (Note [Optimizer overlap] in zero3/engine_overlap.cpp). COUNT /
// SUM since construction.
struct OverlapStats {
  std::uint64_t steps = 0;      // COUNT of steps that kept updates made during backward
  std::uint64_t updates = 0;    // COUNT of chunk updates made during backward (kept or undone)
  std::uint64_t rollbacks = 0;  // COUNT of steps whose updates made during backward were undone and
                                // redone (or skipped): clipping fired, an overflow, a non-finite norm
  std::uint64_t waited = 0;     // COUNT of steps not updated early because the step before clipped
  std::uint64_t cancelled = 0;  // COUNT of times such updates were undone because no step followed
                                // (another forward, a checkpoint, a failed backward)
  double rollback_seconds = 0;  // SUM of the time spent undoing them
  // COUNT of chunk updates left to the worker by step() (those not made during backward), finished while
  // the next forward runs (each chunk before its next gather): Note [Optimizer overlap].
  std::uint64_t deferred = 0;
};

// The process's compute threads for a run (call before constructing the Engine): strata.threads, where 0
// means the machine's cores shared among the `local_ranks` ranks on it (as DeepSpeed's launcher sets
// OMP_NUM_THREADS = cores / local ranks), written back into cfg.strata.threads when it splits them; the
// matrix products' BLAS pool is sized to it (the CPU optimizer reads cfg.strata.threads). Returns the count.
// `strata train` and the Python binding both call it, so that both run the same arithmetic.
int configure_threads(Config& cfg, int local_ranks);

class Engine final : public model::ChunkProvider {
 public:
  // Opens the device (backend and cap from cfg.strata unless `opts` overrides them), the NVMe store when
  // an offload targets nvme, and the tier manager; registers and initialises every chunk from
  // cfg.strata.seed. Everything a bad config can get wrong fails here, before training: ConfigError
  // (unsupported combination, buffer sizes), OutOfMemory naming the offload settings (state and working
  // set do not fit the device, or the host), IoError (nvme_path).
  Engine(const Config& cfg, const model::ModelConfig& mcfg, EngineOptions opts = {});
  ~Engine() override;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // ---- model::ChunkProvider ----
  const model::ModelLayout& layout() const override;
  model::ChunkView acquire(int id) override;
  void release(int id) override;
  float* acquire_grads(int id) override;
  void release_grads(int id) override;
  // The working params (what the model computes with), widened to fp32 from their home tier.
  void read_params(int id, float* out) override;
  // Gradient hand-offs wait for the model's ops on the device's streams (Note [Device work in stream
  // order]): the model's backward does not wait for its stream.
  bool orders_grads_by_stream() const override { return true; }
  bool trains(int id) const override;
  // A training forward's (Engine::forward's) store for the block inputs, where the plan keeps them off
  // the device (Note [Checkpoints off the device] in zero3/engine_checkpoints.h); null otherwise.
  model::CheckpointStore* checkpoint_store() override;

  // ---- training ----
  // One micro-batch: forward and backward, weighed as backward's `step_counted` says. Returns the loss.
  float forward_backward(model::TrainableModel& model, const model::Batch& batch,
                         std::optional<std::int64_t> step_counted = std::nullopt);
  // The same micro-batch in two halves, for a caller that holds the loss in between (the Python
  // binding's `loss = engine(ids)` / `engine.backward(loss)`): forward opens the pass and returns the
  // loss of inputs/targets (B, T) int32; backward adds its gradients and closes the pass. Together they
  // do exactly what forward_backward does. A forward whose backward will not run is ended by
  // abandon_forward(): its loss does not count, the prefetch trace is kept, and no gradient is touched.
  // forward while one is pending, and backward without one, are programming errors (strata::Error).
  // The loss is the mean over the targets that count (those >= 0; n of them). backward weighs it (Note
  // [Loss weighting] in engine_step.cpp): given `step_counted` = N, the targets that count in the whole
  // optimizer step — every micro-batch, every rank; transformers' num_items_in_batch — its gradients are
  // those of (the sum of its targets' losses) / N, so that a step's gradients are the mean over all N; an
  // n of 0 adds nothing. Without it, those of the mean / (accumulation steps x world): the mean of the
  // micro-batches' means. The two agree bit for bit when every micro-batch counts N / (accumulation steps x
  // world). ConfigError for a step_counted below n (nothing is changed; the forward stays pending).
  // positions (B, T), optional: packed documents' position_ids (TrainableModel::forward); forward_backward
  // passes a batch's.
  float forward(model::TrainableModel& model, const std::int32_t* inputs, const std::int32_t* targets, int B,
                int T, const std::int32_t* positions = nullptr);
  void backward(model::TrainableModel& model, std::optional<std::int64_t> step_counted = std::nullopt);
  void abandon_forward();
  bool forward_pending() const;
  // Micro-batches whose backward has run since the last step() (forward_backward or backward).
  int pending_micro_steps() const;
  // The optimizer step over the gradients accumulated since the last one.
  StepResult step();
  // gradient_accumulation_steps micro-batches from `data`, then step(). With strata.loss_weighting
  // "tokens" it reads them all first, sums their counted targets over every rank (a collective) and passes
  // that to each backward; with "micro_batches", none.
  StepResult train_batch(model::TrainableModel& model, model::DataLoader& data);
  // The compute interface the model must run on (its device memory counts against the cap), and the
  // ModelOptions that say so: model::make_model(mcfg, engine.model_options()) (model/make_model.h).
  kernels::Ops& ops();
  model::ModelOptions model_options();
  // For a model driven by its caller rather than through TrainableModel: its acquires between begin_pass and
  // end_pass form one pass (the unit the prefetcher records and replays). forward brackets its pass this way.
  void begin_pass();
  void end_pass();

  // ---- checkpoints (DESIGN.md §6); call between steps ----
  // Writes DIR/TAG (default global_step<N>) and points DIR/latest at it: working params, fp32 master and
  // optimizer states wherever they live (NVMe included), step counters, loss scale, schedule, the data
  // position of `data` (if given), the seed and `client_state`. Returns DIR/TAG.
  std::string save_checkpoint(const std::string& dir, const nlohmann::json& client_state = {},
                              const model::DataLoader* data = nullptr, const std::string& tag = "");
  // Loads DIR/TAG (default: DIR/latest), verifying every checksum, into the tiers of this engine's config
  // (which may differ from the one that saved it: offload targets are free to change). Moves `data` (if
  // given) to the saved position. Returns the client_state. ConfigError when the model, working dtype or
  // optimizer differ; IoError on damage (the engine's state is then undefined: construct a new one).
  nlohmann::json load_checkpoint(const std::string& dir, const std::string& tag = "",
                                 model::DataLoader* data = nullptr);

  // ---- state ----
  std::int64_t global_step() const;
  std::int64_t skipped_steps() const;
  double loss_scale() const;
  double lr() const;
  int micro_batch() const;
  int accumulation_steps() const;
  // The ranks this engine trains over (world size 1: a single rank). Collective calls (step(),
  // save_checkpoint, load_checkpoint, read_params) are made by every rank in the same order.
  comm::Communicator& communicator();
  const Config& config() const;
  const MemoryPlan& plan() const;
  // The step the step-time model predicts for the plan in force (zero3/step_time.h), the rates it took
  // and, where offload devices were "auto", the placements it chose from (`chosen`: the index taken);
  // step 0 and no placements when nothing was predicted (EngineOptions.predict_step).
  const StepPrediction& predicted_step() const;
  const MachineRates& machine_rates() const;
  const std::vector<PlacementOption>& placements() const;
  int chosen_placement() const;
  // Per chunk, how it is updated (Note [Update routes] in placement.cpp): describe(update_routes()) is
  // what strata train prints with the plan.
  std::vector<UpdateRoute> update_routes() const;
  // Bytes this rank writes for one checkpoint (its working params, master and optimizer states, each
  // 4096-aligned, plus the header and table): what save_checkpoint checks the file system has free.
  std::uint64_t checkpoint_bytes() const;
  const prefetch::PrefetchStats& prefetch_stats() const;
  const TransferStats& transfer_stats() const;
  // The NVMe I/O of the swap files (bytes, busy time) since the engine started; zero without NVMe.
  nvme::IoStats nvme_stats() const;
  const OverlapStats& overlap_stats() const;
  const UpdateStats& update_stats() const;
  // The block inputs off the device (Note [Checkpoints off the device] in zero3/engine_checkpoints.h):
  // copies out in forward and back in backward since the engine started.
  struct CheckpointMoves {
    std::uint64_t out = 0, back = 0;
  };
  CheckpointMoves checkpoint_moves() const;
  tiering::TierManager& tiers();
  Device& device();
  // The fp32 master parameters of this rank's shard of chunk `id`, copied out wherever they live; a frozen
  // chunk's working params, widened (it has no master).
  std::vector<float> master_params(int id);
  // Chunk `id`'s fp32 master parameters, whole (padded_numel floats), gathered from every rank's shard; a
  // frozen chunk's working params, widened. Collective: every rank calls it for the same chunk.
  void read_masters(int id, float* out);
  // Names the frozen base that LoRA adapters train over: {"path": ..., "digest": ...} (session::build sets
  // it from the weights it read). Checkpoints then hold the adapters and their state, not the base's
  // weights, and name the base; loading one over another digest is refused by name (Note [The adapters'
  // base in checkpoints] in engine_checkpoint.cpp).
  void set_base(nlohmann::json identity);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Writes the engine's working params as a model transformers loads, in bf16: `path` ending in
// .safetensors is one file (model::save_weights); any other path a Hugging Face directory
// (model::save_pretrained, the tokenizer files copied from `source_dir` when given). Rank 0 writes; every
// rank calls it, as the reads are collective (read_params). Returns true when the path is one file.
bool export_model(Engine& engine, const std::string& path, const std::string& source_dir = "");

}  // namespace strata::zero3
