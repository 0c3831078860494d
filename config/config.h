// strata/config/config.h: the run configuration, read from a DeepSpeed-style ds_config.json.
//
// Example:
//   strata::Overrides cli{{"lr", 3e-4}, {"micro_batch", 4}, {"hidden_size", 4096}};
//   strata::Config cfg = strata::Config::load("ds_config.json", cli, /*world_size=*/1);
//   if (cfg.zero_optimization.offload_optimizer.device == strata::OffloadDevice::nvme) ...
//   std::fputs(cfg.resolved_table().c_str(), stdout);   // key | value | source
//   nlohmann::json header = cfg.to_json();               // checkpoints, memprof traces
//
// Every key, with its JSON path, type, default, allowed values and meaning, is declared once in the schema
// table (config/config_schema.cpp). Parsing, defaults, validation, "did you mean" suggestions, the resolved
// table, to_json() and docs/config.md (config_reference_markdown()) are all driven by that table; the
// structs below only give the values a typed home. Field names are DeepSpeed's key names.
//
// Bad input raises strata::ConfigError naming the key path, the value and what is allowed, e.g.
//   zero_optimization.offload_optimizer.device: "gpu" is not one of none, cpu, nvme
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/log.h"

namespace strata {

// Where a ZeRO offload keeps its tensors (DeepSpeed's OffloadDeviceEnum).
enum class OffloadDevice { none, cpu, nvme };
// The config's word for each, in enumerator order: "none", "cpu", "nvme" (the schema's choices).
inline constexpr const char* kOffloadDeviceNames[] = {"none", "cpu", "nvme"};
inline const char* offload_device_name(OffloadDevice d) {
  return kOffloadDeviceNames[int(d)];
}
enum class OptimizerType { Adam, AdamW, Adagrad, Lion };
// none: no "scheduler" section; the learning rate stays at optimizer.params.lr.
enum class SchedulerType { none, WarmupLR, WarmupDecayLR, WarmupCosineLR };
enum class WarmupType { log, linear };

struct OptimizerConfig {
  OptimizerType type = OptimizerType::Adam;
  double lr = 1e-3;
  std::array<double, 2> betas = {0.9, 0.999};  // (beta1, beta2); Adam, AdamW, Lion
  double eps = 1e-8;                           // Adam, AdamW, Adagrad
  double weight_decay = 0.0;
  bool adam_w_mode = true;      // Adam only: decoupled weight decay (AdamW is always decoupled)
  bool torch_adam = false;      // Adam, AdamW: accepted; Strata has one Adam implementation
  bool bias_correction = true;  // Adam, AdamW
};

struct SchedulerConfig {
  SchedulerType type = SchedulerType::none;
  double warmup_min_lr = 0.0;   // WarmupLR, WarmupDecayLR
  double warmup_max_lr = 1e-3;  // WarmupLR, WarmupDecayLR
  std::int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::log;
  std::int64_t total_num_steps = 0;  // WarmupDecayLR, WarmupCosineLR (required there)
  double warmup_min_ratio = 0.0;     // WarmupCosineLR
  double cos_min_ratio = 1e-4;       // WarmupCosineLR
  std::int64_t last_batch_iteration = -1;
};

struct Fp16Config {
  bool enabled = false;
  bool auto_cast = false;
  double loss_scale = 0.0;  // 0: dynamic loss scaling
  std::int64_t initial_scale_power = 16;
  std::int64_t loss_scale_window = 1000;
  std::int64_t hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
};

struct Bf16Config {
  bool enabled = false;
};

struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::none;
  // "auto" (device_auto; device stays none until then): the engine chooses the placement from the memory
  // plan and the predicted step of each (zero3/step_time.h) and clears this.
  bool device_auto = false;
  // nvme_path: one directory, or several (one per drive; swap files striped over them). Empty when
  // unset; each must be a writable directory when device is nvme.
  std::vector<std::string> nvme_paths;
  bool pin_memory = false;
  std::int64_t buffer_count = 5;
  std::uint64_t buffer_size = 100000000;  // elements per buffer
  std::uint64_t max_in_cpu = 1000000000;  // elements kept in host memory when device is nvme
};

