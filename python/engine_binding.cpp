// strata._strata.Core: the engine and the model of one training run, as the package's Engine
// (python/strata/engine.py) drives them — what `strata train` constructs, minus its loop.
//
// Note [Batches from Python]: engine(input_ids, labels) follows Hugging Face's causal-LM convention
// (labels default to the inputs, the shift happens inside): a row of L tokens runs the model over its
// first L - 1 and trains position t to predict labels[t + 1]; a negative label is ignored. The model
// never computes the last position, whose logits Hugging Face would discard, so a window of T + 1 tokens
// from a token file is exactly one `strata train` sample (inputs: its first T, targets: its last T), and a
// Python loop over the same windows gives the CLI's losses bit for bit. A label of -100 (any negative one)
// is left out of the loss, which is the mean over the labels that count. num_items_in_batch (transformers'
// name) is the number of labels that count in the whole optimizer step — every micro-batch, every rank;
// given, the micro-batch's gradients are those of its summed losses / num_items_in_batch (Engine::backward,
// Note [Loss weighting] in zero3/engine_step.cpp), so that the step is the mean over every counted label;
// not given, each micro-batch weighs the same (its mean / (accumulation steps x world)). The loss
// returned stays the micro-batch's mean either way. Every row has the same L; B may be
// below the micro-batch (a last, short batch), never above it, and L - 1 never above the seq_len the
// device plan reserved activations for: either would allocate past the plan. position_ids (B, L),
// optional, are transformers' per-document positions of packed rows (its padding-free packing): each
// document attends to itself only and its rotary positions restart (model/packed_docs.h); the model takes
// the first L - 1 columns, as it takes the inputs.
//
// Threads: every method is called with the GIL held and releases it around the engine's work, so a
// Python data pipeline runs meanwhile. One Python thread drives a Core at a time (the engine's calls come
// from one training thread); the Python Engine holds a lock for that.
#include <pybind11/stl.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>

#include "comm/comm.h"
#include "config/config.h"
#include "core/error.h"
#include "core/log.h"
#include "model/hf_dir.h"
#include "model/loss_mask.h"
#include "model/packed_docs.h"
#include "model/safetensors.h"
#include "python/binding.h"
#include "python/loader.h"
#include "session/adapters.h"
#include "session/session.h"
#include "tiering/snapshot.h"
#include "zero3/checkpoint.h"
#include "zero3/engine.h"

namespace strata::python {
namespace {

using detail::cat;
namespace fs = std::filesystem;

// initialize(model=...): a directory or .safetensors file is a Hugging Face model (its weights are the
// start, as --init-from); a .json file or another existing file a model config (fresh weights); anything
// else a preset name (session::open_model; ConfigError listing the presets when it is none).
session::ModelSource resolve_model(const std::variant<model::ModelConfig, std::string>& m) {
  if (const auto* c = std::get_if<model::ModelConfig>(&m)) {
    c->validate("initialize(model=ModelConfig)");
    return {.config = *c, .hf = std::nullopt};
  }
  return session::open_model(std::get<std::string>(m), session::Weights::allowed);
}

// Config overrides (docs/config.md's names) from a JSON object's text.
Overrides parse_overrides(const std::string& text) {
  Overrides o;
  const nlohmann::json j = nlohmann::json::parse(text);
  for (auto it = j.begin(); it != j.end(); ++it) o[it.key()] = it.value();
  return o;
}

nlohmann::json parse_json(const std::string& text, const char* what) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw ConfigError(cat(what, ": not valid JSON"));
  return j;
}

// A micro-batch as the model takes it: inputs and targets (B, T) int32.
struct ModelBatch {
  std::vector<std::int32_t> inputs, targets;
  std::vector<std::int32_t> positions;  // (B, T) or empty: no position_ids
  const std::int32_t* positions_or_null() const { return positions.empty() ? nullptr : positions.data(); }
  int B = 0, T = 0;
  std::optional<std::int64_t> step_counted;  // num_items_in_batch
};

}  // namespace

