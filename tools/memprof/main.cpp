// memprof: where the memory of a Strata run went.
//
//   memprof summary TRACE [--json] [--top N]
//       peaks per tier and kind, moves, evictions, OOMs, largest tensors
//   memprof html TRACE -o out.html
//       one self-contained page: stacked timeline per tier and kind
//   memprof estimate (--params N --largest-layer M | --model PRESET) [--config ds.json]
//                    [--backend cuda|host] [--world W] [--nodes K] [--json]
//       bytes per tier for each offload setting: the engine's memory plan, and DeepSpeed's estimator
//
// TRACE is the file a run wrote with strata.memprof.path set (docs/memprof.md).
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "core/error.h"
#include "session/adapters.h"
#include "session/session.h"
#include "tools/memprof/html.h"
#include "tools/memprof/memprof.h"

namespace {

using strata::ConfigError;

// "7e9", "7000000000", "7B", "1.5T", "350M", "64K" (powers of 10, as parameter counts are written).
std::uint64_t parse_count(const std::string& s, const char* option) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string rest = used ? s.substr(used) : s;
  double scale = 1;
  if (rest == "K" || rest == "k")
    scale = 1e3;
  else if (rest == "M")
    scale = 1e6;
  else if (rest == "B" || rest == "G")
    scale = 1e9;
  else if (rest == "T")
    scale = 1e12;
  else if (!rest.empty())
    used = 0;
  double n = v * scale;
  if (!used || !(n >= 1) || n > 1e18 || std::floor(n) != n)
    throw ConfigError(strata::detail::cat(
        option, ": \"", s, "\" is not a whole positive count (e.g. 7000000000, 7e9, 7B, 350M)"));
  return std::uint64_t(n);
}

int run_summary(const std::string& path, bool as_json, std::size_t top) {
  strata::memprof::Summary s = strata::memprof::summarize(strata::memprof::read_trace(path), top);
  if (as_json)
    std::cout << strata::memprof::summary_json(s).dump(2) << "\n";
  else
    std::cout << strata::memprof::format_summary(s);
  return 0;
}

int run_html(const std::string& path, const std::string& out, std::size_t max_points) {
  strata::memprof::Trace tr = strata::memprof::read_trace(path);
  std::string page = strata::memprof::render_html(tr, {.max_points = max_points, .title = ""});
  std::ofstream f(out, std::ios::binary);
  if (!f)
    throw strata::IoError(
        strata::detail::cat("cannot write ", out, " (", strata::detail::errno_text(errno), ")"));
  f << page;
  f.close();
  if (!f) throw strata::IoError(strata::detail::cat("writing ", out, " failed"));
  std::cout << "wrote " << out << " (" << page.size() << " bytes, self-contained)\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"memprof: where the memory of a Strata run went (device, pinned host, NVMe)"};
  app.require_subcommand(1);

  std::string trace, out = "memprof.html";
  bool as_json = false;
  std::size_t top = 10, max_points = 4000;
  auto* summary =
      app.add_subcommand("summary", "Peaks per tier and kind, moves, evictions, OOMs, largest tensors");
  summary->add_option("TRACE", trace, "trace file written with strata.memprof.path")->required();
  summary->add_flag("--json", as_json, "print the summary as JSON (schema strata.memprof)");
  summary->add_option("--top", top, "largest tensors to list")->capture_default_str();

  auto* html = app.add_subcommand("html", "Write one self-contained HTML page with the timeline");
  html->add_option("TRACE", trace, "trace file written with strata.memprof.path")->required();
  html->add_option("-o,--output", out, "the page to write")->capture_default_str();
  html->add_option("--max-points", max_points, "timeline points per tier (peaks are kept)")
      ->capture_default_str();

  std::string params, largest, sub_group = "1e9", model, config;
  strata::memprof::EstimateInput in;
  auto* est =
      app.add_subcommand("estimate", "Bytes per tier for each offload setting: ours and DeepSpeed's ZeRO-3");
  auto* p_opt = est->add_option("--params", params, "total parameters (7000000000, 7e9, 7B)");
  auto* l_opt = est->add_option("--largest-layer", largest, "parameters of the largest layer");
  auto* m_opt = est->add_option(
      "--model", model,
      "a model preset (10m, 1b, llama2-7b, ...) or model JSON file, as strata train takes: its "
      "real chunks");
  m_opt->excludes(p_opt)->excludes(l_opt);
  p_opt->needs(l_opt);
  l_opt->needs(p_opt);
  est->add_option("--config", config,
                  "DeepSpeed config whose knobs to use (sub_group_size, NVMe buffers, ...)");
  est->add_option("--backend", in.backend,
                  "cuda (chunks gathered in bf16) or host (bf16 with bf16 enabled, else fp32)")
      ->capture_default_str();
  est->add_option("--world", in.world, "GPUs in all")->capture_default_str();
  est->add_option("--nodes", in.nodes, "nodes (GPUs per node = world / nodes)")->capture_default_str();
  est->add_option("--sub-group-size", sub_group, "zero_optimization.sub_group_size")->capture_default_str();
  est->add_option("--buffer-factor", in.buffer_factor, "DeepSpeed's additional_buffer_factor")
      ->capture_default_str();
  std::string machine;
  est->add_option(
      "--machine", machine,
      "a described machine (JSON; docs/train.md, \"Predicted step times\"): with --model, each setting "
      "planned whole on it and its step predicted");
  est->add_option("--seq-len", in.seq_len,
                  "tokens a row for --machine's plans (default: the model's max_seq_len)");
  est->add_flag("--json", as_json, "print the table as JSON");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (*summary) return run_summary(trace, as_json, top);
    if (*html) return run_html(trace, out, max_points);
    if (model.empty() && params.empty())
      throw ConfigError(
          "memprof estimate: give --model PRESET_OR_JSON, or --params N with --largest-layer M");
    // What strata train's --model takes: a model JSON file, else a preset's name.
    if (!model.empty())
      in.model = strata::session::open_model(model, strata::session::Weights::fresh_only).config;
    if (!params.empty()) {
      in.params = parse_count(params, "--params");
      in.largest_layer = parse_count(largest, "--largest-layer");
    }
    // Memory does not depend on the schedule: a length the config leaves to the run stays open.
    if (!config.empty()) in.config = strata::Config::load(config, {}, in.world, {.length_later = true});
    // strata.lora: the adapters over the model, its base frozen (a working copy alone, as training plans it).
    if (in.config && in.config->strata.lora.enabled) {
      if (!in.model)
        throw ConfigError("memprof estimate: the config's strata.lora adapts a model; give it with --model");
      strata::session::ModelSource src{.config = *in.model, .hf = std::nullopt};
      strata::session::resolve_adapters(src, in.config->strata.lora, "", "--adapter");
      in.model = src.config;
    }
    in.sub_group_size = parse_count(sub_group, "--sub-group-size");
    if (!machine.empty()) in.machine = strata::zero3::load_machine(machine);
    std::vector<strata::memprof::EstimateRow> rows = strata::memprof::estimate(in);
    if (as_json)
      std::cout << strata::memprof::estimate_json(rows, in).dump(2) << "\n";
    else
      std::cout << strata::memprof::format_estimate(rows, in);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memprof: %s\n", e.what());
    return 1;
  }
}
