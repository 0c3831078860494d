// strata/session/session.h: what both front-ends — `strata train` (tools/cmd_train.cpp) and
// `strata.initialize` (python/engine_binding.cpp) — set up before a run, decided in one place, so that
// they read the same model, resolve the same config and refuse the same inputs at the same point; and the
// per-step metrics both write (csv_monitor, tensorboard: the same files, names and values).
//
// Example (strata train's order; strata.initialize's is the same without the data, and Python opens the
// monitors at its first optimizer step: Note [Monitors] in monitors.cpp):
//   const comm::RankInfo ri = session::ranks();                     // the launcher's, job rank for logs
//   session::ModelSource src = session::open_model(spec, session::Weights::allowed);
//   const int T = session::resolve_seq_len(src.config, requested, "--seq-len");
//   ... the front-end's own inputs (token files: --epochs needs them for the run's length) ...
//   Config cfg = session::resolve_config({.path = "ds.json"}, sets, src.config, ri, run_facts);
//   const session::OutputPlan out{.save = {"ckpt", "--save"}, .trace = cfg.strata.memprof.path,
//                                 .monitors = session::monitor_outputs(cfg, ri.rank)};
//   session::check_outputs(out);                                    // every directory, before the engine
//   session::Trainer t = session::build(cfg, src, T, ri, {.backend = "host", .weights_flag = "--init-from"});
//   session::check_output_room(out, session::output_sizes(*t.engine, ri), ri.local_size);
//   model::DataLoader data(file, session::loader_options(*t.engine, cfg, src.config, T));
//   session::Monitors monitors(cfg, *t.engine, std::nullopt);      // csv_monitor, tensorboard (rank 0)
//   const zero3::StepResult r = t.engine->train_batch(*t.model, data);
//   monitors.write_step(*t.engine, r);                              // every optimizer step, flushed
//
// Every refusal is a ConfigError naming the flag or argument the front-end passed in.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/comm.h"
#include "config/config.h"
#include "model/config.h"
#include "model/data_loader.h"
#include "model/hf_dir.h"
#include "model/trainable.h"
#include "session/csv_monitor.h"
#include "session/tensorboard_monitor.h"
#include "zero3/engine.h"

