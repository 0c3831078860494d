// Placement: where each tensor of a shard lives for an offload config, and how many bytes each tier
// needs for a model — the memory plan. One computation, used by the engine (its up-front checks and the
// budgets it opens the tiers with) and by `memprof estimate`.
//
//   zero3::PlanInput in = zero3::plan_input(cfg, layout, world, rank, activation_dtype);
//   in.activations = model::activation_bytes(...);  // what the model allocates beside
//   in.device_capacity = cap;
//   zero3::Plan p = zero3::plan_memory(in, cfg);  // p.memory: bytes per tier (docs/train.md)
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "config/config.h"
#include "core/dtype.h"
#include "cpu_optim/cpu_optim.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "model/layout.h"
#include "tiering/manager.h"

namespace strata::zero3 {

// The tier an offload setting names: none -> device, cpu -> pinned host memory, nvme -> NVMe.
tiering::Tier home_of(OffloadDevice d);
// The offload setting whose home is `home` (home_of's inverse).
OffloadDevice offload_of(tiering::Tier home);
// The config's word for an offload setting, and for the tier it names: "none", "cpu", "nvme".
const char* offload_name(OffloadDevice d);
const char* offload_name(tiering::Tier home);

// The homes of a shard's five tensors (DESIGN.md §2): the working params where offload_param says; the
// fp32 master and optimizer states where offload_optimizer says; the fp32 gradient shard follows the
// optimizer — on the device without optimizer offload, in pinned host memory with cpu, on NVMe with nvme
// (written through a pinned window as it is final, read back with the states by the swap pipeline;
// strata.nvme_gradients false keeps it in pinned memory).
tiering::ShardHomes shard_homes(const Config& cfg);

// Gradient shards on their way to NVMe at once (pinned blocks of the tier manager's pool, each a shard):
// one being filled while the one before it is written (Note [Gradients through NVMe] in
// zero3/engine_grads.cpp).
inline constexpr std::size_t kNvmeGradWindow = 2;

// The homes of a chunk whose sub-group offload_optimizer.ratio keeps on the device: master, optimizer
// states and the gradient accumulator there, the working params where `offloaded` (shard_homes) says.
tiering::ShardHomes device_optimizer_homes(const tiering::ShardHomes& offloaded);

// How many of `groups` optimizer sub-groups keep their state on the device at offload ratio `ratio`
// (DeepSpeed's partial offload: sub-group i is offloaded when i >= (1 - ratio) * groups, so the first ones
// stay). The product is rounded down after a relative 1e-9, so that 0.9 of 10 keeps 1 where the binary
// fraction alone would keep 0.
int device_optimizer_groups(double ratio, int groups);

// Whether offload_optimizer.ratio may keep sub-groups on the device: the optimizer offloaded at stage 3 with
// a ratio below 1 or "auto".
bool partial_offload(const ZeroConfig& z);

// Bytes of model state per tier, from the config (what the engine registers), and the device working set.
struct MemoryPlan {
  std::uint64_t device_state = 0, pinned_state = 0, nvme_state = 0;
  std::uint64_t nvme_params = 0;  // of nvme_state: the working params (the rest: master and optimizer states)
  // Device bytes (allocator blocks) a step needs besides the state: the most the model holds at once (a
  // chunk's gathered copy and its gradient buffer; with tied embeddings the head's and the embedding's
  // together). docs/train.md, "Device memory".
  std::uint64_t device_working_set = 0;
  // What is left of the device for the chunk cache (released chunks kept for reuse, persistent chunks,
  // prefetches in flight): capacity - device_state - device_working_set - device_activations. The step
  // never holds more.
  std::uint64_t device_cache = 0;
  // The model's activations and scratch for one micro-batch of EngineOptions.seq_len tokens, allocated by
  // the model from the device beside the tier manager's pool (whose budget is capacity - this).
  std::uint64_t device_activations = 0;
  // Whether the model checkpoints activations (EngineOptions / strata.checkpoint_activations), and the
  // activation bytes of each mode, so that the plan shows what the other would take.
  bool checkpoint_activations = true;
  std::uint64_t device_activations_checkpointed = 0, device_activations_all = 0;
  // Note [Checkpoints off the device] (zero3/engine_checkpoints.h): whether the checkpointed block inputs
  // live in pinned host memory (activation_checkpointing.cpu_checkpointing), what device_activations
  // counts for the ones on the device at once (in the tier manager's pool, not beside it), their pinned
  // bytes (in pinned_budget), and the activations a micro-batch would take with the other choice.
  bool activation_offload = false;
  std::uint64_t device_checkpoint_window = 0, pinned_activations = 0, device_activations_other_offload = 0;
  std::uint64_t nvme_activations = 0;  // the block inputs on NVMe (pinned_activations: those on their way)
  std::uint64_t pinned_staging = 0;    // NVMe swap buffers (params, optimizer sub-groups), gradient staging
  std::uint64_t pinned_budget = 0;     // what the tier manager's pinned pool may take
  // pinned_staging's buffers in the pool, by the setting that sizes each (Note [Host memory bounded by
  // buffers]): parameter reads (offload_param.buffer_count chunks), the parameter cache (max_in_cpu), the
  // optimizer's sub-group window with the new working params (offload_optimizer.buffer_count,
  // sub_group_size), the gradient window (kNvmeGradWindow shards and their staging). buffers_only: the
  // last two share one room (the larger counts).
  std::uint64_t pinned_reads = 0, pinned_cache = 0, pinned_optimizer = 0, pinned_grad_window = 0;
  bool buffers_only = false;
  // Working-param elements whose pinned copies are kept as a cache after a read from NVMe: min(max_in_cpu,
  // the params); 0 when pinned memory holds buffers only (Note [Host memory bounded by buffers]).
  std::uint64_t param_cache = 0;
  // The NVMe swap file's capacity: the state plus room for the extents' alignment and reuse
  // (nvme_state / 16 + 64 MiB); what the free-space check at start-up asks of nvme_path.
  std::uint64_t nvme_budget = 0;
  // The optimizer overlapped with backward (Note [Optimizer overlap] in zero3/engine_overlap.cpp; filled
  // by the engine, 0 elsewhere): the sub-groups updated during backward, and the host memory (pageable,
  // not the pinned pool) holding their rollback copies — master, optimizer states and working params.
  int overlap_groups = 0, optimizer_groups = 0;
  // offload_optimizer.ratio: the first `device_optimizer_groups` sub-groups keep master, states and
  // gradients on the device (in device_state) and are stepped by the device optimizer; `offload_ratio` is
  // the fraction offloaded, 1 - device_optimizer_groups / optimizer_groups (1 without optimizer offload).
  int device_optimizer_groups = 0;
  double offload_ratio = 1.0;
  std::uint64_t overlap_host = 0;
  // The compute interface's own device memory (kernels/ops.h, Note [Ops device memory]): the matrix
  // products' library workspace (cuda: cuBLASLt's, 32 MiB) and the ops' scratch, sized for the model's
  // shapes. The device holds it beside the pool, as it does the activations.
  std::uint64_t device_ops = 0;
  // Gradients summed on the device across a step's micro-batches (Note [Gradients off the device] in
  // zero3/engine_grads.cpp): with gradient_accumulation_steps > 1 and the fp32 gradient shards in host
  // memory, the chunks (in order) whose shard-sized fp32 accumulator fits the room above device_need(),
  // keeping room for two of the largest gathered chunks in the cache. Their gradients cross to the host
  // once per step instead of once per micro-batch. Taken from what would be the cache.
  int device_accumulators = 0;
  std::uint64_t device_accumulator_bytes = 0;
  // Device memory kept outside the capacity for what allocates beside the runtime (cuda: the CUDA
  // libraries' own allocations; the device's caps().reserved, Note [cuda device capacity]); 0 on the host
  // backend. Shown, not part of device_need().
  std::uint64_t device_headroom = 0;
  // How long a sequence fits (longest_sequence): the most tokens a row of the configured micro-batch may
  // have with the plan still inside the device (0: not even one; filled by the engine and strata config),
  // and the activation bytes a token at the planned sequence length (device_activations / (B x T)).
  std::int64_t longest_seq_len = 0;
  std::uint64_t activation_bytes_per_token = 0;
  std::uint64_t total_state() const { return device_state + pinned_state + nvme_state; }
  // The smallest device capacity the step fits in.
  std::uint64_t device_need() const {
    return device_state + device_working_set + device_activations + device_ops;
  }
};

// Host memory the plan takes: pinned state, staging and block inputs, and on the host backend (whose
// device is host memory) the device's need up to its `device_capacity` too.
inline std::uint64_t host_need(const MemoryPlan& m, bool host_backend, std::uint64_t device_capacity) {
  return m.pinned_state + m.pinned_staging + m.pinned_activations +
         (host_backend ? std::min(device_capacity, m.device_need()) : 0);
}

// The plan as one document, every field by its name above plus device_need: what strata.initialize's
// engine.memory_plan gives (with the update routes beside it).
nlohmann::json to_json(const MemoryPlan& p);
// The plan in words, as strata train prints it before the first step: a "device plan: ..." line and a
// "host plan: ..." line (docs/train.md, "Device memory"). each_rank: the figures are each rank's;
// grad_home: where the fp32 gradient shards live.
std::string describe(const MemoryPlan& p, tiering::Tier grad_home, bool each_rank);

// Chunks are padded to a multiple of this many elements at `world` ranks: 64 for one rank; for N, shards
// of whole gradient-norm blocks (Note [Ranks]).
inline std::size_t chunk_multiple(int world) {
  return world == 1 ? 64 : std::size_t(world) * cpu_optim::kGradStatsBlock;
}
// Every tensor of a chunk starts at a multiple of this many elements (16 fp32: 64 bytes), in the engine's
// layouts and the checkpoints'.
inline constexpr std::size_t kTensorAlign = 16;
// The layout options of the engine's chunks at `world` ranks (and of a checkpoint saved at `world`).
inline model::LayoutOptions layout_options(int world) {
  return {.tensor_align = kTensorAlign, .chunk_multiple = chunk_multiple(world)};
}

// What the plan decides for the whole engine from the config and the world size, computed here once: the
// plan's input and the engine copy it (Note [Update routes]).
struct EngineFacts {
  // Stages 1 and 2 at several ranks: every rank keeps the whole chunk's working params.
  bool replicated = false;
  // Stage 1 at several ranks: the device accumulators hold whole chunks, summed locally over the
  // micro-batches and reduced once a step (Note [Stage 1 accumulates locally]).
  bool local_accumulation = false;
  DType working = DType::bf16;  // the working params' dtype: bf16, fp16 or fp32
  int optimizer_states = 2;     // state tensors per parameter beside the master (cpu_optim::Rule)
};
EngineFacts engine_facts(const Config& cfg, int world);

// One chunk as the plan sees it: gathered elements (padded), this rank's shard, and the elements of its
// working-param tensor (the whole chunk when stages 1 and 2 replicate params over N ranks).
struct PlannedChunk {
  std::uint64_t numel = 0;
  comm::ShardRange shard;
  std::uint64_t param_numel = 0;
  // Where this rank's slice starts in its working-param tensor: shard.offset where the tensor is the
  // whole chunk (replicated), else 0.
  std::uint64_t param_offset = 0;
  bool persistent = false;        // below stage3_param_persistence_threshold
  bool device_optimizer = false;  // its sub-group keeps the optimizer on the device (offload ratio < 1)
  // Its parameters do not train (freeze_chunks): only the working copy, in offload_param's tier — no
  // gradient buffer, fp32 master, gradient shard or optimizer state, in no optimizer sub-group.
  bool frozen = false;
  // Its working copy is packed (an NF4 base, Note [NF4 base] in model/nf4_chunk.h): param_bytes bytes,
  // the whole chunk on every rank (param_numel = numel), never all-gathered.
  bool packed = false;
  std::uint64_t param_bytes = 0;
  // Its working params stay in pinned host memory although offload_param says nvme (the adapters': Note
  // [Adapters off NVMe] in placement.cpp).
  bool params_pinned = false;
};

// How a chunk is gathered, its gradients handed off and summed, its norm taken, and it is updated (Note
// [Update routes]): decided by the plan, once, and read by the engine's parts (cache, gradient path,
// updater, overlap, the step), which test no home, world size or device kind themselves.
struct UpdateRoute {
  // false: the chunk is frozen (PlannedChunk.frozen) — gathered as any other, but it has no gradients and
  // no update; the fields below about gradients, the norm and the step do not apply.
  bool trains = true;
  // The working params' home: a gather reads it (NVMe through a pinned copy), the update writes it.
  tiering::Tier param_home = tiering::Tier::pinned;
  // Stage 3 at N ranks: a gather widens this rank's shard at its place in the chunk and an all-gather on
  // the gather stream brings the others' (params partitioned). Without it the rank holds the chunk's
  // working params whole (one rank, or stages 1 and 2: replicated).
  bool all_gather = false;
  // N ranks: every decision that orders a collective is the same on every rank (Note [Ranks]), so a gather
  // in flight counts as in flight until an acquire waits for it, whatever the stream's progress.
  bool lockstep = false;
  // The fp32 gradient shard's home: device, pinned host memory, or NVMe (grads_nvme).
  tiering::Tier grad_shard = tiering::Tier::pinned;
  // The stream a gradient hand-off ends on: the compute stream where it is added into a device shard at
  // one rank (after the model's ops), else the gradient stream (copies off the device, reductions).
  enum class Handoff : std::uint8_t { compute_stream, grad_stream };
  Handoff handoff = Handoff::grad_stream;
  // How step()'s norm reads the chunk's gradients: by the compute interface on the device (summed over
  // the ranks' shards at N), or by the CPU optimizer's reductions over the whole shard (one rank) or per
  // block, all-gathered and added in global block order (N ranks; Note [Ranks]).
  enum class Norm : std::uint8_t { device, device_ranks, host, host_blocks };
  Norm norm = Norm::host;
  // What follows the step: the gather stream waits for the compute stream's writes of the new working
  // params (a device home reached by stream work only), and stages 1 and 2 all-gather the ranks' slices of
  // them (replicated).
  bool gathers_wait_update = false, all_gather_after_step = false;
  // Where the step's gradients of the chunk are summed over its micro-batches until the update.
  enum class Grads : std::uint8_t {
    device_shard,        // each hand-off added into the fp32 gradient shard at home on the device
    pinned_shard,        // each hand-off copied off the device and added on the host into the pinned shard
    device_accumulator,  // a shard-sized device accumulator, copied to the pinned shard once a step
    local_accumulator,   // stage 1 at N ranks: the whole chunk on the device, reduced once a step
  };
  // Who sums the ranks' gradients: nobody (one rank), a reduce-scatter at every hand-off, or one at the
  // step's final hand-off (the local accumulator's).
  enum class Reduce : std::uint8_t { none, every_handoff, once_a_step };
  // Who steps it.
  enum class Stepper : std::uint8_t {
    cpu_optimizer,  // the SIMD CPU optimizer on its cpus, over state in addressable memory
    nvme_pipeline,  // the CPU optimizer over its sub-group's state read from NVMe and written back
    device_ops,     // the compute interface's optimizer on the compute stream (device reached by streams)
    model_cpus,     // the host backend's device optimizer: the same SIMD code on the model's cpus
  };
  // Where the new working params go: written at their home, through pinned staging to a device home
  // reached by stream work only, or through a pinned copy to NVMe.
  enum class Params : std::uint8_t { home, staged, nvme };
  Grads grads = Grads::pinned_shard;
  // The step's fp32 gradient shard is on NVMe: what reaches the host (a hand-off, or a device
  // accumulator's crossing) goes through a pinned block to NVMe, and the swap pipeline reads it back with
  // the optimizer states (Note [Gradients through NVMe] in zero3/engine_grads.cpp).
  bool grads_nvme = false;
  Reduce reduce = Reduce::none;
  Stepper stepper = Stepper::cpu_optimizer;
  Params params = Params::home;
  // The optimizer overlapped with backward (Note [Optimizer overlap] in zero3/engine_overlap.cpp; set by
  // plan_overlap): updated during backward when the step is predicted unclipped (`overlap`); when not,
  // left to the overlap's worker after step() (`defer`).
  bool overlap = false, defer = false;
  // May be updated on the model's cpus, idle once backward ends (Note [The optimizer's tail] in
  // zero3/engine_update.cpp), beside the CPU optimizer.
  bool tail = false;
  bool device_optimizer() const { return stepper == Stepper::device_ops || stepper == Stepper::model_cpus; }
  bool operator==(const UpdateRoute&) const = default;
};
// "device accumulator, reduce-scatter each hand-off, CPU optimizer, params to NVMe, overlapped": a route in
// words, as strata train's plan prints it.
std::string describe(const UpdateRoute& r);
// The routes of chunks [0, n) in runs of equal ones, a line each after `indent`:
// "chunks 0-3: ...\nchunks 4-15: ...".
std::string describe(const std::vector<UpdateRoute>& routes, const std::string& indent = "");

struct PlanInput {
  std::vector<PlannedChunk> chunks;
  // Optimizer sub-groups: consecutive chunks whose shards add up to at most sub_group_size elements; a
  // chunk larger than that is a sub-group of its own.
  std::vector<std::vector<int>> groups;
  int head = -1, embedding = -1;  // tied embeddings in two chunks: both held while the head runs
  tiering::ShardHomes homes;      // of a chunk offloaded as the config says (device_optimizer: see homes_of)
  tiering::ShardHomes homes_of(const PlannedChunk& c) const {
    tiering::ShardHomes h = c.device_optimizer ? device_optimizer_homes(homes) : homes;
    if (c.params_pinned && h.param == tiering::Tier::nvme) h.param = tiering::Tier::pinned;
    return h;
  }
  // Bytes of a chunk's working-param tensor: param_numel in the working dtype, or its packed bytes.
  std::uint64_t param_bytes(const PlannedChunk& c) const {
    return c.packed ? c.param_bytes : c.param_numel * std::uint64_t(dtype_bytes(working));
  }
  int optimizer_states = 2;  // 2 for Adam/AdamW, 1 for Adagrad/Lion
  DType working = DType::bf16;
  DType activation = DType::fp32;    // the dtype chunks are gathered in (the compute interface's)
  bool device_state_by_ops = false;  // device-home state stepped by the compute interface (stats tensor)
  std::uint64_t activations = 0;     // the model's device bytes for one micro-batch
  // Note [Checkpoints off the device] (zero3/engine_checkpoints.h): with the block inputs off the device,
  // the device blocks of those in flight (inside the tier manager's pool) and their pinned bytes.
  std::uint64_t checkpoint_window = 0, checkpoint_host = 0, checkpoint_bytes = 0;
  // They go on to NVMe (the engine decides: pinned memory would not hold them); pinned memory then holds
  // kCheckpointWindow + 1 of them on their way.
  bool checkpoints_on_nvme = false;
  std::uint64_t ops = 0;  // the compute interface's device bytes (MemoryPlan.device_ops)
  std::uint64_t device_capacity = 0;
  int accumulation_steps = 1;  // gradient_accumulation_steps: > 1 lets gradients accumulate on the device
  // Stage 1 at several ranks: the accumulators hold whole chunks, summed locally over the micro-batches
  // and reduced once a step (Note [Stage 1 accumulates locally] in zero3/engine_grads.cpp).
  bool local_accumulation = false;
  int world = 1;
  // Stages 1 and 2 at several ranks: every rank keeps the whole chunk's working params.
  bool replicated = false;
  // The host backend with cores of the optimizer's own (strata.cpu_optim.cores): the model's cpus take a
  // share of the CPU optimizer's chunks after backward (UpdateRoute.tail). The engine sets it.
  bool tail_on_model_cpus = false;
  // strata.overlap_optimizer, and whether its "auto" turns the overlap on where the optimizer's state is in
  // pinned host memory: the model computes on a device, or the host backend gives the optimizer cores of
  // its own (Note [Optimizer overlap], "When"). The engine sets the second.
  StrataConfig::Overlap overlap = StrataConfig::Overlap::off;
  bool overlap_auto_here = false;
};

// Marks `chunks` frozen (PlannedChunk.frozen) and forms the optimizer sub-groups again over the chunks that
// train (plan_input's rule), keeping a numeric offload_optimizer.ratio's choice of sub-groups. ConfigError
// naming `what` (the caller's option) for a chunk that does not exist.
void freeze_chunks(PlanInput& in, const std::vector<int>& chunks, const ZeroConfig& z, const char* what);

// The adapters of `layout`'s model (model/lora.h) on `in`, for the engine and `memprof estimate` alike: the
// base's chunks frozen (freeze_chunks); with an NF4 base (LoraSpec.nf4_base) each frozen block chunk
// packed (Note [NF4 base] in model/nf4_chunk.h); with offload_param nvme the chunks that train keep their
// working params in pinned memory (Note [Adapters off NVMe]). Returns the bytes so kept (0: none). A model
// without adapters is left as it is.
std::uint64_t plan_adapters(PlanInput& in, const model::ModelLayout& layout, const ZeroConfig& z);

// Keeps the optimizer of the first `groups` sub-groups on the device (PlannedChunk.device_optimizer); 0
// offloads them all. plan_input applies a numeric offload_optimizer.ratio itself; the engine calls this
// for "auto".
void keep_optimizer_on_device(PlanInput& in, int groups);

// The input for chunks of these sizes (elements, and padded to chunk_multiple(world)) as rank `rank` of
// `world` holds them under `cfg` (homes, dtypes, sub-groups).
struct ChunkSize {
  std::uint64_t numel = 0, padded_numel = 0;
};
PlanInput plan_input(const Config& cfg, const std::vector<ChunkSize>& chunks, int world, int rank,
                     DType activation);
// The same for a model's layout (with tied embeddings in two chunks held together).
PlanInput plan_input(const Config& cfg, const model::ModelLayout& layout, bool tied_embeddings, int world,
                     int rank, DType activation);

struct Plan {
  MemoryPlan memory;
  // Per chunk: device bytes (allocator blocks) of its gathered copy and of its fp32 gradient buffer.
  std::vector<std::uint64_t> gather_block, grad_block;
  std::uint64_t largest_shard = 0;
  std::uint64_t persistent_bytes = 0;  // gathered blocks of the persistent chunks
  int persistent_chunks = 0;
  std::size_t group_window = 1;  // optimizer sub-groups whose states may be in pinned memory at once (NVMe)
  // Per chunk, how it is updated; a device accumulator (MemoryPlan.device_accumulators) is a route whose
  // gradients are summed on the device.
  std::vector<UpdateRoute> routes;
};

Plan plan_memory(const PlanInput& in, const ZeroConfig& z);

// strata.checkpoint_activations as a fixed choice (true / false), or empty for "auto".
std::optional<bool> checkpointing_asked(const StrataConfig& s);
// Note [Checkpointing by choice]: a fixed choice stands; "auto" (empty) keeps every activation where the
// plan of `in` with `activations_all` (the model's bytes without checkpointing) fits in.device_capacity,
// and checkpoints otherwise. Whether to checkpoint.
bool checkpointing_for(PlanInput in, const ZeroConfig& z, std::optional<bool> fixed,
                       std::uint64_t activations_all);

// activation_checkpointing.cpu_checkpointing as a fixed choice, or empty for "auto".
std::optional<bool> offload_asked(const ActivationCheckpointingConfig& a);

// What a micro-batch's activations take, each way (the model's Architecture gives the figures): the
// model's device bytes keeping every activation, checkpointing with the block inputs on the device, and
// checkpointing with them in a CheckpointStore; and those block inputs (count of `checkpoint_bytes`).
struct ActivationSizes {
  std::uint64_t all = 0, checkpointed = 0, offloaded = 0;
  int checkpoints = 0;
  std::uint64_t checkpoint_bytes = 0;
};
struct ActivationChoice {
  bool checkpoint = true, offload = false;
};
// The sizes of model `m` (its Architecture's) for a micro-batch of B x T tokens computed by `ops`, its rows
// packing documents kept apart where `documents` says (EngineOptions.documents).
ActivationSizes activation_sizes(const model::ModelConfig& m, int B, int T, const kernels::Ops& ops,
                                 bool documents = false);
// The plan's activation fields for choice `c` (checkpoint_activations, the other choices' bytes).
void note_activations(MemoryPlan& p, const ActivationSizes& a, ActivationChoice c);
// Block inputs on the device at once with them off it (Note [Checkpoints off the device]).
inline constexpr int kCheckpointWindow = 2;
// Sets in.activations, in.checkpoint_window and in.checkpoint_host for choice `c`.
void apply_activations(PlanInput& in, const ActivationSizes& a, ActivationChoice c);
// Note [Checkpointing by choice], then the offload: a fixed choice stands; "auto" offloads the block inputs
// where the plan with them on the device does not fit. Never offloads without checkpointing.
ActivationChoice choose_activations(PlanInput in, const ZeroConfig& z, std::optional<bool> checkpointing,
                                    std::optional<bool> offload, const ActivationSizes& a);

// The longest row (tokens, up to max_tokens) whose plan fits in.device_capacity: `sizes(T)` gives the
// activations of a micro-batch of rows of T tokens; `checkpointing` and `offload` are true / false where
// the run's choice is fixed, empty for "auto" (any way that fits, as the engine chooses). 0 when not even
// one token fits. A bisection: the activations grow with T.
std::int64_t longest_sequence(PlanInput in, const ZeroConfig& z, std::int64_t max_tokens,
                              const std::function<ActivationSizes(std::int64_t T)>& sizes,
                              std::optional<bool> checkpointing, std::optional<bool> offload);

// Bytes one optimizer step moves over the host link (host memory <-> device), as the plan's routes move
// them: every micro-batch gathers each chunk whose working copy is off the device twice (forward, then
// backward with its recompute), a packed chunk's packed bytes (Note [NF4 base] in model/nf4_chunk.h); each
// gradient hand-off copies the shard of a chunk whose fp32 gradients are summed off the device (a device
// accumulator's once a step); new working params stepped on the host reach a device home once a step. An
// upper bound on the gathers: the chunk cache may keep a chunk from forward to backward.
struct LinkBytes {
  std::uint64_t gathers = 0, gradients = 0, params = 0;
  std::uint64_t total() const { return gathers + gradients + params; }
};
LinkBytes link_bytes_per_step(const PlanInput& in, const Plan& p);

// The routes `cfg` gives before a model and a device are known (strata config): an offloaded chunk's and,
// with offload_optimizer.ratio below 1 or "auto", a chunk whose sub-group the ratio keeps on the device; on
// a device reached by stream work only (cuda: `by_ops`) or addressed by the CPU (the host backend). Device
// accumulators are shown as they are where the device has room for them.
struct ConfigRoute {
  std::string which;  // "offloaded", "kept on the device by offload_optimizer.ratio", or "every chunk"
  UpdateRoute route;
};
std::vector<ConfigRoute> config_routes(const Config& cfg, bool by_ops);

// The optimizer overlapped with backward (Note [Optimizer overlap] in zero3/engine_overlap.cpp), on the
// routes and memory plan of `in`: the chunks updated during backward are taken from the last down while
// their rollback copies (`copy_bytes(c)` each) fit `room` bytes of host memory, stopping at the first the
// device optimizer steps. Sets their routes' `overlap`, every CPU optimizer route's `defer` where the update
// is made in place, and MemoryPlan.overlap_groups / overlap_host. When no chunk can overlap, the routes
// are unchanged and `why_not` says why (for the log); `ratio_keeps_all`: because offload_optimizer.ratio
// keeps every sub-group's optimizer on the device.
struct OverlapDecision {
  int chunks = 0;
  std::string why_not;
  bool ratio_keeps_all = false;
};
OverlapDecision plan_overlap(std::vector<UpdateRoute>& routes, MemoryPlan& m, const PlanInput& in,
                             std::uint64_t room, const std::function<std::uint64_t(int chunk)>& copy_bytes);
// Whether the config asks for the overlap here (PlanInput.overlap: true, or "auto" where it pays); only
// then does the engine measure the room for its copies (a collective) and call plan_overlap.
bool overlap_asked(const PlanInput& in);
// Host bytes of one chunk's rollback copies: its master and optimizer states in fp32 and its working
// params, for a shard of `shard_numel` elements, rounded up to 64 bytes.
std::uint64_t overlap_copy_bytes(const PlanInput& in, std::uint64_t shard_numel);

}  // namespace strata::zero3