class Core {
 public:
  // config: a file path (config_is_path) or a JSON document's text; overrides: a JSON object's text.
  Core(const std::string& config, bool config_is_path, const std::string& overrides,
       const std::variant<model::ModelConfig, std::string>& model_spec, int seq_len,
       const std::string& backend, std::uint64_t device_memory_cap,
       std::optional<bool> checkpoint_activations, const std::string& adapter) {
    const comm::RankInfo ri = session::ranks();  // as strata train
    source_ = resolve_model(model_spec);
    // Checked before the config, as strata train does.
    seq_len_ = session::resolve_seq_len(source_.config, seq_len, "initialize: seq_len");
    cfg_ = session::resolve_config(
        config_is_path ? session::ConfigSource{.path = config, .doc = std::nullopt, .origin = config}
                       : session::ConfigSource{.path = "",
                                               .doc = parse_json(config, "initialize(config=dict)"),
                                               .origin = "initialize(config=dict)"},
        parse_overrides(overrides), source_.config, ri);
    // LoRA adapters (session/adapters.h): the config's strata.lora, or those of adapter=DIR, as strata train.
    cfg_.strata.lora.adapter_dir = adapter;
    session::resolve_adapters(source_, cfg_.strata.lora, adapter, "initialize(adapter=...)");
    ri_ = ri;
    collective("strata.initialize", [&] {
      // The files the engine writes from its start, the trace and rank 0's monitors (Note [Outputs up
      // front] in session/session.cpp); the checkpoints and the export are checked when they are written,
      // the same way.
      session::check_outputs(
          {.trace = cfg_.strata.memprof.path, .monitors = session::monitor_outputs(cfg_, ri.rank)});
      py::gil_scoped_release nogil;
      session::Trainer t = session::build(cfg_, source_, seq_len_, ri,
                                          {.backend = backend,
                                           .device_memory_cap = device_memory_cap,
                                           .checkpoint_activations = checkpoint_activations,
                                           .weights_flag = "initialize(model=...)",
                                           .adapter_flag = "initialize(adapter=...)"});
      engine_ = std::move(t.engine);
      model_ = std::move(t.model);
    });
  }

  // ---- the loop ----
  // The forward of one micro-batch (Note [Batches from Python]); returns its loss. Drops a pending forward.
  float forward(py::handle input_ids, py::handle labels, std::optional<std::int64_t> num_items_in_batch,
                py::handle position_ids) {
    zero3::Engine& e = engine();
    ModelBatch b =
        agreed_batch(input_ids, labels, num_items_in_batch, position_ids, "engine(input_ids, labels)");
    const float loss = collective("engine(input_ids, labels)", [&] {
      py::gil_scoped_release nogil;
      if (e.forward_pending()) e.abandon_forward();
      return e.forward(*model_, b.inputs.data(), b.targets.data(), b.B, b.T, b.positions_or_null());
    });
    step_counted_ = b.step_counted;  // for this forward's backward
    return loss;
  }

  void backward() {
    zero3::Engine& e = engine();
    collective("engine.backward(loss)", [&] {
      if (!e.forward_pending())
        throw Error(
            "engine.backward(loss): no forward to take the gradients of; call loss = engine(input_ids) "
            "first");
      py::gil_scoped_release nogil;
      e.backward(*model_, step_counted_);
    });
  }

  bool forward_pending() { return engine().forward_pending(); }
  int pending_micro_steps() { return engine().pending_micro_steps(); }

