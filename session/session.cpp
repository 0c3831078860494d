#include "session/session.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <utility>

#include "core/error.h"
#include "core/files.h"
#include "core/log.h"
#include "model/architecture.h"
#include "model/make_model.h"
#include "model/nf4_chunk.h"
#include "model/safetensors.h"
#include "session/adapters.h"

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

namespace {

// ", its block projections in NF4 (P of Q base parameters, B bytes: 0.516 byte a parameter, ...)": what the
// NF4 base's tier holds, from the packed layouts (model/nf4_chunk.h).
std::string nf4_summary(const model::ModelLayout& layout) {
  std::uint64_t quantised = 0, packed = 0, base = 0;
  const bool dq = layout.config().lora.double_quant;
  for (const model::ChunkLayout& c : layout.chunks()) {
    if (!layout.is_base(c.id)) continue;
    base += c.numel;
    if (!model::nf4_quantizes(c)) continue;
    const model::Nf4Chunk f = model::nf4_chunk(c, DType::bf16, dq);
    quantised += f.quantized;
    packed += f.bytes;
  }
  char per[32];
  std::snprintf(per, sizeof per, "%.4f", double(packed) / double(std::max<std::uint64_t>(1, quantised)));
  return cat(", its block projections in NF4 (", quantised, " of ", base, " base parameters in ",
             format_size(packed), " with their norms: ", per, " byte a parameter; blocks of 64, ",
             dq ? "double-quantised absmax" : "fp32 absmax", ")");
}

}  // namespace

Trainer build(Config& cfg, const ModelSource& source, int seq_len, const comm::RankInfo& ri,
              const BuildOptions& opts) {
  const model::Architecture& arch = model::architecture(source.config);
  const bool adapters = source.config.lora.active();
  STRATA_CHECK(adapters || (!cfg.strata.lora.enabled && cfg.strata.lora.adapter_dir.empty()),
               "session::build: the config asks for adapters; call resolve_adapters on the source first");
  // The initial weights, read chunk by chunk while the engine initialises them (memory-mapped): the base's
  // from its files, the adapters' from their directory (else fresh, as PEFT starts them).
  std::unique_ptr<model::WeightsSource> weights;
  std::unique_ptr<AdapterWeights> adapter;
  model::ModelConfig base_cfg = source.config;
  base_cfg.lora = {};
  if (source.hf && opts.read_weights) {
    weights = std::make_unique<model::WeightsSource>(source.hf->weights, arch.layout(base_cfg));
    weights->warn_unused(opts.weights_flag);
  }
  if (adapters && opts.read_weights && !cfg.strata.lora.adapter_dir.empty())
    adapter = std::make_unique<AdapterWeights>(cfg.strata.lora.adapter_dir, arch.layout(source.config),
                                               opts.adapter_flag);
  // Note [NF4 base] in model/nf4_chunk.h: the base is quantised as its files store it, and a checkpoint
  // names that base rather than holding it; a base initialised at random has neither.
  if (source.config.lora.nf4_base && !weights)
    throw ConfigError(
        "strata.lora.base_dtype \"nf4\" quantises the base's weights as its files store them, and this model "
        "has no files (a preset or a model JSON, initialised at random); give a Hugging Face model directory "
        "(strata train --init-from DIR, strata.initialize(model=DIR)), or use base_dtype \"bf16\"");
  const model::ModelLayout full = arch.layout(source.config);
  BaseDigest digest;
  zero3::EngineOptions eo;
  eo.backend = opts.backend;
  eo.device_memory_cap = opts.device_memory_cap;
  eo.seq_len = seq_len;
  eo.checkpoint_activations = opts.checkpoint_activations;
  eo.documents = opts.documents;
  eo.predict_step = opts.predict_step;
  if (weights || adapter)
    eo.init_params = [&](const model::ChunkLayout& c, float* out) {
      if (adapter && adapter->holds(c)) {
        adapter->read_chunk(c, out);
      } else if (full.is_base(c.id) && weights) {
        weights->read_chunk(c, out);
        if (adapters) digest.add(out, c.padded_numel);
      } else {
        arch.init_chunk(full, c.id, std::uint64_t(cfg.strata.seed), out);
      }
    };
  zero3::configure_threads(cfg, ri.local_size);
  Trainer t;
  t.engine = std::make_unique<zero3::Engine>(cfg, source.config, std::move(eo));
  // Offload devices "auto" are the engine's choice (Note [Placement auto] in zero3/engine_auto.cpp): the
  // run's config takes it, so that what reads the config after the engine sees the placement in force.
  cfg.zero_optimization.offload_param = t.engine->config().zero_optimization.offload_param;
  cfg.zero_optimization.offload_optimizer = t.engine->config().zero_optimization.offload_optimizer;
  if (adapters && weights) {
    t.engine->set_base(
        {{"path", source.hf->dir.empty() ? source.hf->weights : source.hf->dir}, {"digest", digest.str()}});
    if (ri.rank == 0)
      STRATA_LOG_INFO("lora: r ", source.config.lora.r, ", scale ", source.config.lora.scale(), ", ",
                      model::lora_target_paths(source.config).size(), " adapted modules (",
                      model::lora_parameters(source.config), " parameters) over the frozen base ",
                      source.hf->dir.empty() ? source.hf->weights : source.hf->dir, " (", digest.str(), ")",
                      source.config.lora.nf4_base ? nf4_summary(t.engine->layout()) : std::string(),
                      adapter ? cat("; adapters from ", cfg.strata.lora.adapter_dir) : std::string());
  }
  t.model = model::make_model(source.config, t.engine->model_options());
  return t;
}

