#include "session/session.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "model/make_model.h"
#include "model/safetensors.h"

namespace strata::session {

using detail::cat;
namespace fs = std::filesystem;

comm::RankInfo ranks() {
  const comm::RankInfo ri = comm::rank_from_env();
  // Under mpirun every rank runs the front-end; rank 0 prints, the others only warnings and errors, which
  // carry their rank.
  if (ri.world_size > 1) log::set_job_rank(ri.rank);
  return ri;
}

ModelSource open_model(const std::string& spec, Weights weights) {
  ModelSource s;
  if (weights == Weights::allowed && (fs::is_directory(spec) || spec.ends_with(".safetensors"))) {
    s.hf = model::open_hf_model(spec);
    s.config = s.hf->config;
  } else if (spec.ends_with(".json") || fs::exists(spec)) {
    s.config = model::ModelConfig::from_file(spec);
  } else {
    s.config = model::ModelConfig::preset(spec);
  }
  return s;
}

int resolve_seq_len(const model::ModelConfig& m, int requested, const std::string& flag) {
  if (requested < 0) throw ConfigError(cat(flag, " ", requested, " must be at least 1"));
  const int T = requested > 0 ? requested : int(std::min<std::int64_t>(m.max_seq_len, 256));
  if (T > m.max_seq_len)
    throw ConfigError(
        cat(flag, " ", T, " is longer than model '", m.name, "''s max_seq_len ", m.max_seq_len));
  m.check_sequence(T, flag);
  return T;
}

Overrides parse_sets(const std::vector<std::string>& sets) {
  Overrides o;
  for (const std::string& s : sets) {
    const auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0)
      throw ConfigError(
          cat("--set \"", s, "\": expected name=value, e.g. --set lr=3e-4 (names: docs/config.md)"));
    nlohmann::json v = nlohmann::json::parse(s.substr(eq + 1), nullptr, /*allow_exceptions=*/false);
    o[s.substr(0, eq)] = v.is_discarded() ? nlohmann::json(s.substr(eq + 1)) : v;
  }
  return o;
}

Config resolve_config(const ConfigSource& source, Overrides overrides, const model::ModelConfig& m,
                      const comm::RankInfo& ri, const RunFacts& run) {
  // Hugging Face's integration fills hidden_size from the model ("auto" bucket sizes); so do we, unless an
  // override gives it.
  if (!overrides.count("hidden_size")) overrides["hidden_size"] = m.d_model;
  Config cfg = source.doc ? Config::parse(*source.doc, overrides, ri.world_size, source.origin, run)
                          : Config::load(source.path, overrides, ri.world_size, run);
  // Note [Loud auto] in config/config.cpp: every value chosen for the user, with its reason, before anything
  // else happens.
  if (ri.rank == 0)
    for (const std::string& line : cfg.auto_report()) STRATA_LOG_INFO("config: ", line);
  return cfg;
}

Trainer build(Config& cfg, const ModelSource& source, int seq_len, const comm::RankInfo& ri,
              const BuildOptions& opts) {
  // The initial weights, read chunk by chunk while the engine initialises them (memory-mapped).
  std::unique_ptr<model::WeightsSource> weights;
  if (source.hf && opts.read_weights) {
    weights = std::make_unique<model::WeightsSource>(source.hf->weights, model::ModelLayout(source.config));
    weights->warn_unused(opts.weights_flag);
  }
  zero3::EngineOptions eo;
  eo.backend = opts.backend;
  eo.device_memory_cap = opts.device_memory_cap;
  eo.seq_len = seq_len;
  eo.checkpoint_activations = opts.checkpoint_activations;
  if (weights)
    eo.init_params = [&w = *weights](const model::ChunkLayout& c, float* out) { w.read_chunk(c, out); };
  zero3::configure_threads(cfg, ri.local_size);
  Trainer t;
  t.engine = std::make_unique<zero3::Engine>(cfg, source.config, std::move(eo));
  t.model = model::make_model(source.config, t.engine->model_options());
  return t;
}

}  // namespace strata::session
