// strata/session/session.h: what both front-ends — `strata train` (tools/cmd_train.cpp) and
// `strata.initialize` (python/engine_binding.cpp) — set up before a run, decided in one place, so that
// they read the same model, resolve the same config and refuse the same inputs at the same point.
//
// Example (strata train's order; strata.initialize's is the same without the data):
//   const comm::RankInfo ri = session::ranks();                     // the launcher's, job rank for logs
//   session::ModelSource src = session::open_model(spec, session::Weights::allowed);
//   const int T = session::resolve_seq_len(src.config, requested, "--seq-len");
//   ... the front-end's own inputs (token files: --epochs needs them for the run's length) ...
//   Config cfg = session::resolve_config({.path = "ds.json"}, sets, src.config, ri, run_facts);
//   ... the front-end's own outputs (directories, monitors) ...
//   session::Trainer t = session::build(cfg, src, T, ri, {.backend = "host", .weights_flag = "--init-from"});
//   t.engine->train_batch(*t.model, data);
//
// Every refusal is a ConfigError naming the flag or argument the front-end passed in.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "config/config.h"
#include "model/config.h"
#include "model/hf_dir.h"
#include "model/trainable.h"
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
// below 1, beyond the model's max_seq_len, or beyond a sliding window the model cannot train past
// (ModelConfig::check_sequence) — before any weight is read.
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
  // Start from the source's Hugging Face weights (false: fresh weights, or a checkpoint loads over them);
  // `weights_flag` names the argument in the warning about tensors the model does not use.
  bool read_weights = true;
  std::string weights_flag = "--init-from";
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

}  // namespace strata::session
