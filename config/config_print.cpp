// Config output: the resolved table, the resolved JSON and the markdown reference, all from the schema.
#include <algorithm>

#include "config/config.h"
#include "config/config_impl.h"
#include "core/error.h"

namespace strata {

using namespace config_detail;

namespace {

// offload_optimizer.ratio "auto" reads as 1, and the offload devices' "auto" as none, until the engine has
// chosen: they are shown as what the user asked for.
bool left_to_engine(const Option& o, const Config& cfg) {
  const auto& z = cfg.zero_optimization;
  const std::string_view path(o.path);
  return (z.offload_optimizer.ratio_auto && path == "zero_optimization.offload_optimizer.ratio") ||
         (z.offload_param.device_auto && path == "zero_optimization.offload_param.device") ||
         (z.offload_optimizer.device_auto && path == "zero_optimization.offload_optimizer.device");
}

// A key's value in force, as the resolved table and to_json give it: offload_optimizer.ratio "auto" reads
// as 1 until the engine has measured, and is shown as what the user asked for.
nlohmann::json resolved_value(const Option& o, Config& cfg) {
  if (left_to_engine(o, cfg)) return "auto";
  return read(o, cfg);
}

std::string value_text(const Option& o, Config& cfg) {
  nlohmann::json v = resolved_value(o, cfg);
  if (v.is_null()) return "(unset)";
  if (o.kind == Kind::bytes && v.get<std::uint64_t>() >= 1024) return format_bytes(v.get<std::uint64_t>());
  if (v.is_string()) return v.get<std::string>();
  return show(v);
}

std::string default_text(const Option& o) {
  if (o.default_note) return o.default_note;
  if (o.def.is_null()) return "unset";
  if (o.kind == Kind::bytes && o.def.get<std::uint64_t>() >= 1024) {
    std::string human = format_bytes(o.def.get<std::uint64_t>());
    return detail::cat(o.def.get<std::uint64_t>(), " (", human.substr(0, human.find(" (")), ")");
  }
  if (o.def.is_string()) return o.def.get<std::string>();
  return show(o.def);
}

void set_in(nlohmann::json& root, std::string_view path, const nlohmann::json& v) {
  nlohmann::json* cur = &root;
  std::size_t start = 0;
  for (std::size_t dot; (dot = path.find('.', start)) != std::string_view::npos; start = dot + 1)
    cur = &(*cur)[std::string(path.substr(start, dot - start))];
  (*cur)[std::string(path.substr(start))] = v;
}

std::string pad(std::string s, std::size_t width) {
  // Widths count code points so that "→" and "²" in sources line up.
  std::size_t cps = 0;
  for (unsigned char c : s) cps += (c & 0xC0) != 0x80;
  if (cps < width) s.append(width - cps, ' ');
  return s;
}

}  // namespace

std::vector<std::string> Config::auto_report() const {
  Config copy = *this;  // read() takes a mutable Config
  std::vector<std::string> lines;
  for (std::size_t i = 0; i < options().size() && i < reasons_.size(); ++i) {
    if (reasons_[i].empty() || sources_[i].empty()) continue;
    const Option& o = options()[i];
    if (sources_[i] == kLeftToTheRun) {
      lines.push_back(detail::cat(o.path, " = (the run's): ", reasons_[i]));
      continue;
    }
    const nlohmann::json v = left_to_engine(o, copy) ? nlohmann::json("auto") : read(o, copy);
    lines.push_back(
        detail::cat(o.path, " = ", v.is_string() ? v.get<std::string>() : show(v), ": ", reasons_[i]));
  }
  return lines;
}

std::string Config::resolved_table() const {
  Config copy = *this;  // read() takes a mutable Config; the copy keeps this method const
  std::vector<std::array<std::string, 3>> rows;
  rows.push_back({"key", "value", "source"});
  // Keys Strata accepts without acting on them are marked; the ones the file set are listed below the
  // table with the reason (Note [Keys without effect] in config_schema_zero.cpp).
  std::string no_effect;
  for (std::size_t i = 0; i < options().size(); ++i) {
    if (i >= sources_.size() || sources_[i].empty()) continue;
    const Option& o = options()[i];
    rows.push_back({o.path, value_text(o, copy), o.no_effect ? sources_[i] + " (no effect)" : sources_[i]});
    if (o.no_effect && sources_[i] != "default")
      no_effect += detail::cat("  ", o.path, ": ", o.no_effect, "\n");
  }
  std::size_t w0 = 0, w1 = 0;
  for (const auto& r : rows) {
    w0 = std::max(w0, r[0].size());
    w1 = std::max(w1, r[1].size());
  }
  std::string out = detail::cat("resolved config (world_size ", world_size, ")\n");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    out += pad(rows[i][0], w0) + "  " + pad(rows[i][1], w1) + "  " + rows[i][2] + "\n";
    if (i == 0) out += std::string(w0, '-') + "  " + std::string(w1, '-') + "  " + std::string(6, '-') + "\n";
  }
  if (!no_effect.empty())
    out += "\naccepted without effect (DeepSpeed keys Strata does not act on; docs/config.md):\n" + no_effect;
  return out;
}