// Note [Outputs up front]: everything a run will write — checkpoints, the exported model, the monitors'
// files, the memprof trace — has its directory created and probed before the engine is built (a bad one
// is refused in a second, not after the NVMe state is written), and the room the checkpoint and the
// export take is checked once the engine knows their size, before the first step: a run never trains for
// hours to fail at its save. Both front-ends call the same two functions, so the same bad directory gets
// the same message at the same point, the output named as that front-end's user gave it. Python knows its
// checkpoint and export destinations only when it writes them, and checks them then, the same way.
void check_outputs(const OutputPlan& plan) {
  namespace fs = std::filesystem;
  if (!plan.save.path.empty()) check_output_dir(plan.save.path, plan.save.what);
  // NAME.safetensors: one file, in a directory; any other path: a Hugging Face model directory.
  if (const Output& e = plan.export_to; !e.path.empty()) {
    if (e.path.ends_with(".safetensors")) {
      check_output_dir(fs::absolute(e.path).parent_path().string(), cat(e.what, "'s directory"));
    } else {
      std::error_code ec;
      if (fs::exists(e.path, ec) && !fs::is_directory(e.path, ec))
        throw ConfigError(
            cat(e.what, " ", e.path,
                " is a file; give a directory for the model (or NAME.safetensors for one file)"));
      check_output_dir(e.path, e.what);
    }
  }
  for (const Output& m : plan.monitors)
    if (!m.path.empty()) check_output_dir(m.path, m.what);
  if (!plan.trace.empty()) {
    std::error_code ec;
    if (fs::is_directory(plan.trace, ec))
      throw ConfigError(cat("strata.memprof.path ", plan.trace,
                            " is a directory; give the trace file to write (e.g. run.memprof.jsonl)"));
    check_output_dir(fs::absolute(plan.trace).parent_path().string(), "strata.memprof.path's directory");
  }
}

OutputSizes output_sizes(const zero3::Engine& engine, const comm::RankInfo& ri) {
  OutputSizes s;
  s.checkpoint = engine.checkpoint_bytes();
  if (ri.rank == 0) {
    // bf16 weights as the export writes them (model::save_weights, save_pretrained), and room for the
    // headers, config.json and the tokenizer files copied along.
    s.exported = std::uint64_t(1) << 20;
    for (const model::ChunkLayout& c : engine.layout().chunks())
      for (const model::TensorSpec& t : c.stored) s.exported += std::uint64_t(t.numel) * 2;
  }
  return s;
}

namespace {

// ConfigError when the file system holding `dir` has less than `need` bytes free; `what_takes` says what
// the bytes are for ("a checkpoint of this run takes").
void check_room(const Output& out, const std::string& dir, std::uint64_t need, const std::string& what_takes,
                const std::string& whose) {
  if (out.path.empty() || need == 0) return;
  const std::optional<std::uint64_t> room = free_disk_bytes(dir);
  if (!room || *room >= need) return;
  throw ConfigError(cat(out.what, " ", out.path, ": ", what_takes, " ", format_bytes(need), whose,
                        " and the file system has ", format_bytes(*room),
                        " free; free space or choose another ", out.what, " directory"));
}

}  // namespace

void check_output_room(const OutputPlan& plan, const OutputSizes& sizes, int local_ranks) {
  // Every rank on this machine writes its part of a checkpoint at the same time.
  const int ranks = std::max(1, local_ranks);
  check_room(plan.save, plan.save.path, sizes.checkpoint * std::uint64_t(ranks),
             "a checkpoint of this run takes", ranks > 1 ? " for the ranks on this machine" : "");
  const std::string& e = plan.export_to.path;
  check_room(plan.export_to,
             e.ends_with(".safetensors") ? std::filesystem::absolute(e).parent_path().string() : e,
             sizes.exported, "the exported model takes", "");
}

model::DataOptions loader_shape(int micro_batch, int seq_len, int rank, int world) {
  return {
      .batch_size = micro_batch, .seq_len = seq_len, .rank = rank, .world = world, .drop_last_batch = true};
}

model::DataOptions loader_options(zero3::Engine& engine, const Config& cfg, const model::ModelConfig& m,
                                  int seq_len, const DataChoices& choices) {
  comm::Communicator& c = engine.communicator();
  model::DataOptions o = loader_shape(engine.micro_batch(), seq_len, c.rank(), c.world_size());
  o.seed = std::uint64_t(cfg.strata.seed);
  o.shuffle = choices.shuffle;
  o.vocab_size = m.vocab_size;
  o.source = choices.source;
  return o;
}

}  // namespace strata::session