struct OffloadOptimizerConfig {
  OffloadDevice device = OffloadDevice::none;
  bool device_auto = false;  // as OffloadParamConfig's
  std::vector<std::string> nvme_paths;  // as OffloadParamConfig's
  bool pin_memory = false;
  std::int64_t buffer_count = 4;
  bool pipeline_read = false;
  bool pipeline_write = false;
  bool fast_init = false;
  // DeepSpeed's partial offload: the fraction of the optimizer sub-groups offloaded (the last ones); the
  // first 1 - ratio of them keep their master, states and gradients on the device and are stepped by the
  // device optimizer (< 1 needs stage 3). "auto" (ratio_auto; ratio stays 1 until the engine chooses):
  // chosen at start-up from measured optimizer throughput and the device memory left (zero3/placement.h).
  double ratio = 1.0;
  bool ratio_auto = false;
};

struct ZeroConfig {
  std::int64_t stage = 0;
  OffloadParamConfig offload_param;
  OffloadOptimizerConfig offload_optimizer;
  // All sizes below count elements (parameters), not bytes, as in DeepSpeed.
  std::uint64_t stage3_prefetch_bucket_size = 50000000;
  std::uint64_t stage3_max_live_parameters = 1000000000;
  std::uint64_t stage3_max_reuse_distance = 1000000000;
  std::uint64_t stage3_param_persistence_threshold = 100000;
  bool stage3_gather_16bit_weights_on_model_save = false;
  std::uint64_t sub_group_size = 1000000000;
  std::uint64_t reduce_bucket_size = 500000000;
  std::uint64_t allgather_bucket_size = 500000000;
  bool allgather_partitions = true;
  bool overlap_comm = false;  // default true at stage 3 (DeepSpeed's rule)
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  bool round_robin_gradients = false;
};

// The limits of the aio settings: one place, read by the schema (config files, `strata config`) and by
// the NVMe engine's own validation.
inline constexpr std::int64_t kAioMaxQueueDepth = 4096;
inline constexpr std::int64_t kAioMaxIntraOpParallelism = 64;

struct AioConfig {
  std::uint64_t block_size = 1048576;  // bytes
  std::int64_t queue_depth = 8;
  std::int64_t intra_op_parallelism = 1;
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;
};

// DeepSpeed's csv_monitor: per-step metrics, one CSV file per metric under output_path/job_name/
// (session/csv_monitor.h writes them from every optimizer step of strata train and the Python engine; rank
// 0 only).
struct CsvMonitorConfig {
  bool enabled = false;
  std::string output_path;                    // "" = the directory strata runs in
  std::string job_name = "DeepSpeedJobName";  // a directory inside output_path
};

// DeepSpeed's tensorboard monitor: the same per-step metrics as csv_monitor, as TensorBoard event files in
// output_path/job_name/ (session/tensorboard_monitor.h writes them, as csv_monitor's; rank 0 only).
struct TensorBoardConfig {
  bool enabled = false;
  std::string output_path;                    // "" = the directory strata runs in
  std::string job_name = "DeepSpeedJobName";  // a directory inside output_path
};

// DeepSpeed's checkpoint section: the key Strata reads (its others are accepted and ignored).
struct CheckpointConfig {
  // Checkpoints to keep in a save directory: after each save, the oldest complete checkpoints beyond this
  // many are removed, never the one `latest` names (zero3/checkpoint.h, rotate_checkpoints). 0: keep all.
  std::int64_t keep_last = 0;
};

// DeepSpeed's activation_checkpointing section (deepspeed.checkpointing's settings). In DeepSpeed the
// model code calls the checkpointing; here the model does it at every transformer block when
// strata.checkpoint_activations says so, and these keys are accepted with what they mean here
// (docs/config.md).
struct ActivationCheckpointingConfig {
  // cpu_checkpointing: the checkpointed block inputs leave the device for pinned host memory (NVMe where
  // that would not hold them), or auto: when the plan with them on the device does not fit (Note
  // [Checkpoints off the device] in zero3/engine_checkpoints.h).
  enum class CpuCheckpointing { automatic, on, off };  // "auto", true, false
  bool partition_activations = false;                  // no effect: no tensor parallelism to partition across
  CpuCheckpointing cpu_checkpointing = CpuCheckpointing::off;
  bool contiguous_memory_optimization = false;   // no effect: the block inputs are one buffer already
  std::int64_t number_checkpoints = 0;           // 0: unset; no effect (every block is a checkpoint)
  bool synchronize_checkpoint_boundary = false;  // no effect: the ops run in stream order
  bool profile = false;                          // no effect: `strata train`'s step times split the recompute
};

