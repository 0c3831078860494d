// The config schema: every key Strata reads, with its type, default, allowed values and meaning.
//
// This table is the single source of truth (STYLE.md item 13); the zero_optimization section is in
// config_schema_zero.cpp and the strata.lora block in config_schema_lora.cpp, each appended in its place.
// Defaults are DeepSpeed's code defaults (runtime/constants.py, runtime/zero/config.py,
// runtime/zero/offload_config.py, the fp16/bf16 and aio constants, lr_schedules.py, and the CPU
// optimizers' constructor defaults), so an existing ds_config.json means the same thing here. docs/config.md
// is generated from it; a test fails when the two drift.
//
// Note [order]: keys are resolved in table order, so a key whose "auto" or default depends on another
// (scheduler.params.warmup_max_lr on optimizer.params.lr) must come after it.
#include <iterator>
#include <map>
#include <type_traits>

#include "config/config_impl.h"
#include "config/config_schema_util.h"
#include "core/error.h"

namespace strata::config_detail {
namespace {

// ref() and STRATA_FIELD: config_schema_util.h.

using OT = OptimizerType;
using ST = SchedulerType;

bool adam_like(const Config& c) {
  return c.optimizer.type == OT::Adam || c.optimizer.type == OT::AdamW;
}
bool has_betas(const Config& c) {
  return c.optimizer.type != OT::Adagrad;
}
bool has_eps(const Config& c) {
  return c.optimizer.type != OT::Lion;
}
bool sched_any(const Config& c) {
  return c.scheduler.type != ST::none;
}
bool sched_lr(const Config& c) {
  return c.scheduler.type == ST::WarmupLR || c.scheduler.type == ST::WarmupDecayLR;
}
bool sched_total(const Config& c) {
  return c.scheduler.type == ST::WarmupDecayLR || c.scheduler.type == ST::WarmupCosineLR;
}
bool sched_cos(const Config& c) {
  return c.scheduler.type == ST::WarmupCosineLR;
}

// DeepSpeedCPUAdagrad's defaults differ from the Adam family's.
nlohmann::json lr_default(const Config& c) {
  return c.optimizer.type == OT::Adagrad ? 1e-2 : 1e-3;
}
nlohmann::json eps_default(const Config& c) {
  return c.optimizer.type == OT::Adagrad ? 1e-10 : 1e-8;
}

// Batch sizes left "auto" without an override are inferred from the other two (DeepSpeed's rules).
AutoValue batch_inferred(const AutoContext&) {
  return {nullptr, "auto→inferred"};
}
// Note [Loud auto] in config.cpp: "auto" without an override takes what Hugging Face's integration fills in
// from TrainingArguments' defaults, and says so.
AutoValue transformers_lr(const AutoContext&) {
  return {5e-5, "auto→transformers' default", "transformers' default learning_rate (override lr chooses)"};
}
AutoValue transformers_clip(const AutoContext&) {
  return {1.0, "auto→transformers' default",
          "transformers' default max_grad_norm (override grad_clip chooses)"};
}
// Hugging Face's rule: the learning-rate peak is the optimizer's learning rate.
AutoValue peak_is_lr(const AutoContext& c) {
  return {c.config.optimizer.lr, "auto→optimizer.params.lr", "the optimizer's learning rate is the peak"};
}
// The schedule's length and its warmup come from the run (RunFacts), once the batch is known.
AutoValue from_run(const AutoContext&) {
  return {nullptr, "auto→run"};
}
// Precision follows the backends: every one Strata has computes bf16.
AutoValue fp16_auto(const AutoContext&) {
  return {
      false, "auto→bf16 preferred",
      "fp16 only when asked (override fp16): bf16 needs no loss scaling and every Strata backend computes "
      "it"};
}
AutoValue bf16_auto(const AutoContext& c) {
  if (c.config.fp16.enabled) return {false, "auto→fp16 is on", "fp16.enabled is on"};
  return {true, "auto→the backend computes bf16",
          "every Strata backend computes bf16 (host: the CPU ops, with fp32 accumulation; cuda: built for "
          "sm_80 and newer); override bf16 chooses"};
}

std::vector<Option> build_options() {
  std::vector<Option> o;
  // ---- batch ----
  o.push_back({.path = "train_batch_size",
               .kind = Kind::integer,
               .def = nullptr,
               .meaning = "Samples per optimizer step over all ranks: micro batch × accumulation steps × "
                          "world size. Any two of the three batch keys determine the third.",
               .field = STRATA_FIELD(train_batch_size),
               .min = 1,
               .override_name = "train_batch",
               .auto_fallback = batch_inferred,
               .auto_note = "override train_batch, else inferred",
               .default_note = "inferred"});
  o.push_back({.path = "train_micro_batch_size_per_gpu",
               .kind = Kind::integer,
               .def = nullptr,
               .meaning = "Samples per forward/backward pass on each rank.",
               .field = STRATA_FIELD(train_micro_batch_size_per_gpu),
               .min = 1,
               .override_name = "micro_batch",
               .auto_fallback = batch_inferred,
               .auto_note = "override micro_batch, else inferred (1 if nothing determines it)",
               .default_note = "inferred"});
  o.push_back({.path = "gradient_accumulation_steps",
               .kind = Kind::integer,
               .def = nullptr,
               .meaning = "Micro batches accumulated before each optimizer step.",
               .field = STRATA_FIELD(gradient_accumulation_steps),
               .min = 1,
               .override_name = "grad_accum",
               .auto_fallback = batch_inferred,
               .auto_note = "override grad_accum, else inferred",
               .default_note = "inferred (1 if only one batch key is given)"});
  o.push_back({.path = "steps_per_print",
               .kind = Kind::integer,
               .def = 10,
               .meaning = "Log progress every this many optimizer steps.",
               .field = STRATA_FIELD(steps_per_print),
               .min = 1});
  o.push_back({.path = "wall_clock_breakdown",
               .kind = Kind::boolean,
               .def = false,
               .meaning = "Log forward/backward/step wall-clock times each print interval.",
               .field = STRATA_FIELD(wall_clock_breakdown)});
  o.push_back({.path = "memory_breakdown",
               .kind = Kind::boolean,
               .def = false,
               .meaning = "Log per-tier memory use each print interval.",
               .field = STRATA_FIELD(memory_breakdown)});
  o.push_back({.path = "gradient_clipping",
               .kind = Kind::real,
               .def = 0.0,
               .meaning = "Clip the global gradient norm to this value; 0 disables clipping.",
               .field = STRATA_FIELD(gradient_clipping),
               .min = 0,
               .override_name = "grad_clip",
               .auto_fallback = transformers_clip,
               .auto_note = "override grad_clip, else 1 (transformers' default max_grad_norm)"});

  // ---- optimizer ----
  o.push_back(
      {.path = "optimizer.type",
       .kind = Kind::choice,
       .def = "Adam",
       .meaning = "Optimizer run on the fp32 master weights (matched ignoring case, as DeepSpeed does). "
                  "Adam with adam_w_mode true (the default) decays weights like AdamW.",
       .field = STRATA_FIELD(optimizer.type),
       .choices = {"Adam", "AdamW", "Adagrad", "Lion"},
       .unsupported = {"Lamb", "OneBitAdam", "ZeroOneAdam", "OneBitLamb", "MuAdam", "MuAdamW", "MuSGD"},
       .case_insensitive = true});
  o.push_back({.path = "optimizer.params.lr",
               .kind = Kind::real,
               .def = 1e-3,
               .meaning = "Learning rate.",
               .field = STRATA_FIELD(optimizer.lr),
               .min = 0,
               .override_name = "lr",
               .auto_fallback = transformers_lr,
               .auto_note = "override lr, else 5e-05 (transformers' default learning_rate)",
               .dynamic_default = lr_default,
               .default_note = "0.001 (Adagrad: 0.01)"});
  o.push_back({.path = "optimizer.params.betas",
               .kind = Kind::real_pair,
               .def = {0.9, 0.999},
               .meaning = "Decay rates of the first and second moment estimates (Lion: update and momentum "
                          "interpolation).",
               .field = STRATA_FIELD(optimizer.betas),
               .min = 0,
               .max = 1,
               .max_exclusive = true,
               .override_name = "betas",
               .auto_note = "override betas, else the default",
               .applies = has_betas,
               .applies_note = "Adam, AdamW, Lion"});
  o.push_back({.path = "optimizer.params.eps",
               .kind = Kind::real,
               .def = 1e-8,
               .meaning = "Term added to the denominator for numerical stability.",
               .field = STRATA_FIELD(optimizer.eps),
               .min = 0,
               .override_name = "eps",
               .auto_note = "override eps, else the default",
               .dynamic_default = eps_default,
               .default_note = "1e-08 (Adagrad: 1e-10)",
               .applies = has_eps,
               .applies_note = "Adam, AdamW, Adagrad"});
  o.push_back({.path = "optimizer.params.weight_decay",
               .kind = Kind::real,
               .def = 0.0,
               .meaning = "Weight decay coefficient.",
               .field = STRATA_FIELD(optimizer.weight_decay),
               .min = 0,
               .override_name = "weight_decay",
               .auto_note = "override weight_decay, else the default"});
  o.push_back({.path = "optimizer.params.adam_w_mode",
               .kind = Kind::boolean,
               .def = true,
               .meaning = "Decoupled weight decay (AdamW); false applies weight decay as L2 in the gradient. "
                          "AdamW always decouples.",
               .field = STRATA_FIELD(optimizer.adam_w_mode),
               .applies = adam_like,
               .applies_note = "Adam, AdamW"});
  o.push_back({.path = "optimizer.params.torch_adam",
               .kind = Kind::boolean,
               .def = false,
               .meaning = "DeepSpeed: use PyTorch's Adam. Accepted; Strata has one Adam implementation.",
               .field = STRATA_FIELD(optimizer.torch_adam),
               .applies = adam_like,
               .applies_note = "Adam, AdamW"});
  o.push_back({.path = "optimizer.params.bias_correction",
               .kind = Kind::boolean,
               .def = true,
               .meaning = "Correct the moment estimates for their zero initialisation.",
               .field = STRATA_FIELD(optimizer.bias_correction),
               .applies = adam_like,
               .applies_note = "Adam, AdamW"});

  // ---- scheduler ----
  o.push_back({.path = "scheduler.type",
               .kind = Kind::choice,
               .def = "none",
               .meaning = "Learning-rate schedule; none keeps optimizer.params.lr constant.",
               .field = STRATA_FIELD(scheduler.type),
               .choices = {"none", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"},
               .unsupported = {"OneCycle", "LRRangeTest"}});
  o.push_back({.path = "scheduler.params.warmup_min_lr",
               .kind = Kind::real,
               .def = 0.0,
               .meaning = "Learning rate at the start of warmup.",
               .field = STRATA_FIELD(scheduler.warmup_min_lr),
               .min = 0,
               .override_name = "warmup_min_lr",
               .auto_note = "override warmup_min_lr, else the default",
               .applies = sched_lr,
               .applies_note = "WarmupLR, WarmupDecayLR"});
  o.push_back({.path = "scheduler.params.warmup_max_lr",
               .kind = Kind::real,
               .def = 1e-3,
               .meaning = "Learning rate at the end of warmup.",
               .field = STRATA_FIELD(scheduler.warmup_max_lr),
               .min = 0,
               .override_name = "lr",
               .auto_fallback = peak_is_lr,
               .auto_note = "override lr, else optimizer.params.lr",
               .applies = sched_lr,
               .applies_note = "WarmupLR, WarmupDecayLR"});
  o.push_back({.path = "scheduler.params.warmup_num_steps",
               .kind = Kind::integer,
               .def = 1000,
               .meaning = "Optimizer steps spent warming up.",
               .field = STRATA_FIELD(scheduler.warmup_num_steps),
               .min = 0,
               .override_name = "warmup_steps",
               .auto_fallback = from_run,
               .auto_note = "override warmup_steps, else ceil(strata.warmup_ratio × the schedule's steps): 0 "
                            "with the ratio's default, as transformers",
               .applies = sched_any,
               .applies_note = "every scheduler"});
  o.push_back({.path = "scheduler.params.warmup_type",
               .kind = Kind::choice,
               .def = "log",
               .meaning = "Shape of the warmup ramp.",
               .field = STRATA_FIELD(scheduler.warmup_type),
               .choices = {"log", "linear"},
               .applies = sched_any,
               .applies_note = "every scheduler"});
  o.push_back({.path = "scheduler.params.total_num_steps",
               .kind = Kind::integer,
               .def = nullptr,
               .meaning = "Optimizer steps in the whole run; the decay ends here.",
               .field = STRATA_FIELD(scheduler.total_num_steps),
               .min = 1,
               .override_name = "total_steps",
               .auto_fallback = from_run,
               .auto_note = "override total_steps, else the run's length (strata train: --steps, --max-steps "
                            "or --epochs)",
               .default_note = "required (strata train: the run's length)",
               .applies = sched_total,
               .applies_note = "WarmupDecayLR, WarmupCosineLR"});
  o.push_back({.path = "scheduler.params.warmup_min_ratio",
               .kind = Kind::real,
               .def = 0.0,
               .meaning = "Warmup starts at this fraction of optimizer.params.lr.",
               .field = STRATA_FIELD(scheduler.warmup_min_ratio),
               .min = 0,
               .max = 1,
               .applies = sched_cos,
               .applies_note = "WarmupCosineLR"});
  o.push_back({.path = "scheduler.params.cos_min_ratio",
               .kind = Kind::real,
               .def = 1e-4,
               .meaning = "Cosine decay ends at this fraction of optimizer.params.lr.",
               .field = STRATA_FIELD(scheduler.cos_min_ratio),
               .min = 0,
               .max = 1,
               .applies = sched_cos,
               .applies_note = "WarmupCosineLR"});
  o.push_back({.path = "scheduler.params.last_batch_iteration",
               .kind = Kind::integer,
               .def = -1,
               .meaning = "Index of the last step already taken; -1 starts the schedule fresh.",
               .field = STRATA_FIELD(scheduler.last_batch_iteration),
               .min = -1,
               .applies = sched_any,
               .applies_note = "every scheduler"});

  // ---- mixed precision ----
  o.push_back({.path = "fp16.enabled",
               .kind = Kind::boolean,
               .def = false,
               .meaning = "fp16 working weights with loss scaling (not together with bf16.enabled).",
               .field = STRATA_FIELD(fp16.enabled),
               .override_name = "fp16",
               .auto_fallback = fp16_auto,
               .auto_note = "override fp16, else false (bf16 is preferred)"});
  o.push_back({.path = "fp16.auto_cast",
               .kind = Kind::boolean,
               .def = false,
               .meaning = "Cast the model's inputs to fp16.",
               .field = STRATA_FIELD(fp16.auto_cast)});
  o.push_back({.path = "fp16.loss_scale",
               .kind = Kind::real,
               .def = 0.0,
               .meaning = "Static loss scale; 0 selects dynamic loss scaling.",
               .field = STRATA_FIELD(fp16.loss_scale),
               .min = 0});
  o.push_back({.path = "fp16.initial_scale_power",
               .kind = Kind::integer,
               .def = 16,
               .meaning = "Dynamic loss scaling starts at 2^initial_scale_power.",
               .field = STRATA_FIELD(fp16.initial_scale_power),
               .min = 0,
               .max = 64});
  o.push_back({.path = "fp16.loss_scale_window",
               .kind = Kind::integer,
               .def = 1000,
               .meaning = "Steps without overflow before the dynamic loss scale doubles.",
               .field = STRATA_FIELD(fp16.loss_scale_window),
               .min = 1});
  o.push_back({.path = "fp16.hysteresis",
               .kind = Kind::integer,
               .def = 2,
               .meaning = "Overflows tolerated before the dynamic loss scale halves.",
               .field = STRATA_FIELD(fp16.hysteresis),
               .min = 1});
  o.push_back({.path = "fp16.consecutive_hysteresis",
               .kind = Kind::boolean,
               .def = false,
               .meaning = "Refill the hysteresis count after each step without overflow.",
               .field = STRATA_FIELD(fp16.consecutive_hysteresis)});
  o.push_back({.path = "fp16.min_loss_scale",
               .kind = Kind::real,
               .def = 1.0,
               .meaning = "Floor of the dynamic loss scale.",
               .field = STRATA_FIELD(fp16.min_loss_scale),
               .min = 0,
               .min_exclusive = true});
  o.push_back(
      {.path = "bf16.enabled",
       .kind = Kind::boolean,
       .def = false,
       .meaning = "bf16 working weights, fp32 master weights and accumulation (no loss scaling).",
       .field = STRATA_FIELD(bf16.enabled),
       .override_name = "bf16",
       .auto_fallback = bf16_auto,
       .auto_note = "override bf16, else true (every Strata backend computes bf16) unless fp16 is on"});

  // ---- ZeRO ----
  add_zero_options(o);  // config_schema_zero.cpp

  // ---- aio ----
  o.push_back({.path = "aio.block_size",
               .kind = Kind::bytes,
               .def = 1048576u,
               .meaning = "Bytes per NVMe request (O_DIRECT: a multiple of 4096).",
               .field = STRATA_FIELD(aio.block_size),
               .min = 4096,
               .multiple_of = 4096});
  o.push_back({.path = "aio.queue_depth",
               .kind = Kind::integer,
               .def = 8,
               .meaning = "NVMe requests in flight per I/O thread.",
               .field = STRATA_FIELD(aio.queue_depth),
               .min = 1,
               .max = kAioMaxQueueDepth});
  o.push_back({.path = "aio.intra_op_parallelism",
               .kind = Kind::integer,
               .def = 1,
               .meaning = "I/O threads that split each large read or write.",
               .field = STRATA_FIELD(aio.intra_op_parallelism),
               .min = 1,
               .max = kAioMaxIntraOpParallelism});
  o.push_back({.path = "aio.single_submit",
               .kind = Kind::boolean,
               .def = false,
               .meaning = "Submit requests one at a time instead of in batches.",
               .field = STRATA_FIELD(aio.single_submit)});
  o.push_back({.path = "aio.overlap_events",
               .kind = Kind::boolean,
               .def = true,
               .meaning = "Submit new requests while earlier completions are being reaped.",
               .field = STRATA_FIELD(aio.overlap_events)});
  o.push_back(
      {.path = "aio.use_gds",
       .kind = Kind::boolean,
       .def = false,
       .meaning = "GPUDirect Storage. Accepted; not implemented (NVMe data goes through pinned host memory).",
       .field = STRATA_FIELD(aio.use_gds)});

  // ---- activation_checkpointing (DeepSpeed's activation_checkpointing/config.py) ----
  o.push_back({.path = "activation_checkpointing.partition_activations",
               .kind = Kind::boolean,
               .def = false,
               .meaning =
                   "Accepted; no effect: each rank holds a whole model replica's activations, there is "
                   "no tensor parallelism to partition them across.",
               .field = STRATA_FIELD(activation_checkpointing.partition_activations)});
  o.push_back({.path = "activation_checkpointing.cpu_checkpointing",
               .kind = Kind::choice,
               .def = false,
               .meaning =
                   "With activation checkpointing, each block's saved input leaves the device for pinned "
                   "host memory as soon as the next block has it, and comes back ahead of its use in "
                   "backward (true); NVMe where pinned memory would not hold them. auto: on when the plan "
                   "with the block inputs on the device does not fit. The same losses either way.",
               .field = STRATA_FIELD(activation_checkpointing.cpu_checkpointing),
               .choices = {"auto", "true", "false"}});
  o.push_back({.path = "activation_checkpointing.contiguous_memory_optimization",
               .kind = Kind::boolean,
               .def = false,
               .meaning = "Accepted; no effect: the block inputs already live in one contiguous buffer.",
               .field = STRATA_FIELD(activation_checkpointing.contiguous_memory_optimization)});
  o.push_back({.path = "activation_checkpointing.number_checkpoints",
               .kind = Kind::integer,
               .def = nullptr,
               .meaning = "Accepted (null or 0: unset); no effect: every transformer block's input is a "
                          "checkpoint.",
               .field = STRATA_FIELD(activation_checkpointing.number_checkpoints),
               .min = 0});
  o.push_back({.path = "activation_checkpointing.synchronize_checkpoint_boundary",
               .kind = Kind::boolean,
               .def = false,
               .meaning = "Accepted; no effect: the recomputation runs in the compute stream's order.",
               .field = STRATA_FIELD(activation_checkpointing.synchronize_checkpoint_boundary)});
  o.push_back({.path = "activation_checkpointing.profile",
               .kind = Kind::boolean,
               .def = false,
               .meaning = "Accepted; no effect: strata train's step times include the recomputation in "
                          "backward (model/profile has the per-op split).",
               .field = STRATA_FIELD(activation_checkpointing.profile)});

  // ---- csv_monitor (DeepSpeed's monitor/config.py CSVConfig) ----
  o.push_back({.path = "csv_monitor.enabled",
               .kind = Kind::boolean,
               .def = false,
               .meaning = "Write per-step metrics (loss, lr, grad norm, loss scale, tokens/s, time split, "
                          "bytes per tier) as CSV files, one per metric; `strata train` and the Python "
                          "engine, rank 0, every optimizer step.",
               .field = STRATA_FIELD(csv_monitor.enabled)});
  o.push_back({.path = "csv_monitor.output_path",
               .kind = Kind::path,
               .def = "",
               .meaning = "Directory the job's folder goes in; must be writable when enabled.",
               .field = STRATA_FIELD(csv_monitor.output_path),
               .default_note = "\"\" (the directory strata runs in)"});
  o.push_back(
      {.path = "csv_monitor.job_name",
       .kind = Kind::path,
       .def = "DeepSpeedJobName",
       .meaning =
           "Folder inside output_path for the files, `output_path/job_name/Train_Samples_<metric>.csv`.",
       .field = STRATA_FIELD(csv_monitor.job_name)});

  // ---- checkpoint (DeepSpeed's section; keep_last is Strata's, HF Trainer's save_total_limit) ----
  o.push_back({.path = "checkpoint.keep_last",
               .kind = Kind::integer,
               .def = 0,
               .meaning =
                   "Checkpoints to keep in the save directory: after each save the oldest complete ones "
                   "beyond this many are removed (never the one `latest` names; HF Trainer's "
                   "save_total_limit). 0 keeps all.",
               .field = STRATA_FIELD(checkpoint.keep_last),
               .min = 0});

  // ---- tensorboard (DeepSpeed's monitor/config.py TensorBoardConfig) ----
  o.push_back({.path = "tensorboard.enabled",
               .kind = Kind::boolean,
               .def = false,
               .meaning = "Write the per-step metrics csv_monitor writes (loss, lr, grad norm, loss scale, "
                          "tokens/s, time split, bytes per tier) as TensorBoard event files; `strata train` "
                          "and the Python engine, rank 0, every optimizer step.",
               .field = STRATA_FIELD(tensorboard.enabled)});
  o.push_back({.path = "tensorboard.output_path",
               .kind = Kind::path,
               .def = "",
               .meaning = "Directory the job's folder goes in; must be writable when enabled.",
               .field = STRATA_FIELD(tensorboard.output_path),
               .default_note = "\"\" (the directory strata runs in)"});
  o.push_back({.path = "tensorboard.job_name",
               .kind = Kind::path,
               .def = "DeepSpeedJobName",
               .meaning = "Folder inside output_path for the event files, "
                          "`output_path/job_name/events.out.tfevents.<time>.<host>.<pid>.<n>`; `tensorboard "
                          "--logdir output_path` shows each job as a run.",
               .field = STRATA_FIELD(tensorboard.job_name)});

  // ---- strata (ours) ----
  o.push_back(
      {.path = "strata.backend",
       .kind = Kind::choice,
       .def = "auto",
       .meaning = "Device backend: cuda when a GPU is visible (auto), or host memory acting as the device.",
       .field = STRATA_FIELD(strata.backend),
       .choices = {"auto", "host", "cuda"}});
  o.push_back(
      {.path = "strata.loss_weighting",
       .kind = Kind::choice,
       .def = "tokens",
       .meaning = "How a step's micro-batches are weighed. tokens: the step's loss (and so its gradients) is "
                  "the mean over every target that counts, of every micro-batch on every rank, as "
                  "transformers' Trainer computes it; micro_batches: the mean of the micro-batches' mean "
                  "losses, as a plain DeepSpeed loop. They differ only when micro-batches count different "
                  "numbers of targets (a loss mask, -100 labels); otherwise the two are bit-identical. "
                  "`strata train` follows it; in Python, giving engine(...) num_items_in_batch weighs by "
                  "tokens and leaving it out by micro-batches.",
       .field = STRATA_FIELD(strata.loss_weighting),
       .choices = {"tokens", "micro_batches"}});
  o.push_back({.path = "strata.checkpoint_activations",
               .kind = Kind::choice,
               .def = "auto",
               .meaning =
                   "Keep each transformer block's input only and recompute the block in backward (true), "
                   "keep every activation (false), or auto: on when a micro-batch's activations would "
                   "not fit the device beside the state and working set. The same losses either way; "
                   "the device plan shows both sizes.",
               .field = STRATA_FIELD(strata.checkpoint_activations),
               .choices = {"auto", "true", "false"}});
  o.push_back({.path = "strata.overlap_optimizer",
               .kind = Kind::choice,
               .def = "auto",
               .meaning =
                   "Update each CPU optimizer sub-group during backward, as soon as its gradients are "
                   "final (true), or after backward (false); auto: on when offload_optimizer.device is "
                   "cpu and the backend is cuda (on the host backend compute shares the optimizer's "
                   "cores). Bit-identical to false: a step whose clipping or overflow check changes the "
                   "update is undone from host-memory copies (14 bytes a parameter) and redone.",
               .field = STRATA_FIELD(strata.overlap_optimizer),
               .choices = {"auto", "true", "false"}});
  o.push_back({.path = "strata.deterministic_attention",
               .kind = Kind::boolean,
               .def = true,
               .meaning = "cuda: cuDNN attention's backward takes its deterministic algorithm, so a run "
                          "repeats bit for bit (on Hopper it keeps an O(B x heads x T^2) workspace, counted "
                          "in the device plan, and is slower); false takes the faster one, whose gradients "
                          "vary in the last bits from run to run. The host backend is deterministic always.",
               .field = STRATA_FIELD(strata.deterministic_attention)});
  o.push_back({.path = "strata.nvme_gradients",
               .kind = Kind::boolean,
               .def = true,
               .meaning =
                   "With zero_optimization.offload_optimizer.device nvme: the fp32 gradients go to NVMe "
                   "with the optimizer states (written as each chunk's are final, read back by the "
                   "swap pipeline), so host memory holds buffers only (true); false keeps them in "
                   "pinned host memory, 4 bytes a parameter, with no gradient I/O. The same losses "
                   "either way. No effect with other offload settings.",
               .field = STRATA_FIELD(strata.nvme_gradients)});
  o.push_back({.path = "strata.device",
               .kind = Kind::integer,
               .def = 0,
               .meaning = "Device ordinal on this rank.",
               .field = STRATA_FIELD(strata.device),
               .min = 0});
  o.push_back({.path = "strata.device_memory_cap",
               .kind = Kind::bytes,
               .def = 0u,
               .meaning = "Bytes of device memory Strata may use (a large GPU acts as a small one); 0 = all.",
               .field = STRATA_FIELD(strata.device_memory_cap)});
  o.push_back({.path = "strata.aio.backend",
               .kind = Kind::choice,
               .def = "auto",
               .meaning = "NVMe I/O engine; auto picks io_uring, then libaio, then psync.",
               .field = STRATA_FIELD(strata.aio.backend),
               .choices = {"auto", "io_uring", "libaio", "psync"}});
  o.push_back({.path = "strata.memprof.path",
               .kind = Kind::path,
               .def = nullptr,
               .meaning = "File the memprof trace is written to; unset = no trace.",
               .field = STRATA_FIELD(strata.memprof.path)});
  o.push_back({.path = "strata.memprof.sample_interval_ms",
               .kind = Kind::integer,
               .def = 10,
               .meaning = "Milliseconds between memprof samples.",
               .field = STRATA_FIELD(strata.memprof.sample_interval_ms),
               .min = 1,
               .max = 3600000});
  o.push_back({.path = "strata.threads",
               .kind = Kind::integer,
               .def = 0,
               .meaning = "CPU threads for the optimizer and CPU kernels; 0 = all cores.",
               .field = STRATA_FIELD(strata.threads),
               .min = 0});
  o.push_back({.path = "strata.cpu_optim.simd",
               .kind = Kind::choice,
               .def = "auto",
               .meaning = "SIMD target of the CPU optimizer (ignoring case); auto = the best this CPU runs.",
               .field = STRATA_FIELD(strata.cpu_optim.simd),
               .choices = {"auto", "AVX3_DL", "AVX3", "AVX2", "SSE4", "SVE2_128", "SVE_256", "SVE2", "SVE",
                           "NEON", "PPC8", "WASM", "WASM_EMU256", "RVV", "EMU128", "SCALAR"},
               .case_insensitive = true});
  o.push_back({.path = "strata.cpu_optim.cores",
               .kind = Kind::integer,
               .def = 0,
               .meaning = "Cores kept for the CPU optimizer alone, the last of this rank's cpus: its threads "
                          "run there, and on the host backend the model computes on the rest (with "
                          "strata.overlap_optimizer auto, it then overlaps backward). 0 = the optimizer and "
                          "compute share every core. At least one core must be left.",
               .field = STRATA_FIELD(strata.cpu_optim.cores),
               .min = 0});
  o.push_back({.path = "strata.cpu_optim.pin_threads",
               .kind = Kind::boolean,
               .def = true,
               .meaning = "Pin CPU optimizer threads to this rank's cpus (the process's allowed cpus; on "
                          "cuda those of the GPU's NUMA node when it has any).",
               .field = STRATA_FIELD(strata.cpu_optim.pin_threads)});
  o.push_back({.path = "strata.log_level",
               .kind = Kind::choice,
               .def = "info",
               .meaning = "Log level; the STRATA_LOG environment variable, when set, wins.",
               .field = STRATA_FIELD(strata.log_level),
               .choices = {"debug", "info", "warn", "error"}});
  o.push_back(
      {.path = "strata.seed",
       .kind = Kind::integer,
       .def = 1234,
       .meaning = "Seed for initialisation, data order and dropout; the same seed gives the same losses.",
       .field = STRATA_FIELD(strata.seed),
       .min = 0});
  o.push_back({.path = "strata.warmup_ratio",
               .kind = Kind::real,
               .def = 0.0,
               .meaning = "Warmup as a fraction of the schedule's steps (transformers' warmup_ratio): where "
                          "scheduler.params.warmup_num_steps is \"auto\" or left out it becomes ceil(ratio × "
                          "steps). A Strata key, so that the scheduler's params stay DeepSpeed's.",
               .field = STRATA_FIELD(strata.warmup_ratio),
               .min = 0,
               .max = 1,
               .max_exclusive = true});
  add_lora_options(o);  // config_schema_lora.cpp
  return o;
}

}  // namespace

const std::vector<Option>& options() {
  static const std::vector<Option> table = build_options();
  return table;
}

int option_index(std::string_view path) {
  static const std::map<std::string, int, std::less<>> index = [] {
    std::map<std::string, int, std::less<>> m;
    for (std::size_t i = 0; i < options().size(); ++i) m.emplace(options()[i].path, int(i));
    return m;
  }();
  auto it = index.find(path);
  return it == index.end() ? -1 : it->second;
}

}  // namespace strata::config_detail