  py::dict step() {
    zero3::Engine& e = engine();
    zero3::StepResult r;
    collective("engine.step()", [&] {
      py::gil_scoped_release nogil;
      if (e.forward_pending()) e.abandon_forward();
      r = e.step();
      write_monitors(e, r);
    });
    py::dict d;
    d["step"] = r.step;
    d["loss"] = r.loss;
    d["applied"] = r.applied;
    d["grad_norm"] = r.grad_norm;
    d["lr"] = r.lr;
    d["loss_scale"] = r.loss_scale;
    d["tokens"] = r.tokens;
    d["counted"] = r.counted;
    py::dict t;
    t["forward"] = r.times.forward;
    t["backward"] = r.times.backward;
    t["optimizer"] = r.times.optimizer;
    t["wait"] = r.times.wait;
    t["total"] = r.times.total;
    d["times"] = t;
    return d;
  }

  // The loss of a micro-batch without gradients (the model's forward outside a training pass, as
  // model::evaluate runs it). Drops a pending forward.
  float eval_loss(py::handle input_ids, py::handle labels, py::handle position_ids) {
    zero3::Engine& e = engine();
    ModelBatch b =
        agreed_batch(input_ids, labels, std::nullopt, position_ids, "engine.eval_loss(input_ids, labels)");
    return collective("engine.eval_loss(input_ids, labels)", [&] {
      py::gil_scoped_release nogil;
      if (e.forward_pending()) e.abandon_forward();
      return model_->forward(e, b.inputs.data(), b.targets.data(), b.B, b.T, b.positions_or_null());
    });
  }

  // ---- checkpoints and export ----
  std::string save_checkpoint(const std::string& dir, const std::string& tag, const std::string& client_state,
                              TokenLoader* data) {
    zero3::Engine& e = engine();
    between_steps("save_checkpoint");
    const nlohmann::json cs = parse_json(client_state, "save_checkpoint: client_state");
    return collective("engine.save_checkpoint", [&] {
      check_written(e, {.save = {dir, "engine.save_checkpoint(save_dir)"}});
      py::gil_scoped_release nogil;
      return e.save_checkpoint(dir, cs, data ? &data->loader() : nullptr, tag);
    });
  }

  // (path, client_state as JSON text), or None when `dir` has no `latest` and no tag is given.
  std::optional<std::pair<std::string, std::string>> load_checkpoint(const std::string& dir,
                                                                     const std::string& tag,
                                                                     TokenLoader* data) {
    zero3::Engine& e = engine();
    between_steps("load_checkpoint");
    if (tag.empty() && !fs::exists(fs::path(dir) / "latest")) return std::nullopt;
    return collective("engine.load_checkpoint", [&] {
      py::gil_scoped_release nogil;
      const std::string used = tag.empty() ? zero3::latest_tag(dir) : tag;
      const nlohmann::json cs = e.load_checkpoint(dir, used, data ? &data->loader() : nullptr);
      // The monitors continue from the loaded step at the next step (Note [Monitors]).
      monitors_.reset();
      resumed_step_ = e.global_step();
      return std::make_optional(std::make_pair((fs::path(dir) / used).string(), cs.dump()));
    });
  }

  // With adapters: merged false writes the PEFT adapter directory, true the model with them merged
  // (session/adapters.h); without, the model (merged true is refused: nothing to merge).
  void export_model(const std::string& path, bool merged) {
    zero3::Engine& e = engine();
    if (e.forward_pending()) e.abandon_forward();
    if (path.empty()) throw ConfigError("engine.export: give a directory (or NAME.safetensors for one file)");
    const bool adapters = source_.config.lora.active();
    if (merged && !adapters)
      throw ConfigError(
          "engine.export(path, merged=True) merges LoRA adapters into their base, and this engine "
          "has none (strata.lora or adapter=); engine.export(path) writes the model");
    if (adapters && !merged && path.ends_with(".safetensors"))
      throw ConfigError(cat("engine.export(", path,
                            "): with adapters export writes a PEFT adapter directory; give a directory, or "
                            "merged=True for the merged model in one file"));
    collective("engine.export", [&] {
      check_written(e, {.export_to = {path, "engine.export(path)"}});
      py::gil_scoped_release nogil;
      if (adapters && merged)
        session::export_merged(e, path, source_);
      else if (adapters)
        session::export_adapter(e, path, source_);
      else
        zero3::export_model(e, path, source_.hf ? source_.hf->dir : std::string());
    });
  }