// Strata's own knobs, under "strata" in the file.
struct StrataConfig {
  enum class Backend { automatic, host, cuda };
  enum class AioBackend { automatic, io_uring, libaio, psync };
  struct Aio {
    AioBackend backend = AioBackend::automatic;
  };
  struct Memprof {
    std::string path;  // "" = memprof off
    std::int64_t sample_interval_ms = 10;
  };
  struct CpuOptim {
    std::string simd = "auto";  // "auto" or a Highway target name (AVX2, AVX3, NEON, ...)
    std::int64_t cores = 0;     // kept for the optimizer alone (the rank's last cpus); 0 = shared
    bool pin_threads = true;
  };
  // Activation checkpointing (model/llama.h, Note [Activation checkpointing]): keep each block's input
  // only and recompute the block in backward. automatic: on when the activations of a micro-batch would
  // not fit the device beside the state and working set; otherwise off (faster, more device memory).
  enum class Checkpointing { automatic, on, off };  // "auto", true, false
  // The optimizer overlapped with backward (zero3/engine_overlap.cpp, Note [Optimizer overlap]): each
  // sub-group updated as soon as its gradients are final, exactly as after backward. automatic: on when
  // the optimizer is offloaded to the CPU (offload_optimizer.device cpu) and the model computes on a GPU.
  enum class Overlap { automatic, on, off };  // "auto", true, false
  // How a step's micro-batches are weighed (zero3/engine_step.cpp, Note [Loss weighting]). tokens: the
  // step's loss is the mean over every counted target of every micro-batch on every rank (transformers'
  // Trainer since its gradient-accumulation fix); micro_batches: the mean of the micro-batches' means
  // (a plain DeepSpeed loop). The same whenever every micro-batch counts as many targets.
  enum class LossWeighting { tokens, micro_batches };  // "tokens", "micro_batches"
  Backend backend = Backend::automatic;
  LossWeighting loss_weighting = LossWeighting::tokens;
  Checkpointing checkpoint_activations = Checkpointing::automatic;
  Overlap overlap_optimizer = Overlap::automatic;
  // Attention's backward on cuda with cuDNN: its deterministic algorithm (the same bits run to run; on
  // Hopper a slower path with an O(B·heads·T²) workspace, counted in the device plan), or false: its
  // faster one, whose gradients vary in the last bits run to run (kernels/cuda/attention_cudnn.cpp, Note
  // [cuDNN attention determinism]). The host backend is deterministic either way.
  bool deterministic_attention = true;
  // With offload_optimizer.device nvme, the fp32 gradient shards live on NVMe beside the optimizer states:
  // written through a small pinned window as each is final and read back with the states by the swap
  // pipeline (zero3/engine_grads.cpp, Note [Gradients through NVMe]). false keeps them in pinned host
  // memory (4 bytes a parameter of RAM, no gradient I/O). The same losses either way.
  bool nvme_gradients = true;
  std::int64_t device = 0;
  std::uint64_t device_memory_cap = 0;  // bytes; 0 = the whole device
  Aio aio;
  Memprof memprof;
  std::int64_t threads = 0;  // 0 = all cores
  CpuOptim cpu_optim;
  log::Level log_level = log::Level::info;
  std::int64_t seed = 1234;  // for weight init, data order and dropout; same seed, same losses
  // Warmup as a fraction of the schedule's steps (transformers' warmup_ratio): where
  // scheduler.params.warmup_num_steps is "auto" or left out, it becomes ceil(ratio × total steps).
  double warmup_ratio = 0.0;
  // strata.lora: LoRA adapters (PEFT's key names) on a frozen base; model/lora.h resolves them against
  // the model's family.
  //
  // The keys, their defaults and what is allowed: config/config_schema_lora.cpp (docs/config.md). PEFT's
  // other LoraConfig fields are accepted in the block at their defaults and refused by name otherwise
  // (config/lora_peft.cpp, the table docs/config.md shows); config/lora_peft.h reads and writes PEFT's
  // adapter_config.json.
  struct Lora {
    bool enabled = false;  // the block is present in the config
    std::int64_t r = 8;
    double lora_alpha = 8;
    double lora_dropout = 0;
    std::vector<std::string> target_modules;   // names or module paths as given ("q_proj",
                                               // "model.layers.1.self_attn.k_proj"), or one "all-linear"
    bool target_modules_regex = false;         // target_modules was a JSON string other than "all-linear":
                                               // PEFT's full-match regex, kept as target_modules[0]
    std::vector<std::string> modules_to_save;  // e.g. "lm_head", "embed_tokens"
    bool use_rslora = false;
    std::string base_dtype = "bf16";  // "bf16" or "nf4"
    bool double_quant = true;         // with nf4: the absmax quantised too (QLoRA's default)
    std::string adapter_dir;          // --adapter DIR (set by the front-ends, not a key)
    // PEFT's init_lora_weights: true (A Kaiming-uniform, B zero: the adapted model starts as the base) or
    // false (B random too, PEFT's debugging choice). Its other initialisations are refused by name.
    bool init_lora_weights = true;
  };
  Lora lora;
};