nlohmann::json Config::to_json() const {
  Config copy = *this;
  nlohmann::json out = nlohmann::json::object();
  for (std::size_t i = 0; i < options().size(); ++i) {
    if (i >= sources_.size() || sources_[i].empty()) continue;
    set_in(out, options()[i].path, resolved_value(options()[i], copy));
  }
  return out;
}

std::string config_reference_markdown() {
  std::string md;
  md += "# Configuration reference\n\n";
  md +=
      "<!-- Generated from config/config_schema.cpp and config/config_names.cpp; do not edit by hand.\n"
      "     Regenerate: build/tests/config/strata_config_doc > docs/config.md (test_config checks it). "
      "-->\n\n";
  md +=
      "Strata reads one JSON file in DeepSpeed's `ds_config.json` format, with DeepSpeed's code defaults, so "
      "an\n"
      "existing DeepSpeed config means the same thing here. Strata's own settings live under `\"strata\"`.\n"
      "Examples: `configs/zero3_none.json`, `configs/zero3_cpu.json`, `configs/zero3_nvme.json` (it names\n"
      "DeepSpeed's customary `/local_nvme`; point both `nvme_path` keys at a directory on your NVMe "
      "drive).\n\n";
  md += "## How values are read\n\n";
  md +=
      "- **Errors** name the key path, the value and what is allowed, e.g.\n"
      "  `zero_optimization.offload_optimizer.device: \"gpu\" is not one of none, cpu, nvme`. All problems "
      "in a\n"
      "  file are reported together.\n";
  md +=
      "- **Unknown keys** are errors that suggest the nearest known key of the same section\n"
      "  (`zero_optimization.stage3_prefetch_bucket: unknown key; did you mean "
      "stage3_prefetch_bucket_size?`).\n"
      "  DeepSpeed keys Strata knowingly does not implement are listed below: each gives one warning and is\n"
      "  ignored; one set to false or null, or a section with `\"enabled\": false`, is ignored silently.\n";
  md +=
      "- **Sizes.** `count` keys are numbers of elements and `bytes` keys numbers of bytes, as in "
      "DeepSpeed.\n"
      "  Both take an integer, an exact float (`5e8`) or a string with a multiplier: `K M G T P` are powers\n"
      "  of 1000 and `Ki Mi Gi Ti Pi` powers of 1024, ignoring case (`\"1.5G\"` = 1500000000, `\"64Ki\"` =\n"
      "  65536). `bytes` keys also accept a trailing `B` (`\"512MB\"` = 512000000, `\"2GiB\"` = "
      "2147483648);\n"
      "  on a `count` key a `B` is an error. A value that is not a whole number (`\"1.0001KB\"`) is an "
      "error,\n"
      "  never rounded.\n";
  md += "- **Integers** accept exact floats (`1e9`); booleans must be JSON `true`/`false`.\n";
  md += "- **null** means \"not given\" (the default applies), as DeepSpeed's `None`.\n";
  md +=
      "- **\"auto\"** (as Hugging Face's DeepSpeed integration writes it) is accepted where the \"auto\"\n"
      "  column says what it becomes: the command-line override named there when one is given, else the\n"
      "  rule shown. A command-line override also fills a key the file leaves out; an override that\n"
      "  contradicts an explicit value in the file is an error. Without an override, \"auto\" takes what\n"
      "  Hugging Face's integration fills in from TrainingArguments' defaults (learning rate 5e-05, "
      "clipping\n"
      "  1, no warmup), the model's hidden size, the world size, the run's length or the backend's "
      "precision\n"
      "  (bf16: every Strata backend computes it). Nothing is chosen silently: `strata train`,\n"
      "  `strata.initialize` and `strata config` print one line per value chosen, `config: KEY = VALUE: "
      "why`\n"
      "  (`Config::auto_report()`).\n";
  md +=
      "- **The schedule's length is the run's.** `scheduler.params.total_num_steps` \"auto\", or left out\n"
      "  where the scheduler needs it, takes `strata train`'s `--steps` (counted on from the checkpoint\n"
      "  `--load` resumes), `--max-steps` or `--epochs`; in Python the `total_steps` override gives it,\n"
      "  and `strata config FILE --steps N` shows the schedule so resolved. A file\n"
      "  that sets another total is kept, with a warning naming both. `strata.warmup_ratio` gives the "
      "warmup\n"
      "  as a share of those steps where `warmup_num_steps` is \"auto\" or left out (the stock configs "
      "do).\n";
  md +=
      "- **Batch sizes.** `train_batch_size = train_micro_batch_size_per_gpu × gradient_accumulation_steps "
      "×\n"
      "  world_size`. Any two determine the third (integer division, as DeepSpeed); only\n"
      "  `train_batch_size` or only the micro batch sets accumulation to 1; inconsistent values are an "
      "error\n"
      "  that shows the arithmetic.\n";
  md +=
      "- **NVMe.** When `offload_param` or `offload_optimizer` has `device: \"nvme\"`, its `nvme_path` must "
      "be an\n"
      "  existing, writable directory when the config is loaded, or a list of such directories, one per\n"
      "  drive: the swap files are then striped over all of them (a RAID 0 of Strata's own; docs/nvme.md).\n";
  md +=
      "- **Accepted; no effect.** Some DeepSpeed keys choose among ways of working that Strata has one\n"
      "  of (each collective moves a whole chunk, on a stream of its own): they are read and checked,\n"
      "  and their meaning says \"Accepted; no effect\" and why. A `zero_optimization` one set in the file\n"
      "  gives one warning with that reason, unless its value asks for what Strata does anyway\n"
      "  (`overlap_comm: true`); `\"auto\"` or a default gives none.\n";
  md +=
      "- **Resolved config.** `Config::resolved_table()` (`strata config`) prints every key in force with\n"
      "  its value and source (`file`, `default`, `alias ...`, `override ...`, `auto→...`, `inferred`;\n"
      "  `(no effect)` after a key accepted without effect, and below the table the reasons for the ones\n"
      "  the file set); `Config::to_json()` is the same as a document (checkpoints and memprof traces\n"
      "  carry it).\n"
      "- **The plan for a model.** `strata config FILE --model M [--backend cuda|host]\n"
      "  [--device-memory 24GiB] [--seq-len T]` plans the run as the engine would (the memory plan's\n"
      "  device and host lines, whether the step fits, the longest row that fits and the activation bytes\n"
      "  a token, the bytes a step moves over the host link, each chunk's update route) for a device given\n"
      "  by its size, so a plan for a GPU can be made without one (tools/cmd_config.cpp, Note [The plan\n"
      "  before the machine]).\n\n";

  md += "## Keys\n";
  std::string group = "\x01";
  for (const Option& o : options()) {
    std::string parent = parent_of(o.path);
    if (parent != group) {
      group = parent;
      md += detail::cat("\n### ", parent.empty() ? "top level" : "`" + parent + "`", "\n\n");
      md += "| key | type | default | allowed | \"auto\" | meaning |\n|---|---|---|---|---|---|\n";
    }
    std::string meaning = o.meaning;
    if (o.no_effect) meaning = detail::cat("Accepted; no effect: ", o.no_effect, ". ", meaning);
    if (o.applies_note) meaning += detail::cat(" Only for ", o.applies_note, ".");
    md +=
        detail::cat("| `", o.path, "` | ", kind_name(o.kind), " | ", default_text(o), " | ", allowed_text(o),
                    " | ", o.auto_note ? o.auto_note : (o.auto_fallback || o.override_name ? "yes" : ""),
                    " | ", meaning, " |\n");
  }

  md += "\n## Alternative and deprecated spellings\n\n";
  md +=
      "A deprecated key gives one warning. Giving both a spelling and the key it stands for is an error.\n\n";
  md += "| key | stands for | deprecated | note |\n|---|---|---|---|\n";
  for (const Alias& a : aliases()) {
    std::string target;
    if (a.target) {
      target = detail::cat("`", a.target, "`");
    } else {
      for (const auto& [k, v] : a.when_true)
        target += detail::cat(target.empty() ? "" : ", ", "`", k, ": ", v.dump(), "`");
      target = "when true: " + target;
    }
    md +=
        detail::cat("| `", a.path, "` | ", target, " | ", a.deprecated ? "yes" : "no", " | ", a.note, " |\n");
  }
  md +=
      "| `\"zero_optimization\": true` | `\"zero_optimization\": {\"stage\": 1}` (false: stage 0) | yes | "
      "DeepSpeed's oldest form |\n";

  md += "\n## DeepSpeed keys accepted and ignored\n\n";
  md +=
      "Each gives one warning naming the reason; its value is not read. One set to `false` or `null`, or "
      "a\n"
      "section with `\"enabled\": false`, asks for nothing and gives no warning.\n\n";
  md += "| key | why |\n|---|---|\n";
  for (const Ignored& ig : ignored()) md += detail::cat("| `", ig.path, "` | ", ig.reason, " |\n");

  md += "\n## `strata.lora` and PEFT's adapter_config.json\n\n";
  md +=
      "The `strata.lora` keys above are PEFT's `LoraConfig` names with PEFT's defaults; a block that is "
      "given\n"
      "(`\"lora\": {...}`, not null) turns the adapters on and must name `target_modules`. PEFT's "
      "`adapter_config.json`\n"
      "is read by the same rules (`config/lora_peft.h`). Each field of PEFT 0.21's `LoraConfig` is read, "
      "accepted\n"
      "only at the values shown (any other is refused by name, with the same message in the block and in "
      "the\n"
      "file), or ignored as metadata (adapter_config.json only; in the block it is an unknown key). A field "
      "PEFT\n"
      "0.21 does not have is ignored in adapter_config.json, since each PEFT release adds fields whose "
      "defaults\n"
      "keep plain LoRA, and is an unknown key in the block.\n\n";
  md += "| PEFT field | Strata | allowed | why |\n|---|---|---|---|\n";
  for (const PeftField& f : peft_fields()) {
    switch (f.role) {
      case PeftRole::read:
        md += detail::cat("| `", f.name, "` | read as `strata.lora.", f.name, "` | see above | |\n");
        break;
      case PeftRole::limited:
        md += detail::cat("| `", f.name, "` | refused unless allowed",
                          f.in_block ? "" : " (adapter_config.json only)", " | ", f.accepted, " | ", f.reason,
                          " |\n");
        break;
      case PeftRole::metadata:
        md += detail::cat("| `", f.name, "` | ignored | | ", f.reason, " |\n");
        break;
    }
  }

  md += "\n## Command-line overrides\n\n";
  md +=
      "`Config::load(path, overrides, world_size)` takes a map of these names (the `strata` command line "
      "fills\n"
      "it). An unknown name is an error; a name that sets nothing in force gives a warning.\n\n";
  md += "| name | type | sets |\n|---|---|---|\n";
  for (const OverrideName& n : override_names())
    md += detail::cat("| `", n.name, "` | ", kind_name(n.kind), " | ", n.meaning, " |\n");
  return md;
}

}  // namespace strata