  // ---- data ----
  std::unique_ptr<TokenLoader> token_loader(const std::string& path, bool shuffle) {
    return std::make_unique<TokenLoader>(
        path, session::loader_options(engine(), cfg_, source_.config, seq_len_, {.shuffle = shuffle}));
  }

  // ---- state ----
  std::int64_t global_step() { return engine().global_step(); }
  std::int64_t skipped_steps() { return engine().skipped_steps(); }
  double loss_scale() { return engine().loss_scale(); }
  double lr() { return engine().lr(); }
  int micro_batch() { return engine().micro_batch(); }
  int accumulation_steps() { return engine().accumulation_steps(); }
  std::int64_t train_batch_size() { return cfg_.train_batch_size; }
  int rank() { return engine().communicator().rank(); }
  int world_size() { return engine().communicator().world_size(); }
  int local_rank() const { return ri_.local_rank; }
  int seq_len() const { return seq_len_; }
  std::string config_json() const { return cfg_.to_json().dump(); }
  const model::ModelConfig& model_config() const { return source_.config; }
  std::string device_name() { return engine().device().caps().name; }
  std::uint64_t device_capacity() { return engine().device().caps().capacity; }
  std::string memory_snapshot() {
    zero3::Engine& e = engine();
    py::gil_scoped_release nogil;
    return e.tiers().snapshot(/*with_events=*/false).to_json().dump();
  }
  // The plan as one document (zero3::to_json(MemoryPlan)), with each chunk's update route in words (Note
  // [Update routes] in zero3/placement.cpp); the package's Engine.memory_plan reads it as a dict.
  std::string memory_plan() {
    nlohmann::json j = zero3::to_json(engine().plan());
    nlohmann::json& routes = j["update_routes"] = nlohmann::json::array();
    for (const zero3::UpdateRoute& r : engine().update_routes()) routes.push_back(zero3::describe(r));
    // The step-time model's prediction for this plan and the rates it took (zero3/step_time.h); with offload
    // devices "auto", the placements it chose from.
    const zero3::Engine& e = engine();
    j["predicted_step"] = zero3::to_json(e.predicted_step());
    j["machine"] = zero3::to_json(e.machine_rates());
    nlohmann::json& options = j["placements"] = nlohmann::json::array();
    for (std::size_t i = 0; i < e.placements().size(); ++i) {
      const zero3::PlacementOption& o = e.placements()[i];
      options.push_back({{"placement", zero3::placement_name(o)},
                         {"fits", o.fits},
                         {"why_not", o.why_not},
                         {"device_need", o.device_need},
                         {"host_need", o.host_need},
                         {"predicted_step", o.predicted.step},
                         {"bottleneck", o.predicted.bottleneck},
                         {"chosen", int(i) == e.chosen_placement()}});
    }
    return j.dump();
  }

  // Frees the device, pinned memory and swap files now rather than when Python collects the object.
  void close() {
    py::gil_scoped_release nogil;
    monitors_.reset();
    model_.reset();
    engine_.reset();
  }
  bool closed() const { return !engine_; }

 private:
  zero3::Engine& engine() {
    if (!engine_) throw Error("the engine is closed (engine.close() was called); initialize a new one");
    return *engine_;
  }

  // A checkpoint's or the export's destination, checked as strata train checks --save and --export before
  // its first step: the directory created and writable, with room for what goes there.
  void check_written(zero3::Engine& e, const session::OutputPlan& plan) {
    session::check_outputs(plan);
    session::check_output_room(plan, session::output_sizes(e, ri_), ri_.local_size);
  }

