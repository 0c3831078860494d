// `strata config FILE [--set name=value ...] [--world-size N]`: loads a DeepSpeed-style config the way
// training would, and prints every key's resolved value and where it came from (file, default, auto,
// alias). A bad config fails here with the same message training would give, before any work starts.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "core/device.h"
#include "core/error.h"
#include "core/files.h"
#include "core/topology.h"
#include "cpu_optim/cpu_optim.h"
#include "kernels/ops.h"
#include "kernels/workspace_standin.h"
#include "model/architecture.h"
#include "model/lora.h"
#include "model/nf4_chunk.h"
#include "session/adapters.h"
#include "session/session.h"
#include "tools/cli.h"
#include "zero3/engine_state.h"
#include "zero3/machine.h"
#include "zero3/offline_plan.h"
#include "zero3/placement.h"
#include "zero3/step_time.h"

namespace strata::cli {
namespace {

using detail::cat;

struct ConfigOpts {
  std::string path;
  std::vector<std::string> sets;
  int world_size = 1;
  std::int64_t steps = -1;  // -1: the run's length is not given (it comes at training)
  // The plan for a model (--model): on a device of `device_memory` of `backend`, `seq_len` tokens a row.
  std::string model, backend = "cuda", device_memory;
  int seq_len = 0;
  // --machine FILE: a described machine (zero3/step_time.h) whose step is predicted; its device_memory is
  // the device's size unless --device-memory says.
  std::string machine;
};

// Note [The plan before the machine] (zero3/offline_plan.h): `strata config FILE --model M` plans the run as
// the engine would, for a device given by its size.
//
// Note [Predictions before the machine]: with --machine FILE the step is predicted for the described machine
// (zero3/step_time.h: a GPU's bf16 rate, its memory's, the link's, the CPU optimizer's, the drive's); without
// it, on the host backend, for this machine, its products, attention and elementwise ops measured here by the
// CPU ops at the model's shapes and its link, optimizer and drives taken from strata train's cache of them
// (zero3/machine.h, Note [Measured rates]) or measured now. A cuda plan without --machine is not predicted:
// there is no GPU here to measure. The placements table is "auto"'s (Note [Placement auto]).
// The placement the plan was made for (the config's, or "auto"'s choice), for the wizard.
struct PlannedPlacement {
  OffloadDevice param = OffloadDevice::none, optimizer = OffloadDevice::none;
  double predicted = 0;  // s a step; 0: not predicted
};
PlannedPlacement print_model_plan(Config cfg, const ConfigOpts& opts) {
  session::ModelSource src = session::open_model(opts.model, session::Weights::allowed);
  session::resolve_adapters(src, cfg.strata.lora, "", "--adapter");
  const model::ModelConfig& m = src.config;
  if (opts.backend != "cuda" && opts.backend != "host")
    throw ConfigError(cat("--backend ", opts.backend, ": must be cuda or host"));
  const bool cuda = opts.backend == "cuda";
  std::optional<zero3::MachineRates> rates;
  if (!opts.machine.empty()) rates = zero3::load_machine(opts.machine);
  const std::uint64_t capacity = !opts.device_memory.empty()
                                     ? parse_byte_size(opts.device_memory, "--device-memory")
                                 : rates ? rates->device_memory
                                         : std::uint64_t(80) << 30;
  // A row longer than the model's max_seq_len is refused as strata train refuses it.
  const int T =
      opts.seq_len > 0 ? session::resolve_seq_len(m, opts.seq_len, "--seq-len") : int(m.max_seq_len);
  const int B = int(cfg.train_micro_batch_size_per_gpu), world = opts.world_size;
  zero3::OfflinePlan plan(cfg, m,
                          {.B = B,
                           .T = T,
                           .world = world,
                           .cuda = cuda,
                           .capacity = capacity,
                           .host_memory = rates ? rates->host_memory : zero3::physical_memory()});
  const DType act = plan.activation;
  const model::ModelLayout& layout = plan.layout;
  zero3::PlanInput& in = plan.in;
  const zero3::ActivationSizes& sizes = plan.sizes;
  const std::optional<bool> mode = plan.checkpointing, offload = plan.activation_offload;
  const zero3::PlacementContext& ctx = plan.ctx;
  // The rates of Note [Predictions before the machine].
  if (!rates && !cuda) {
    std::unique_ptr<Stream> copy = plan.dev->create_stream("config-link");
    cpu_optim::Optimizer optimizer(
        {.simd = cfg.strata.cpu_optim.simd, .threads = int(cfg.strata.threads), .pin = false});
    auto adam = [&](std::size_t n) { return zero3::adam_rate(*plan.dev, optimizer, n); };
    const zero3::MeasureKit kit{.dev = *plan.dev,
                                .compute = *plan.stream,
                                .copy = *copy,
                                .ops = *plan.ops,
                                .activation = act,
                                .working = act,
                                .cpu_optimizer = adam,
                                .device_optimizer = adam,
                                .optimizer = &optimizer,
                                .nvme_dirs = zero3::nvme_dirs(cfg),
                                .aio = zero3::aio_options(cfg),
                                .cores = int(allowed_cpus().size())};
    rates = zero3::measure_machine(kit, m, B, T);
    rates->host_memory = zero3::physical_memory();
  }
  // Every placement the stage allows, as "auto" plans them (Note [Placement auto]).
  const auto& z = cfg.zero_optimization;
  std::vector<zero3::PlacementOption> options = zero3::placement_candidates(z, true, true);
  const zero3::MachineRates none_measured;
  const int fastest = zero3::choose_placement(options, ctx, rates ? *rates : none_measured);
  if (z.offload_param.device_auto || z.offload_optimizer.device_auto) {
    std::vector<zero3::PlacementOption> asked =
        zero3::placement_candidates(z, z.offload_param.device_auto, z.offload_optimizer.device_auto);
    const int chosen = zero3::choose_placement(asked, ctx, rates ? *rates : none_measured);
    if (chosen < 0)
      throw OutOfMemory(cat("zero_optimization offload devices \"auto\": no placement fits:\n",
                            zero3::placements_table(asked, -1),
                            "The smallest change that fits: ", zero3::smallest_change(asked, ctx)));
    cfg.zero_optimization.offload_param.device = asked[std::size_t(chosen)].param;
    cfg.zero_optimization.offload_optimizer.device = asked[std::size_t(chosen)].optimizer;
    cfg.zero_optimization.offload_param.device_auto = cfg.zero_optimization.offload_optimizer.device_auto =
        false;
    std::printf("\noffload placement \"auto\" = %s: the fastest that fits (%.3f s a step predicted)\n",
                zero3::placement_name(asked[std::size_t(chosen)]).c_str(),
                asked[std::size_t(chosen)].predicted.step);
    in = zero3::plan_input(cfg, layout, m.tie_embeddings, world, 0, act);
    zero3::plan_adapters(in, layout, cfg.zero_optimization);
    in.device_state_by_ops = cuda;
    in.device_capacity = capacity;
    in.ops = ctx.base.ops;
  }
  const zero3::ActivationChoice choice =
      zero3::choose_activations(in, cfg.zero_optimization, mode, offload, sizes);
  zero3::apply_activations(in, sizes, choice);
  const zero3::Plan p = zero3::plan_memory(in, cfg.zero_optimization);
  zero3::MemoryPlan mp = p.memory;
  zero3::note_activations(mp, sizes, choice);
  std::uint64_t quantised = 0;
  for (int c = 0; c < layout.num_chunks(); ++c)
    if (in.chunks[std::size_t(c)].packed)
      quantised += model::nf4_chunk(layout.chunk(c), in.working, m.lora.double_quant).quantized;
  std::printf("\nplan for %s (%lld parameters%s) on %s: %d x %d tokens a micro-batch%s\n", m.name.c_str(),
              (long long)m.num_parameters(),
              m.lora.active()
                  ? cat("; LoRA r ", m.lora.r, ", ", model::lora_parameters(m), " adapter parameters",
                        m.lora.nf4_base ? cat(", NF4 base: ", quantised, " parameters in 4 bits") : "")
                        .c_str()
                  : "",
              cat(opts.backend, " device of ", format_size(capacity, 1),
                  !opts.device_memory.empty() ? ""
                  : rates                     ? " (the described machine's)"
                                              : " (--device-memory not given: an 80 GiB GPU)")
                  .c_str(),
              B, T, opts.seq_len > 0 ? "" : " (--seq-len not given: the model's max_seq_len)");
  std::fputs(zero3::describe(mp, in.homes.grad, world > 1).c_str(), stdout);
  const std::uint64_t need = mp.device_need();
  std::printf("fits: %s (the step needs %s of the device's %s)\n", need <= capacity ? "yes" : "no",
              format_size(need, 1).c_str(), format_size(capacity, 1).c_str());
  // How long a sequence fits (Note [The plan before the machine]): the same plan at every length.
  const std::int64_t longest = zero3::longest_sequence(
      in, cfg.zero_optimization, m.max_seq_len,
      [&](std::int64_t t) { return zero3::activation_sizes(m, B, int(t), *plan.ops); }, mode, offload);
  std::printf(
      "longest sequence: %lld tokens a row at micro-batch %d fit the device (the model's max_seq_len %lld); "
      "activations %s a token at %d tokens\n",
      (long long)longest, B, (long long)m.max_seq_len,
      format_size(mp.device_activations / std::uint64_t(std::max(1, B * T)), 1).c_str(), T);
  const zero3::LinkBytes link = zero3::link_bytes_per_step(in, p);
  std::printf(
      "host link per step: %s (gathers %s, gradients %s, new working params %s; zero3/placement.h, "
      "link_bytes_per_step)\n",
      format_size(link.total(), 1).c_str(), format_size(link.gathers, 1).c_str(),
      format_size(link.gradients, 1).c_str(), format_size(link.params, 1).c_str());
  std::printf("update routes:\n%s\n", zero3::describe(p.routes, "  ").c_str());
  if (!rates) {
    std::printf(
        "step time: not predicted: there is no GPU here to measure; describe the machine with --machine FILE "
        "(docs/train.md, \"Predicted step times\")\n");
    return {cfg.zero_optimization.offload_param.device, cfg.zero_optimization.offload_optimizer.device, 0};
  }
  zero3::Plan noted = p;  // with the activations' choice (note_activations), as the engine predicts it
  noted.memory = mp;
  const zero3::StepPrediction pred = zero3::predict_step(zero3::step_model(m, B, T, in, noted), *rates);
  std::printf(
      "step time predicted: %.3f s a step on %s (%s; bottleneck %s): the pass %.3f s (compute %.3f, host "
      "link "
      "%.3f, NVMe %.3f), the update after it %.3f s (gradient norm %.3f, CPU optimizer %.3f, NVMe %.3f, "
      "device "
      "optimizer %.3f)%s\n",
      pred.step, rates->name.c_str(), rates->source.c_str(), pred.bottleneck.c_str(), pred.pass, pred.compute,
      pred.link, pred.nvme_pass, pred.update, pred.norm, pred.cpu_optimizer, pred.nvme_optimizer,
      pred.device_optimizer,
      pred.missing.empty() ? "" : cat("; ", pred.missing, " is not known: left out").c_str());
  std::printf(
      "placements (offload_param.device / offload_optimizer.device; \"auto\" takes the one marked *):\n%s",
      zero3::placements_table(options, fastest).c_str());
  return {cfg.zero_optimization.offload_param.device, cfg.zero_optimization.offload_optimizer.device,
          pred.step};
}

int run_config(const ConfigOpts& opts) {
  RunFacts run;
  if (opts.steps >= 0)
    run = {.total_steps = opts.steps, .from = detail::cat("--steps ", opts.steps)};
  else
    run.length_later = true;
  Config cfg = Config::load(opts.path, session::parse_sets(opts.sets), opts.world_size, run);
  std::fputs(cfg.resolved_table().c_str(), stdout);
  // Note [Loud auto] in config/config.cpp: the values chosen for the user, as strata train prints them.
  const std::vector<std::string> chosen = cfg.auto_report();
  if (!chosen.empty()) {
    std::printf("\nvalues chosen for \"auto\" (and left to the run):\n");
    for (const std::string& line : chosen) std::printf("  %s\n", line.c_str());
  }
  // How each chunk is updated as far as the config decides it (Note [Update routes] in
  // zero3/placement.cpp); strata train prints each chunk's, with the model and the device's room.
  std::printf(
      "\nupdate routes (docs/train.md, \"How each chunk is updated\"; strata train prints each chunk's):\n");
  for (const auto& [backend, by_ops] : {std::pair{"cuda", true}, std::pair{"host", false}})
    for (const zero3::ConfigRoute& r : zero3::config_routes(cfg, by_ops))
      std::printf("  %s, %s: %s\n", backend, r.which.c_str(), zero3::describe(r.route).c_str());
  std::printf(
      "  (gradients are summed on the device where the plan leaves room for an accumulator; the overlap with "
      "backward is decided with the host memory: strata.overlap_optimizer)\n");
  if (!opts.model.empty()) print_model_plan(cfg, opts);
  return 0;
}

// ---- `strata config new OUT.json` ----
//
// Note [The config wizard]: questions in the terminal, each with the detected or recommended answer as its
// default, so that Enter alone completes it: the model (a preset, a model JSON or a Hugging Face directory;
// "." where the current directory is one), the row length (the model's, up to 2048) and micro-batch (1),
// the NVMe directories to consider (the writable mount points of /dev/nvme* drives, or none), the
// precision (bf16), the GPU count (those visible, else 1) and the device's memory (the GPU's; on the host
// backend half of the RAM). A flag answers its question (--model, --seq-len, --micro-batch, --nvme-path,
// --precision, --gpus, --device-memory); --yes takes every default left; a closed input (EOF) does too. A
// bad answer is asked again at a terminal, and refused otherwise. Then the placements are planned and
// predicted as "auto" would (print_model_plan: Note [Placement auto]) and the file is written with the
// fastest that fits as concrete devices, sizes as numbers: DeepSpeed's own schema reads it too.
struct WizardOpts {
  std::string out, model, precision, device_memory, backend, machine;
  std::vector<std::string> nvme_paths;
  int seq_len = 0, micro_batch = 0, gpus = 0;
  bool yes = false, force = false;
};

std::string trim(std::string s) {
  const auto space = [](unsigned char c) { return std::isspace(c) != 0; };
  while (!s.empty() && space(static_cast<unsigned char>(s.back()))) s.pop_back();
  std::size_t i = 0;
  while (i < s.size() && space(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

class Asker {
 public:
  Asker(bool yes) : yes_(yes), tty_(::isatty(0) != 0) {}
  // The answer to `question`: `given` (a flag's, named by `flag`) when there is one, else the typed line,
  // else `def`. `check` throws ConfigError for a bad answer, which is asked again at a terminal.
  std::string ask(const std::string& question, const std::string& def, const std::string& given,
                  const std::string& flag, const std::function<void(const std::string&)>& check) {
    if (!given.empty()) {
      std::printf("%s: %s (%s)\n", question.c_str(), given.c_str(), flag.c_str());
      std::fflush(stdout);
      check(given);
      return given;
    }
    for (;;) {
      std::printf("%s [%s]: ", question.c_str(), def.c_str());
      std::fflush(stdout);
      std::string line;
      if (yes_ || closed_ || !std::getline(std::cin, line)) {
        if (!yes_) closed_ = true;
        std::printf("%s\n", def.c_str());
        line = def;
      }
      std::fflush(stdout);
      line = trim(line);
      if (line.empty()) line = def;
      try {
        check(line);
        return line;
      } catch (const ConfigError& e) {
        if (!tty_ || yes_ || closed_) throw;
        std::printf("  %s\n", e.what());
      }
    }
  }

 private:
  bool yes_, tty_, closed_ = false;
};

int positive(const std::string& v, const std::string& what) {
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  if (end == v.c_str() || *end != '\0' || n < 1 || n > 1 << 24)
    throw ConfigError(cat(what, ": \"", v, "\" is not a whole number of at least 1"));
  return int(n);
}

// The writable mount points of NVMe drives (/proc/mounts' /dev/nvme* devices), comma-separated.
std::string detected_nvme() {
  std::ifstream mounts("/proc/mounts");
  std::string dev, dir, rest, found;
  while (mounts >> dev >> dir && std::getline(mounts, rest))
    if (dev.rfind("/dev/nvme", 0) == 0 && probe_writable(dir) == 0 && found.find(dir) == std::string::npos)
      found += (found.empty() ? "" : ",") + dir;
  return found;
}

std::vector<std::string> split_dirs(const std::string& v) {
  std::vector<std::string> dirs;
  if (v == "none") return dirs;
  std::stringstream in(v);
  for (std::string d; std::getline(in, d, ',');)
    if (!trim(d).empty()) dirs.push_back(trim(d));
  return dirs;
}

int run_wizard(const WizardOpts& w) {
  if (w.out.empty())
    throw ConfigError("strata config new: give the file to write (strata config new OUT.json)");
  struct stat st {};
  if (!w.force && ::stat(w.out.c_str(), &st) == 0)
    throw ConfigError(
        cat("strata config new: ", w.out, " exists; give another name, or --force to replace it"));
  Asker a(w.yes);
  std::printf("strata config new: Enter takes the answer in brackets\n");
  session::ModelSource src;
  const std::string here = std::ifstream("config.json").good() ? "." : "125m";
  const std::string model =
      a.ask("model (a preset, a model JSON or a Hugging Face directory)", here, w.model, "--model",
            [&](const std::string& v) { src = session::open_model(v, session::Weights::allowed); });
  const std::int64_t longest = std::min<std::int64_t>(src.config.max_seq_len, 2048);
  int T = 0;
  a.ask("tokens a row", std::to_string(longest), w.seq_len > 0 ? std::to_string(w.seq_len) : "", "--seq-len",
        [&](const std::string& v) {
          T = session::resolve_seq_len(src.config, positive(v, "tokens a row"), "tokens a row");
        });
  int B = 0;
  a.ask("micro-batch (rows a GPU computes at once)", "1",
        w.micro_batch > 0 ? std::to_string(w.micro_batch) : "", "--micro-batch",
        [&](const std::string& v) { B = positive(v, "micro-batch"); });
  std::vector<std::string> nvme;
  const std::string drives = detected_nvme();
  std::string given_nvme;
  for (const std::string& d : w.nvme_paths) given_nvme += (given_nvme.empty() ? "" : ",") + d;
  a.ask("NVMe directories to consider for offload (comma-separated, or none)",
        drives.empty() ? "none" : drives, given_nvme, "--nvme-path", [&](const std::string& v) {
          nvme = split_dirs(v);
          for (const std::string& d : nvme)
            if (const int err = probe_writable(d); err != 0)
              throw ConfigError(cat("NVMe directory ", d, ": cannot create a file there (",
                                    detail::errno_text(err), "); give a writable directory, or none"));
        });
  std::string precision;
  a.ask("precision (bf16, fp16 or fp32)", "bf16", w.precision, "--precision", [&](const std::string& v) {
    if (v != "bf16" && v != "fp16" && v != "fp32")
      throw ConfigError(cat("precision: \"", v, "\" is not bf16, fp16 or fp32"));
    precision = v;
  });
  std::string why;
  const int visible = cuda_device_count(&why);
  int gpus = 0;
  a.ask("GPUs to train on", std::to_string(std::max(1, visible)), w.gpus > 0 ? std::to_string(w.gpus) : "",
        "--gpus", [&](const std::string& v) { gpus = positive(v, "GPUs"); });
  const std::string backend = !w.backend.empty() ? w.backend : visible > 0 ? "cuda" : "host";
  std::string detected_memory;
  if (backend == "cuda" && visible > 0) {
    detected_memory = format_size(
        open_device({.backend = "cuda", .ordinal = 0, .memory_cap = 0})->caps().physical_bytes, 0);
  } else {
    detected_memory = format_size(zero3::physical_memory() / 2, 0);
  }
  detected_memory.erase(std::remove(detected_memory.begin(), detected_memory.end(), ' '),
                        detected_memory.end());
  std::string device_memory;
  a.ask(backend == "cuda" ? "GPU memory"
                          : "device memory (the host backend's: host memory standing in for a GPU)",
        detected_memory, w.device_memory, "--device-memory",
        [&](const std::string& v) { device_memory = v, (void)parse_byte_size(v, "device memory"); });

  // The file, with the offload devices "auto" until the plan has chosen.
  nlohmann::json doc = {
      {"train_micro_batch_size_per_gpu", B},
      {"gradient_accumulation_steps", 1},
      {"train_batch_size", B * gpus},
      {"gradient_clipping", 1.0},
      {"steps_per_print", 10},
      {"optimizer",
       {{"type", "AdamW"},
        {"params", {{"lr", 2e-5}, {"betas", {0.9, 0.999}}, {"eps", 1e-8}, {"weight_decay", 0.0}}}}},
      {"zero_optimization",
       {{"stage", 3},
        {"offload_param", {{"device", "auto"}, {"pin_memory", true}}},
        {"offload_optimizer", {{"device", "auto"}, {"pin_memory", true}}},
        {"overlap_comm", true},
        {"contiguous_gradients", true},
        {"sub_group_size", 1000000000},
        {"stage3_prefetch_bucket_size", 50000000},
        {"stage3_param_persistence_threshold", 100000},
        {"stage3_max_live_parameters", 1000000000},
        {"stage3_max_reuse_distance", 1000000000}}}};
  if (precision == "bf16") doc["bf16"] = {{"enabled", true}};
  if (precision == "fp16") doc["fp16"] = {{"enabled", true}};
  if (!nvme.empty()) {
    const nlohmann::json path = nvme.size() == 1 ? nlohmann::json(nvme[0]) : nlohmann::json(nvme);
    doc["zero_optimization"]["offload_param"]["nvme_path"] = path;
    doc["zero_optimization"]["offload_optimizer"]["nvme_path"] = path;
  }
  const Config draft = Config::parse(nlohmann::json::parse(doc.dump()), {}, gpus, "strata config new",
                                     RunFacts{.length_later = true});
  ConfigOpts plan;
  plan.model = model;
  plan.backend = backend;
  plan.device_memory = device_memory;
  plan.seq_len = T;
  plan.machine = w.machine;
  const PlannedPlacement chosen = print_model_plan(draft, plan);
  auto& z = doc["zero_optimization"];
  z["offload_param"]["device"] = offload_device_name(chosen.param);
  z["offload_optimizer"]["device"] = offload_device_name(chosen.optimizer);
  if (chosen.param != OffloadDevice::nvme) z["offload_param"].erase("nvme_path");
  if (chosen.optimizer != OffloadDevice::nvme) z["offload_optimizer"].erase("nvme_path");
  // The file trains as it was planned: on the host backend, host memory stands in for the device up to the
  // answer (with no cap, all of it); on a GPU, an answer under its memory caps what Strata takes of it.
  std::string device_note;
  if (backend == "host") {
    doc["strata"]["backend"] = "host";
    doc["strata"]["device_memory_cap"] = device_memory;
    device_note = cat("strata.backend \"host\" and strata.device_memory_cap ", device_memory,
                      ": the device planned for (uncapped, the host backend's device is all of the RAM)\n");
  } else if (parse_byte_size(device_memory, "device memory") !=
             parse_byte_size(detected_memory, "GPU memory")) {
    doc["strata"]["device_memory_cap"] = device_memory;
    device_note = cat("strata.device_memory_cap ", device_memory, ": the GPU memory answered, under the ",
                      detected_memory, " detected\n");
  }
  {
    std::ofstream f(w.out);
    if (!f)
      throw ConfigError(cat("strata config new: cannot write ", w.out, " (", detail::errno_text(errno), ")"));
    f << doc.dump(2) << "\n";
  }
  char predicted[64] = "";
  if (chosen.predicted > 0)
    std::snprintf(predicted, sizeof predicted, ", %.3g s a step predicted", chosen.predicted);
  std::printf(
      "\nwrote %s: offload param %s / optimizer %s%s\ntrain with: strata train --config %s --model %s "
      "--seq-len %d --text FILE\n",
      w.out.c_str(), offload_device_name(chosen.param), offload_device_name(chosen.optimizer), predicted,
      w.out.c_str(), model.c_str(), T);
  std::fputs(device_note.c_str(), stdout);
  return 0;
}

Command config(
    "config", "Check a DeepSpeed-style config and print every resolved value and its source",
    [](CLI::App& sub) {
      auto o = std::make_shared<ConfigOpts>();
      sub.add_option("file", o->path, "ds_config.json (or: strata config new OUT.json)");
      sub.require_subcommand(0, 1);
      CLI::App* nw = sub.add_subcommand("new",
                                        "Write a config by answering questions (Enter takes each default; "
                                        "docs/train.md, \"Writing a config\")");
      auto w = std::make_shared<WizardOpts>();
      nw->add_option("out", w->out, "The config file to write")->required();
      nw->add_flag("--yes,-y", w->yes, "Take every default the flags leave");
      nw->add_flag("--force", w->force, "Replace OUT if it exists");
      nw->add_option("--model", w->model, "The model: a preset, a model JSON or a Hugging Face directory");
      nw->add_option("--seq-len", w->seq_len, "Tokens a row");
      nw->add_option("--micro-batch", w->micro_batch, "Rows a GPU computes at once");
      nw->add_option("--nvme-path", w->nvme_paths, "An NVMe directory to consider (repeat for more)");
      nw->add_option("--precision", w->precision, "bf16, fp16 or fp32");
      nw->add_option("--gpus", w->gpus, "GPUs to train on");
      nw->add_option("--device-memory", w->device_memory, "The device's memory (e.g. 80GiB)");
      nw->add_option("--backend", w->backend, "cuda or host (default: cuda where a GPU is visible)");
      nw->add_option("--machine", w->machine,
                     "Predict the steps on the machine this JSON describes (docs/train.md, "
                     "\"Predicted step times\")");
      sub.add_option("--set", o->sets, "Resolve an \"auto\" value or override: name=value");
      sub.add_option("--world-size", o->world_size, "Ranks in the job (for batch-size inference)");
      sub.add_option("--steps", o->steps,
                     "The run's optimizer steps, for a schedule whose total is \"auto\" (default: "
                     "left to strata train)")
          ->check(CLI::NonNegativeNumber);
      sub.add_option("--model", o->model,
                     "Plan the run for this model (a preset, a model JSON or a Hugging Face "
                     "directory): the memory plan, whether it fits, the host link's bytes a step");
      sub.add_option("--backend", o->backend, "With --model: the device's kind, cuda or host")
          ->capture_default_str();
      sub.add_option("--device-memory", o->device_memory,
                     "With --model: the device's memory (e.g. 24GiB; default 80GiB)");
      sub.add_option("--seq-len", o->seq_len, "With --model: tokens a row (default: max_seq_len)");
      sub.add_option("--machine", o->machine,
                     "With --model: predict the step on the machine this JSON describes (its GPU "
                     "memory, bf16 rate, link, cores, NVMe; docs/train.md, \"Predicted step times\")");
      return [o, w, nw] {
        if (nw->parsed()) return run_wizard(*w);
        if (o->path.empty())
          throw ConfigError(
              "strata config: give a config FILE to check, or `strata config new OUT.json` "
              "to write one");
        return run_config(*o);
      };
    });

}  // namespace
}  // namespace strata::cli