namespace strata::session {

// The launcher's ranks (comm::rank_from_env); with several, log lines carry the job rank.
comm::RankInfo ranks();

// The model a run trains: its shape and, for a Hugging Face directory or .safetensors file, where its
// weights are (the run's start).
struct ModelSource {
  model::ModelConfig config;
  std::optional<model::HfModel> hf;
};

enum class Weights { fresh_only, allowed };
// A preset name ("10m"), or a model JSON (a .json file, or any other existing file): fresh weights. With
// Weights::allowed, a directory or a .safetensors file is a Hugging Face model whose weights are the start
// (strata.initialize(model=...); strata train gives those with --init-from, through open_hf_model).
// ConfigError naming the presets, the file or what was missing.
ModelSource open_model(const std::string& spec, Weights weights);

// The tokens a row runs over: `requested`, or min(max_seq_len, 256) when it is 0. Refused, naming `flag`,
// below 1 or beyond the model's max_seq_len, before any weight is read.
int resolve_seq_len(const model::ModelConfig& m, int requested, const std::string& flag);

// The command line's `--set name=value` overrides (names: docs/config.md): numbers, booleans and JSON arrays
// (betas) parse as JSON, anything else is kept as a string. ConfigError for a pair without a name or "=".
Overrides parse_sets(const std::vector<std::string>& sets);

// Where the config comes from: a file, or a document already read (`origin` names it in errors).
struct ConfigSource {
  std::string path;
  std::optional<nlohmann::json> doc = std::nullopt;
  std::string origin = "config";
};

// The run's config: hidden_size is the model's unless an override gives it (as Hugging Face's integration
// fills it, for the "auto" bucket sizes), the run's facts give the schedule's length, and every value
// chosen for the user is logged on rank 0 as "config: KEY = VALUE: why" (Note [Loud auto] in
// config/config.cpp).
Config resolve_config(const ConfigSource& source, Overrides overrides, const model::ModelConfig& m,
                      const comm::RankInfo& ri, const RunFacts& run = {});

struct BuildOptions {
  std::string backend;                                        // "" = strata.backend
  std::uint64_t device_memory_cap = 0;                        // 0 = strata.device_memory_cap
  std::optional<bool> checkpoint_activations = std::nullopt;  // unset = strata.checkpoint_activations
  bool documents = false;  // the data packs documents kept apart (EngineOptions.documents)
  // Measure the machine and predict the step (EngineOptions.predict_step; "auto" offload devices do anyway).
  bool predict_step = true;
  // Start from the source's Hugging Face weights (false: fresh weights, or a checkpoint loads over them);
  // `weights_flag` names the argument in the warning about tensors the model does not use.
  bool read_weights = true;
  std::string weights_flag = "--init-from";
  // How messages name the adapter directory (cfg.strata.lora.adapter_dir; session/adapters.h).
  std::string adapter_flag = "--adapter";
};

// The engine and the model it trains: what every step needs.
struct Trainer {
  std::unique_ptr<zero3::Engine> engine;
  std::unique_ptr<model::TrainableModel> model;
};

// The CPU threads (zero3::configure_threads, with the ranks on this machine: it writes strata.threads into
// `cfg`), the engine of the config over
// the model (collective with several ranks: every rank calls it), its initial weights from the source's
// files when asked, and the model that runs on the engine's chunks.
Trainer build(Config& cfg, const ModelSource& source, int seq_len, const comm::RankInfo& ri,
              const BuildOptions& opts);

// ---- what the run writes (Note [Outputs up front] in session.cpp) ----

// One output the user named: where, and the flag or key that gave it, as messages name it ("--save",
// "engine.export(path)", "csv_monitor.output_path/job_name:"). An empty path: none.
struct Output {
  std::string path = {};
  std::string what = {};
};

// Every place a run writes, each checked the same way whichever front-end asks.
struct OutputPlan {
  // The checkpoint directory (--save; engine.save_checkpoint(save_dir)).
  Output save = {};
  // The exported model: a Hugging Face model directory, or NAME.safetensors, one file (--export;
  // engine.export(path)).
  Output export_to = {};
  // strata.memprof.path: the trace file, whose directory is checked.
  std::string trace = {};
  // Directories rank 0's monitors write into (csv_monitor, tensorboard).
  std::vector<Output> monitors = {};
};

// Creates each directory of `plan` (and its parents) and checks a file can be created in it
// (check_output_dir), before the engine exists: ConfigError naming the output's flag or key, the path and
// what to do when one is a file, cannot be created or is not writable, or when an export directory or the
// trace names a file where a directory is wanted (or the other way round).
void check_outputs(const OutputPlan& plan);

// Bytes the outputs will hold on this machine's file systems.
struct OutputSizes {
  std::uint64_t checkpoint = 0;  // one checkpoint, this rank's part (zero3::Engine::checkpoint_bytes)
  std::uint64_t exported = 0;  // the exported model (bf16 weights and headers); rank 0 writes it, 0 elsewhere
};
// The sizes for the engine's model and this rank.
OutputSizes output_sizes(const zero3::Engine& engine, const comm::RankInfo& ri);

// Refuses, before the first step, a checkpoint directory whose file system has less free than
// sizes.checkpoint for each of the `local_ranks` ranks on this machine, or an export destination with less
// than sizes.exported: ConfigError naming the output, both sizes and what to do.
void check_output_room(const OutputPlan& plan, const OutputSizes& sizes, int local_ranks);

// ---- the data ----

// The shape of the loader and this rank's share (Note [Samples and sharding] in model/data_loader.h):
// `micro_batch` rows of `seq_len` tokens, rank `rank` of `world` (padded to a multiple of the world,
// never truncated), and a last short batch skipped. What counts an epoch's batches (--epochs) before the
// config is resolved; loader_options adds the rest.
model::DataOptions loader_shape(int micro_batch, int seq_len, int rank, int world);

// What one front-end chooses of the loader.
struct DataChoices {
  bool shuffle = true;      // false: the samples in file order (engine.token_loader(shuffle=False))
  std::string source = {};  // how messages name the data ("--text book.txt"); "": the file's path
};

// The data loader both front-ends train with: loader_shape at the engine's micro-batch and ranks,
// shuffled by strata.seed and the epoch, every token checked against the model's vocabulary.
model::DataOptions loader_options(zero3::Engine& engine, const Config& cfg, const model::ModelConfig& m,
                                  int seq_len, const DataChoices& choices = {});

// ---- the per-step metrics (Note [Monitors] in monitors.cpp) ----

// Bytes in use per tier, from the tier manager's accounting (every kind).
struct TierBytes {
  std::uint64_t device = 0, pinned = 0, nvme = 0;
};
TierBytes tier_bytes(zero3::Engine& engine);

// One monitor event: its name (DeepSpeed's tag, e.g. "Train/Samples/train_loss"; a string literal) and value.
struct MonitorEvent {
  std::string_view name;
  double value = 0;
};

// One optimizer step's monitor events, in the order they are written: DeepSpeed's names where it has the
// metric (train_loss, lr, loss_scale with fp16 only, as DeepSpeed), Strata's own beside them. The figures
// are those of strata train's progress line: rank 0's tokens/s, the step's time split (seconds) and bytes
// per tier `b`; then `device_peak`, the device's high-water mark so far (everything allocated on it).
std::vector<MonitorEvent> step_events(const zero3::StepResult& r, const TierBytes& b,
                                      std::uint64_t device_peak, bool fp16);

// The folders the monitors `cfg` enables write into, each named by its keys as check_outputs reports it
// ("csv_monitor.output_path/job_name:"), for OutputPlan::monitors: rank 0's; none on the other ranks.
std::vector<Output> monitor_outputs(const Config& cfg, int rank);

// The monitors a run writes: rank 0's csv_monitor and tensorboard when the config enables them, nothing
// on the other ranks or when neither is enabled. Not thread-safe: the training thread writes.
class Monitors {
 public:
  // Opens the enabled monitors in the folders monitor_outputs names (check_outputs created them).
  // `resumed_step`: nullopt for a new run, whose CSV files replace an earlier run's; else the global step
  // of the checkpoint the run resumed from, whose rows the CSV files keep (Note [Earlier runs' files] in
  // csv_monitor.cpp). IoError naming the file when one cannot be read or written.
  Monitors(const Config& cfg, zero3::Engine& engine, std::optional<std::int64_t> resumed_step);

  // The step's events (step_events) at step = samples trained so far (DeepSpeed's global_samples:
  // r.step x micro-batch x accumulation x world), every monitor flushed.
  void write_step(zero3::Engine& engine, const zero3::StepResult& r);
  // An evaluation's loss after global step `step` (Train/Samples/eval_loss), flushed.
  void write_eval(std::int64_t step, double loss);

  // Where the metrics go, one entry per open monitor: "DIR/Train_Samples_*.csv (csv_monitor)",
  // "DIR/events.out.tfevents... (tensorboard)". Empty when none is open.
  std::vector<std::string> destinations() const;

 private:
  void write(std::string_view name, std::int64_t samples, double value);

  std::int64_t samples_per_step_ = 0;
  bool fp16_ = false;
  std::optional<CsvMonitor> csv_;
  std::optional<TensorBoardMonitor> tb_;
};

}  // namespace strata::session