  // Every optimizer step's csv_monitor and tensorboard events, as strata train writes them (Note [Monitors]
  // in session/monitors.cpp): opened at the first step, continuing a loaded checkpoint's rows.
  void write_monitors(zero3::Engine& e, const zero3::StepResult& r) {
    if (!monitors_) {
      monitors_.emplace(cfg_, e, resumed_step_);
      for (const std::string& d : monitors_->destinations()) STRATA_LOG_INFO("metrics: ", d);
    }
    monitors_->write_step(e, r);
  }

  // Checkpoints are taken between optimizer steps (the engine's rule), with no forward pending.
  void between_steps(const char* what) {
    zero3::Engine& e = engine();
    if (e.pending_micro_steps() > 0)
      throw Error(
          cat("engine.", what, ": ", e.pending_micro_steps(), " of ", e.accumulation_steps(),
              " micro-batches of the next optimizer step have run; call it after the step() that ends "
              "the accumulation (is_gradient_accumulation_boundary())"));
    if (e.forward_pending()) e.abandon_forward();
  }

  // Note [Errors at several ranks]: the calls every rank makes together (initialize, the forward,
  // backward, step, eval_loss, the checkpoints, export) must not fail on one rank alone, or the others
  // wait in its collectives for ever. The batch checks depend on each rank's data, so the ranks agree on
  // them before the forward (agreed_batch): when any rank's batch is refused, every rank raises (that
  // rank with its reason). Any other error inside such a call at several ranks ends the job, as
  // `strata train` does: the message with the rank on stderr, then comm::abort_all (every process exits
  // with status 1 within seconds). At one rank every error is raised.
  template <class F>
  auto collective(const char* call, F&& f) -> decltype(f()) {
    if (ri_.world_size == 1) return f();
    try {
      return f();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "strata: error on rank %d of %d in %s: %s\n", ri_.rank, ri_.world_size, call,
                   e.what());
      std::fflush(stderr);
      comm::abort_all(1);
    }
  }

  ModelBatch agreed_batch(py::handle input_ids, py::handle labels, std::optional<std::int64_t> items,
                          py::handle position_ids, const char* call) {
    std::exception_ptr refused;
    ModelBatch b;
    try {
      b = to_model_batch(input_ids, labels, items, position_ids, call);
    } catch (...) {
      refused = std::current_exception();
    }
    if (ri_.world_size > 1) {
      comm::Communicator& c = engine().communicator();
      bool all = false;
      {
        py::gil_scoped_release nogil;
        all = c.all_reduce_and(refused == nullptr);
      }
      if (!all && !refused)
        throw ConfigError(cat(call,
                              ": the batch of another rank was refused (its error says why); every rank "
                              "raises, so that none waits for the others"));
    }
    if (refused) std::rethrow_exception(refused);
    return b;
  }

  ModelBatch to_model_batch(py::handle input_ids, py::handle labels, std::optional<std::int64_t> items,
                            py::handle position_ids, const char* call) {
    const TokenArray ids = read_tokens(input_ids, "input_ids");
    std::optional<TokenArray> lab, pos;
    if (!labels.is_none()) lab = read_tokens(labels, "labels");
    if (!position_ids.is_none()) pos = read_tokens(position_ids, "position_ids");
    const std::int64_t V = source_.config.vocab_size;
    const int mb = engine().micro_batch();
    if (ids.rows < 1 || ids.rows > mb)
      throw ConfigError(cat(call, ": input_ids has ", ids.rows, " rows; a micro-batch holds 1 to ", mb,
                            " (train_micro_batch_size_per_gpu)"));
    if (ids.cols < 2)
      throw ConfigError(
          cat(call, ": input_ids rows hold ", ids.cols,
              " token(s); at least 2 are needed (position t is trained to predict token t + 1)"));
    if (ids.cols - 1 > seq_len_)
      throw ConfigError(cat(call, ": input_ids rows hold ", ids.cols, " tokens, so the model would run over ",
                            ids.cols - 1, "; the engine planned for seq_len ", seq_len_,
                            " (give initialize(seq_len=...) the longest sequence you feed)"));
    if (lab && (lab->rows != ids.rows || lab->cols != ids.cols))
      throw ConfigError(cat(call, ": labels have shape (", lab->rows, ", ", lab->cols, "), input_ids (",
                            ids.rows, ", ", ids.cols, "); give them the same shape"));
    if (pos && (pos->rows != ids.rows || pos->cols != ids.cols))
      throw ConfigError(cat(call, ": position_ids have shape (", pos->rows, ", ", pos->cols, "), input_ids (",
                            ids.rows, ", ", ids.cols, "); give them the same shape"));
    ModelBatch b;
    b.B = ids.rows;
    b.T = ids.cols - 1;
    b.inputs.resize(std::size_t(b.B) * std::size_t(b.T));
    b.targets.resize(b.inputs.size());
    const TokenArray& tgt = lab ? *lab : ids;
    for (int r = 0; r < b.B; ++r) {
      for (int c = 0; c < ids.cols; ++c) {
        const std::int64_t v = ids.at(r, c);
        if (v < 0 || v >= V)
          throw ConfigError(cat(call, ": input_ids[", r, ", ", c, "] is ", v,
                                ", outside the model's vocabulary [0, ", V, ")"));
        const std::int64_t l = tgt.at(r, c);
        if (l >= V)
          throw ConfigError(cat(call, ": labels[", r, ", ", c, "] is ", l,
                                ", outside the model's vocabulary [0, ", V,
                                ") (a negative label, e.g. -100, is ignored)"));
      }
      for (int t = 0; t < b.T; ++t) {
        const std::size_t at = std::size_t(r) * std::size_t(b.T) + std::size_t(t);
        b.inputs[at] = std::int32_t(ids.at(r, t));
        const std::int64_t l = tgt.at(r, t + 1);
        b.targets[at] = l < 0 ? model::kIgnoreTarget : std::int32_t(l);
      }
    }
    if (pos) {  // the model's columns; it refuses positions that are not documents' (ConfigError)
      b.positions.resize(b.inputs.size());
      for (int r = 0; r < b.B; ++r)
        for (int t = 0; t < b.T; ++t) {
          const std::int64_t p = pos->at(r, t);
          b.positions[std::size_t(r) * std::size_t(b.T) + std::size_t(t)] =
              p < INT32_MIN || p > INT32_MAX ? -1 : std::int32_t(p);
        }
      model::check_document_positions(b.positions.data(), b.B, b.T, call);
    }
    if (items) {
      std::int64_t counted = 0;
      for (const std::int32_t t : b.targets) counted += t >= 0 ? 1 : 0;
      if (*items < counted)
        throw ConfigError(cat(call, ": num_items_in_batch is ", *items, ", fewer than the ", counted,
                              " labels of this micro-batch that count (those >= 0 after the shift); give the "
                              "labels that count in every micro-batch of the optimizer step on every rank"));
      b.step_counted = items;
    }
    return b;
  }

  Config cfg_;
  session::ModelSource source_;  // the model and, for a Hugging Face one, where its weights are
  comm::RankInfo ri_;            // the launcher's (session::ranks)
  int seq_len_ = 0;
  std::optional<std::int64_t> step_counted_;  // the pending forward's num_items_in_batch
  // csv_monitor and tensorboard (rank 0's), opened at the first optimizer step after initialize or a
  // load_checkpoint; resumed_step_: the global step the last load_checkpoint loaded (nullopt: none).
  std::optional<session::Monitors> monitors_;
  std::optional<std::int64_t> resumed_step_;
  std::unique_ptr<zero3::Engine> engine_;
  std::unique_ptr<model::TrainableModel> model_;  // runs on engine_'s device: destroyed first
};