// Values the command line supplies for keys the file sets to "auto" (as Hugging Face's DeepSpeed
// integration writes them), plus hidden_size and world_size. Names and types: docs/config.md.
using Overrides = std::map<std::string, nlohmann::json>;

// What the front-end knows about the run that a config may leave to it (Note [Loud auto] in config.cpp):
// its length, which scheduler.params.total_num_steps takes where the file says "auto" or leaves it out
// (and a warmup ratio multiplies). A file that sets a different total is kept, with a warning naming both.
struct RunFacts {
  // The run's optimizer steps in all, counted from step 0 (a resumed run: the steps already taken plus
  // those to come); 0: not known, or with `from` given, a run of no step (the schedule is not used).
  std::int64_t total_steps = 0;
  // Or epochs over the data (total_steps 0): ceil(epochs × max(1, micro-batches an epoch / accumulation
  // steps)), as transformers' Trainer counts; micro_batches_per_epoch(micro batch) is this rank's count.
  double epochs = 0;
  std::function<std::int64_t(std::int64_t micro_batch)> micro_batches_per_epoch = nullptr;
  std::string from = {};  // where the length came from, for messages: "--steps 30", "--epochs 2"
  // `strata config` without --steps: the length comes at training, so a total left to the run is reported
  // as such rather than required.
  bool length_later = false;
};

// The run's optimizer steps from `run` for a resolved batch (0 when it does not say).
std::int64_t run_total_steps(const RunFacts& run, std::int64_t micro_batch, std::int64_t accumulation_steps);

struct Config {
  std::int64_t train_batch_size = 0;
  std::int64_t train_micro_batch_size_per_gpu = 0;
  std::int64_t gradient_accumulation_steps = 0;
  int world_size = 1;  // not a file key: from the launcher (or the "world_size" override)

  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  Fp16Config fp16;
  Bf16Config bf16;
  double gradient_clipping = 0.0;
  ZeroConfig zero_optimization;
  AioConfig aio;
  std::int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;
  bool memory_breakdown = false;
  CsvMonitorConfig csv_monitor;
  TensorBoardConfig tensorboard;
  CheckpointConfig checkpoint;
  ActivationCheckpointingConfig activation_checkpointing;
  StrataConfig strata;

  // Reads and parses a JSON file. A missing/unreadable file, malformed JSON (with line and column) and
  // every invalid key raise ConfigError whose message starts with the file path.
  static Config load(const std::string& path, const Overrides& overrides = {}, int world_size = 1,
                     const RunFacts& run = {});
  // Parses an already-read document; `origin` prefixes error messages (a path or "config").
  static Config parse(const nlohmann::json& doc, const Overrides& overrides = {}, int world_size = 1,
                      std::string_view origin = "config", const RunFacts& run = {});

  // key | value | source, one row per key in force (source: file, default, auto→..., alias ..., inferred).
  std::string resolved_table() const;
  // The resolved configuration as a DeepSpeed-style document; Config::parse(to_json()) gives it back.
  nlohmann::json to_json() const;
  // Where a key's value came from, as in resolved_table(); throws ConfigError for an unknown key.
  std::string source(std::string_view key) const;
  // The warnings parsing produced (ignored sections, deprecated aliases, no-effect settings); each was
  // also logged once.
  const std::vector<std::string>& warnings() const { return warnings_; }
  // Every value Strata chose for the user (Note [Loud auto] in config.cpp): the keys the file sets to
  // "auto", and a schedule total the file leaves to the run, one line each: "key = value: why".
  std::vector<std::string> auto_report() const;

 private:
  friend struct ConfigParser;
  std::vector<std::string> sources_;  // indexed like the schema; "" = not in force
  std::vector<std::string> reasons_;  // indexed like the schema; why a chosen value was taken ("" = not)
  std::vector<std::string> warnings_;
};

// docs/config.md, generated from the schema (strata_config_doc prints it).
std::string config_reference_markdown();

// Sizes as the config accepts them: 1048576, 5e8, "512MB" (10^6), "2GiB" (2^30), "1.5G" (SI, = 1.5e9),
// "64Ki". The result must be a whole number. `key` names the setting in the ConfigError message.
std::uint64_t parse_byte_size(std::string_view text, std::string_view key = "size");

}  // namespace strata