void bind_engine(py::module_& m) {
  py::class_<Core>(m, "Core", "One training run's engine and model (the package's Engine wraps it)")
      .def(py::init<const std::string&, bool, const std::string&,
                    const std::variant<model::ModelConfig, std::string>&, int, const std::string&,
                    std::uint64_t, std::optional<bool>, const std::string&>(),
           py::arg("config"), py::arg("config_is_path"), py::arg("overrides"), py::arg("model"),
           py::arg("seq_len"), py::arg("backend"), py::arg("device_memory_cap"),
           py::arg("checkpoint_activations"), py::arg("adapter") = std::string())
      .def("forward", &Core::forward, py::arg("input_ids"), py::arg("labels") = py::none(),
           py::arg("num_items_in_batch") = py::none(), py::arg("position_ids") = py::none())
      .def("backward", &Core::backward)
      .def("step", &Core::step)
      .def("eval_loss", &Core::eval_loss, py::arg("input_ids"), py::arg("labels") = py::none(),
           py::arg("position_ids") = py::none())
      .def_property_readonly("forward_pending", &Core::forward_pending)
      .def_property_readonly("pending_micro_steps", &Core::pending_micro_steps)
      .def("save_checkpoint", &Core::save_checkpoint, py::arg("dir"), py::arg("tag"), py::arg("client_state"),
           py::arg("data_loader").none(true))
      .def("load_checkpoint", &Core::load_checkpoint, py::arg("dir"), py::arg("tag"),
           py::arg("data_loader").none(true))
      .def("export", &Core::export_model, py::arg("path"), py::arg("merged") = false)
      .def("token_loader", &Core::token_loader, py::arg("path"), py::arg("shuffle") = true)
      .def_property_readonly("global_step", &Core::global_step)
      .def_property_readonly("skipped_steps", &Core::skipped_steps)
      .def_property_readonly("loss_scale", &Core::loss_scale)
      .def_property_readonly("lr", &Core::lr)
      .def_property_readonly("micro_batch", &Core::micro_batch)
      .def_property_readonly("accumulation_steps", &Core::accumulation_steps)
      .def_property_readonly("train_batch_size", &Core::train_batch_size)
      .def_property_readonly("rank", &Core::rank)
      .def_property_readonly("world_size", &Core::world_size)
      .def_property_readonly("local_rank", &Core::local_rank)
      .def_property_readonly("seq_len", &Core::seq_len)
      .def_property_readonly("config_json", &Core::config_json)
      .def_property_readonly("model_config", &Core::model_config)
      .def_property_readonly("device_name", &Core::device_name)
      .def_property_readonly("device_capacity", &Core::device_capacity)
      .def("memory_snapshot", &Core::memory_snapshot)
      .def("memory_plan", &Core::memory_plan)
      .def("close", &Core::close)
      .def_property_readonly("closed", &Core::closed);

  py::class_<comm::RankInfo>(m, "RankInfo")
      .def_readonly("rank", &comm::RankInfo::rank)
      .def_readonly("world_size", &comm::RankInfo::world_size)
      .def_readonly("local_rank", &comm::RankInfo::local_rank)
      .def_readonly("local_size", &comm::RankInfo::local_size)
      .def_readonly("launched", &comm::RankInfo::launched);
  m.def("rank_from_env", &comm::rank_from_env,
        "The MPI launcher's rank, world size and local rank (environment)");
  m.def(
      "parse_byte_size",
      [](const std::string& text, const std::string& what) { return parse_byte_size(text, what); },
      py::arg("text"), py::arg("what"),
      "A byte size as the config reads one: 1073741824, \"1GiB\", \"64MiB\"");
  m.def("abort_job", &comm::abort_all, py::arg("exit_code"),
        "Ends every rank of the job with exit_code (Note [Errors at several ranks])");
  m.def("set_log_rank", &log::set_job_rank, py::arg("rank"),
        "Log lines carry this rank; ranks other than 0 log warnings and errors only");
}

}  // namespace strata::python
