// Config parsing: aliases, the key walk, "auto" and command-line overrides, batch-size inference and
// the checks that span keys. Types and ranges of single keys live in config_values.cpp; the keys
// themselves in config_schema.cpp.
#include "config/config.h"
#include "core/files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "config/config_impl.h"
#include "core/error.h"
#include "core/log.h"

namespace strata {

using namespace config_detail;

namespace {

const std::set<std::string, std::less<>>& sections() {
  static const std::set<std::string, std::less<>> s = [] {
    std::set<std::string, std::less<>> out;
    for (const auto& o : options())
      for (std::string p = parent_of(o.path); !p.empty(); p = parent_of(p)) out.insert(p);
    return out;
  }();
  return s;
}

const Ignored* find_ignored(std::string_view path) {
  for (const auto& ig : ignored())
    if (path == ig.path) return &ig;
  return nullptr;
}

using detail::join;

}  // namespace

// Locking: none; a parser lives on one thread for one parse() call.
struct ConfigParser {
  const Overrides& overrides;
  const RunFacts& run;
  std::string origin;
  Config cfg;
  nlohmann::json doc;
  std::vector<std::string> errors;
  std::vector<bool> given;       // per option: a value from the file (directly or through an alias)
  std::vector<bool> is_auto;     // per option: the file says "auto"
  std::vector<bool> overridden;  // per option: the value came from a command-line override
  std::map<std::string, std::string> via_alias;  // target key or section -> the alias that set it
  std::set<std::string, std::less<>> sections_given;
  std::set<std::string, std::less<>> overrides_used;
  std::optional<std::uint64_t> hidden_size;

  ConfigParser(const Overrides& ov, const RunFacts& r, std::string_view org)
      : overrides(ov),
        run(r),
        origin(org),
        given(options().size()),
        is_auto(options().size()),
        overridden(options().size()) {
    cfg.sources_.assign(options().size(), "");
    cfg.reasons_.assign(options().size(), "");
  }

  void warn(std::string msg) {
    STRATA_LOG_WARN(origin, ": ", msg);
    cfg.warnings_.push_back(std::move(msg));
  }
  void error(std::string msg) { errors.push_back(std::move(msg)); }
  template <class F>
  void attempt(F&& f) {
    try {
      f();
    } catch (const ConfigError& e) {
      errors.push_back(e.what());
    }
  }
  void throw_if_errors() {
    if (errors.empty()) return;
    if (errors.size() == 1) throw ConfigError(detail::cat(origin, ": ", errors[0]));
    throw ConfigError(detail::cat(origin, ": ", errors.size(), " problems:\n  ", join(errors, "\n  ")));
  }

  // The name the user wrote: the alias path when the value came through one.
  std::string shown_key(std::string_view path) const {
    for (std::string p(path); !p.empty(); p = parent_of(p)) {
      auto it = via_alias.find(p);
      if (it != via_alias.end()) return it->second + std::string(path.substr(p.size()));
    }
    return std::string(path);
  }
  std::string alias_source(std::string_view path) const {
    for (std::string p(path); !p.empty(); p = parent_of(p)) {
      auto it = via_alias.find(p);
      if (it != via_alias.end()) return "alias " + it->second;
    }
    return "file";
  }

  const nlohmann::json* override_value(const char* name) {
    if (!name) return nullptr;
    auto it = overrides.find(name);
    if (it == overrides.end()) return nullptr;
    overrides_used.insert(name);
    return &it->second;
  }

  // world_size and hidden_size: whole numbers from 1 to `max` (hidden_size² must fit in 64 bits).
  static std::uint64_t positive_override(const char* name, const nlohmann::json& v, std::uint64_t max) {
    double d = v.is_number() ? v.get<double>() : 0.0;
    if (!v.is_number() || d < 1 || d > double(max) || std::floor(d) != d)
      throw ConfigError(detail::cat("override ", name, ": ", show(v), " is not an integer from 1 to ", max));
    return v.is_number_float() ? std::uint64_t(d) : v.get<std::uint64_t>();
  }

  void check_override_names(int world_size) {
    std::vector<std::string> names;
    for (const auto& n : override_names()) names.push_back(n.name);
    for (const auto& [name, v] : overrides) {
      std::string near = nearest(name, names);
      if (std::find(names.begin(), names.end(), name) == names.end())
        error(near.empty() ? detail::cat("override ", name, ": unknown; known overrides: ", join(names))
                           : detail::cat("override ", name, ": unknown; did you mean ", near, "?"));
    }
    cfg.world_size = world_size;
    attempt([&] {
      if (auto it = overrides.find("world_size"); it != overrides.end())
        cfg.world_size = int(positive_override("world_size", it->second, 1u << 24));
      else if (world_size < 1)
        throw ConfigError(detail::cat("world_size: ", world_size, " is not an integer >= 1"));
    });
    attempt([&] {
      if (auto it = overrides.find("hidden_size"); it != overrides.end())
        hidden_size = positive_override("hidden_size", it->second, 1u << 31);
    });
  }

  void apply_static_defaults() {
    for (std::size_t i = 0; i < options().size(); ++i) {
      const Option& o = options()[i];
      if (!o.def.is_null()) store(o, cfg, o.def, o.path);
      cfg.sources_[i] = "default";  // batch sizes are replaced by infer_batch(), unset paths show "(unset)"
    }
  }

  // DeepSpeed still reads "zero_optimization": true|false as stage 1|0.
  void legacy_zero_flag() {
    auto it = doc.find("zero_optimization");
    if (it == doc.end() || !it->is_boolean()) return;
    bool on = it->get<bool>();
    warn(detail::cat("zero_optimization: ", on ? "true" : "false",
                     " is deprecated; write \"zero_optimization\": {\"stage\": ", on ? 1 : 0, "}"));
    *it = nlohmann::json{{"stage", on ? 1 : 0}};
  }

  void apply_aliases() {
    for (const Alias& a : aliases()) {
      nlohmann::json* found = find_path(doc, a.path);
      if (!found) continue;
      nlohmann::json v = *found;
      erase_path(doc, a.path);
      if (a.deprecated) warn(detail::cat(a.path, ": deprecated; ", a.note));
      std::vector<std::pair<std::string, nlohmann::json>> targets;
      if (a.target) {
        targets.emplace_back(a.target, v);
      } else if (!v.is_boolean()) {
        error(detail::cat(a.path, ": ", show(v), " is not a boolean (true or false)"));
      } else if (v.get<bool>()) {
        targets = a.when_true;
      }
      for (const auto& [target, value] : targets) {
        if (find_path(doc, target)) {
          error(detail::cat(a.path, " and ", target, " are both given; keep only ", target));
          continue;
        }
        if (set_path(doc, target, value)) via_alias[target] = a.path;
      }
    }
  }

  // An ignored key set to false or null, or a section with "enabled": false, asks for nothing Strata
  // lacks (stock configs carry "tensorboard": {"enabled": false}): no warning.
  static bool asks_for_nothing(const nlohmann::json& v) {
    if (v.is_null() || (v.is_boolean() && !v.get<bool>())) return true;
    if (!v.is_object()) return false;
    auto enabled = v.find("enabled");
    return enabled != v.end() && enabled->is_boolean() && !enabled->get<bool>();
  }

  void walk(const nlohmann::json& obj, const std::string& section) {
    for (const auto& [k, v] : obj.items()) {
      std::string p = section.empty() ? k : section + "." + k;
      if (const Ignored* ig = find_ignored(p)) {
        if (asks_for_nothing(v)) continue;
        if (ig->refused)
          error(detail::cat(shown_key(p), ": not supported; ", ig->reason,
                            ". Remove the section or set "
                            "\"enabled\": false"));
        else
          warn(detail::cat(shown_key(p), ": ignored; ", ig->reason));
        continue;
      }
      if (section == "strata.lora" && !peft_option(p, k, v)) continue;
      int idx = option_index(p);
      if (idx >= 0) {
        take(std::size_t(idx), v);
      } else if (sections().count(p)) {
        if (v.is_null()) continue;
        if (!v.is_object()) {
          error(detail::cat(shown_key(p), ": ", show(v), " is not an object; expected a section with keys ",
                            join(children(p))));
          continue;
        }
        sections_given.insert(p);
        walk(v, p);
      } else {
        unknown(p, section);
      }
    }
  }

  // A key of the strata.lora block that is one of PEFT's LoraConfig fields Strata computes at some values
  // only (use_dora, bias, task_type, ...; lora_peft.cpp): an error naming it when `v` asks for more.
  // Returns whether the walk goes on with the key (a schema key, or an unknown one); false when it is done.
  bool peft_option(const std::string& path, const std::string& leaf, const nlohmann::json& v) {
    const PeftField* f = find_peft_field(leaf);
    if (!f || f->role != PeftRole::limited || !f->in_block) return true;
    if (std::string why = peft_refusal(*f, v); !why.empty()) {
      error(detail::cat(shown_key(path), ": ", why));
      return false;
    }
    return option_index(path) >= 0;  // accepted: stored where it is a key (init_lora_weights), else done
  }

  void take(std::size_t i, const nlohmann::json& v) {
    const Option& o = options()[i];
    std::string key = shown_key(o.path);
    if (v.is_null()) return;  // null: not given (DeepSpeed's None)
    if (o.auto_allowed() && v.is_string() && v.get_ref<const std::string&>() == "auto") {
      is_auto[i] = true;
      return;
    }
    attempt([&] {
      store(o, cfg, v, key);
      given[i] = true;
      cfg.sources_[i] = alias_source(o.path);
    });
  }

  std::vector<std::string> children(std::string_view section) const {
    std::vector<std::string> out;
    auto add = [&](std::string_view path) {
      if (parent_of(path) != section) return;
      std::string leaf = leaf_of(path);
      if (std::find(out.begin(), out.end(), leaf) == out.end()) out.push_back(leaf);
    };
    for (const auto& o : options()) add(o.path);
    for (const auto& s : sections()) add(s);
    return out;
  }

  void unknown(const std::string& path, const std::string& section) {
    std::vector<std::string> names = children(section);
    std::vector<std::string> candidates = names;
    for (const auto& a : aliases())
      if (parent_of(a.path) == section) candidates.push_back(leaf_of(a.path));
    std::string key = shown_key(path);
    std::string near = nearest(leaf_of(path), candidates);
    if (!near.empty()) {
      error(detail::cat(key, ": unknown key; did you mean ", near, "?"));
    } else {
      error(detail::cat(key, ": unknown key; known keys ",
                        section.empty() ? "at the top level" : "in " + section, ": ", join(names)));
    }
  }

  // The key whose value decides where a type-dependent key applies.
  static const char* controlling_key(std::string_view path) {
    if (path.rfind("optimizer.", 0) == 0) return "optimizer.type";
    if (path.rfind("scheduler.", 0) == 0) return "scheduler.type";
    return nullptr;
  }

  void check_applicability() {
    for (std::size_t i = 0; i < options().size(); ++i) {
      const Option& o = options()[i];
      if (!o.applies || o.applies(cfg)) continue;
      cfg.sources_[i].clear();
      if (!given[i] && !is_auto[i]) continue;
      std::string why;
      if (const char* c = controlling_key(o.path))
        why = detail::cat(" with ", c, " ", show(read(options()[std::size_t(option_index(c))], cfg)));
      error(
          detail::cat(shown_key(o.path), ": does not apply", why, "; it is a parameter of ", o.applies_note));
    }
    for (const char* section : {"optimizer", "scheduler"}) {
      std::string type_key = detail::cat(section, ".type");
      if (sections_given.count(section) && !given[std::size_t(option_index(type_key))])
        error(detail::cat(type_key, ": required when a \"", section, "\" section is given; ",
                          allowed_text(options()[std::size_t(option_index(type_key))])));
    }
  }

  void apply_dynamic_defaults() {
    for (std::size_t i = 0; i < options().size(); ++i) {
      const Option& o = options()[i];
      if (o.dynamic_default && !given[i] && !is_auto[i]) store(o, cfg, o.dynamic_default(cfg), o.path);
    }
  }

  // "auto" values and command-line overrides, in table order (Note [order] in config_schema.cpp).
  void resolve_overrides_and_auto() {
    for (std::size_t i = 0; i < options().size(); ++i) {
      const Option& o = options()[i];
      if (o.applies && !o.applies(cfg)) continue;
      const nlohmann::json* ov = override_value(o.override_name);
      std::string ov_key =
          detail::cat("override ", o.override_name ? o.override_name : "", " (for ", o.path, ")");
      if (given[i]) {
        if (ov) check_agrees(o, *ov, ov_key);
        continue;
      }
      attempt([&] {
        if (ov) {
          store(o, cfg, *ov, ov_key);
          overridden[i] = true;
          cfg.sources_[i] = detail::cat(is_auto[i] ? "auto→" : "", "override ", o.override_name);
          if (is_auto[i]) cfg.reasons_[i] = detail::cat("given as override ", o.override_name);
          return;
        }
        if (!is_auto[i]) return;
        if (o.auto_fallback) {
          AutoValue av = o.auto_fallback(AutoContext{cfg, hidden_size});
          if (!av.value.is_null()) store(o, cfg, av.value, o.path);
          cfg.sources_[i] = av.source;
          cfg.reasons_[i] = av.why;
          return;
        }
        nlohmann::json def = o.dynamic_default ? o.dynamic_default(cfg) : o.def;
        if (def.is_null())
          throw ConfigError(detail::cat(shown_key(o.path), ": \"auto\" needs the ", o.override_name,
                                        " override from the command line, and none was given"));
        store(o, cfg, def, o.path);
        cfg.sources_[i] = "auto→default";
        cfg.reasons_[i] = detail::cat("the default (override ", o.override_name, " chooses)");
      });
    }
    for (const auto& [name, v] : overrides)
      if (!overrides_used.count(name) && name != "hidden_size" && name != "world_size")
        warn(detail::cat("override ", name, ": not used; the keys it sets are not in force in this config"));
  }

  // Hugging Face's rule: an override that contradicts an explicit file value is an error, not a silent pick.
  void check_agrees(const Option& o, const nlohmann::json& ov, const std::string& ov_key) {
    attempt([&] {
      Config scratch = cfg;
      store(o, scratch, ov, ov_key);
      nlohmann::json mine = read(o, cfg), theirs = read(o, scratch);
      if (mine != theirs)
        throw ConfigError(
            detail::cat(shown_key(o.path), ": the file sets ", show(mine), " but the command line (override ",
                        o.override_name, ") gives ", show(theirs),
                        "; set the key to \"auto\" to take the command-line value, or drop the override"));
    });
  }

  void infer_batch();
  void resolve_schedule();
  void resolve_warmup(std::int64_t steps);
  void check_cross_keys();
  void check_lora();
  void check_offload_ratio();
  void warn_no_effect();
  void check_nvme_path(const char* device_key, const char* path_key, const std::vector<std::string>& paths);
  void check_nvme_dir(const std::string& key, const std::string& path);
};

// DeepSpeed's _set_batch_related_parameters and _batch_assertion: any two of train, micro and
// accumulation determine the third (integer division, as DeepSpeed does), one alone sets accumulation 1.
void ConfigParser::infer_batch() {
  const std::size_t i_tb = std::size_t(option_index("train_batch_size"));
  const std::size_t i_mb = std::size_t(option_index("train_micro_batch_size_per_gpu"));
  const std::size_t i_ga = std::size_t(option_index("gradient_accumulation_steps"));
  std::int64_t& tb = cfg.train_batch_size;
  std::int64_t& mb = cfg.train_micro_batch_size_per_gpu;
  std::int64_t& ga = cfg.gradient_accumulation_steps;
  const std::int64_t w = cfg.world_size;
  auto inferred = [&](std::size_t i) { return is_auto[i] ? "auto→inferred" : "inferred"; };
  std::string note;
  if (!tb && !mb) {
    if (!is_auto[i_tb] && !is_auto[i_mb]) {
      error(
          "train_batch_size, train_micro_batch_size_per_gpu: neither is given; set at least one of them "
          "(gradient_accumulation_steps alone does not determine the batch)");
      return;
    }
    mb = 1;  // all "auto" and nothing on the command line: the smallest batch
    cfg.sources_[i_mb] = "auto→default (1)";
    cfg.reasons_[i_mb] = "nothing sets the batch: the smallest (override micro_batch or train_batch chooses)";
  }
  if (tb && mb && ga) {
    // all three given: only the check below
  } else if (tb && mb) {
    ga = tb / mb / w;
    cfg.sources_[i_ga] = inferred(i_ga);
    note =
        detail::cat(" (gradient_accumulation_steps inferred as ", tb, " / ", mb, " / ", w, ", rounded down)");
  } else if (tb && ga) {
    mb = tb / w / ga;
    cfg.sources_[i_mb] = inferred(i_mb);
    note = detail::cat(" (train_micro_batch_size_per_gpu inferred as ", tb, " / ", w, " / ", ga,
                       ", rounded down)");
  } else if (mb && ga) {
    tb = mb * ga * w;
    cfg.sources_[i_tb] = inferred(i_tb);
  } else if (tb) {
    ga = 1;
    mb = tb / w;
    cfg.sources_[i_ga] = inferred(i_ga);
    cfg.sources_[i_mb] = inferred(i_mb);
    note = detail::cat(" (train_micro_batch_size_per_gpu inferred as ", tb, " / ", w, ", rounded down)");
  } else {
    ga = 1;
    tb = mb * w;
    cfg.sources_[i_ga] = inferred(i_ga);
    cfg.sources_[i_tb] = inferred(i_tb);
  }
  for (std::size_t i : {i_tb, i_mb, i_ga})
    if (is_auto[i] && cfg.reasons_[i].empty())
      cfg.reasons_[i] = detail::cat("inferred: train_batch_size ", tb, " = micro batch ", mb,
                                    " × accumulation ", ga, " × world size ", w);
  if (mb <= 0 || ga <= 0) {
    error(detail::cat("train_batch_size ", tb, " is too small: it must be at least world_size ", w,
                      " × gradient_accumulation_steps ", std::max<std::int64_t>(ga, 1), note));
  } else if (tb != mb * ga * w) {
    error(detail::cat(
        "train_batch_size ", tb, " != train_micro_batch_size_per_gpu ", mb, " × gradient_accumulation_steps ",
        ga, " × world_size ", w, " = ", mb * ga * w, note,
        "; make train_batch_size = micro batch × accumulation steps × world size, or give only two of "
        "the three"));
  }
}

// Note [Loud auto]: nothing the program picks for the user is silent. A key the file sets to "auto" takes
// the command-line override of its name, else what Hugging Face's integration fills in from
// TrainingArguments' defaults (learning rate 5e-05, clipping 1, no warmup), the model's hidden size, the
// world size, the run's length or the backend's precision (bf16: every backend computes it); each keeps
// the reason, and Config::auto_report() gives them to the front-ends, which print them before the first
// step. The schedule's length is the run's: total_num_steps "auto", or left out where the scheduler needs
// it, takes RunFacts (strata train's --steps, --max-steps or --epochs); a file that sets another total is
// kept, with a warning naming both, so that an existing DeepSpeed config means what it says.
std::int64_t run_total_steps(const RunFacts& run, std::int64_t micro_batch, std::int64_t accumulation_steps) {
  if (run.total_steps > 0) return run.total_steps;
  if (run.epochs <= 0 || !run.micro_batches_per_epoch || micro_batch < 1 || accumulation_steps < 1) return 0;
  const std::int64_t per_epoch =
      std::max<std::int64_t>(1, run.micro_batches_per_epoch(micro_batch) / accumulation_steps);
  return std::int64_t(std::ceil(run.epochs * double(per_epoch) - 1e-9));
}

void ConfigParser::resolve_schedule() {
  auto& s = cfg.scheduler;
  if (s.type == SchedulerType::none) {
    if (cfg.strata.warmup_ratio > 0)
      warn(detail::cat("strata.warmup_ratio: ", format_number(cfg.strata.warmup_ratio),
                       " has no effect without a scheduler (the rate stays optimizer.params.lr)"));
    return;
  }
  const std::size_t i_total = std::size_t(option_index("scheduler.params.total_num_steps"));
  const std::size_t i_warm = std::size_t(option_index("scheduler.params.warmup_num_steps"));
  const std::int64_t run_total =
      run_total_steps(run, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps);
  const std::string from = run.from.empty() ? std::string("the run") : run.from;
  const bool has_total = s.type == SchedulerType::WarmupDecayLR || s.type == SchedulerType::WarmupCosineLR;
  // Taken from the run, or an "auto" an override filled (Python's total_steps, as --steps): the length of a
  // run, which a cosine too short for its warmup may be stretched past (below). A file's value is kept.
  bool total_from_run = false;
  if (has_total) {
    if (given[i_total] || overridden[i_total]) {
      total_from_run = is_auto[i_total];
      if (run_total > 0 && s.total_num_steps != run_total)
        warn(detail::cat("scheduler.params.total_num_steps: ",
                         given[i_total] ? "the file sets " : "override total_steps gives ", s.total_num_steps,
                         " but the run trains to step ", run_total, " (", from,
                         "): the schedule ends at step ", s.total_num_steps,
                         given[i_total] ? "; set it to \"auto\" to follow the run" : ""));
    } else if (run_total == 0 && run.length_later) {
      cfg.sources_[i_total] = kLeftToTheRun;
      cfg.reasons_[i_total] = "strata train takes it from --steps, --max-steps or --epochs";
    } else if (run_total == 0 && !run.from.empty() && run.epochs <= 0) {
      // A run of no step (strata train --steps 0: set up, then save or export): any valid length will do.
      s.total_num_steps =
          std::max<std::int64_t>(2, given[i_warm] || overridden[i_warm] ? s.warmup_num_steps : 0) + 1;
      cfg.sources_[i_total] = detail::cat(is_auto[i_total] ? "auto→" : "", "run (", run.from, ")");
      cfg.reasons_[i_total] =
          detail::cat("the run trains no step (", run.from, "), so the schedule is not used");
    } else if (run_total > 0) {
      total_from_run = true;
      s.total_num_steps = run_total;
      cfg.sources_[i_total] = detail::cat(is_auto[i_total] ? "auto→" : "", "run (", from, ")");
      cfg.reasons_[i_total] =
          detail::cat("the run's length, ", from, is_auto[i_total] ? "" : " (the file leaves it out)");
    }
  }
  resolve_warmup(has_total ? s.total_num_steps : run_total);
  // A cosine needs more steps than its warmup (at least 2, as DeepSpeed counts it): a run shorter than that
  // (a smoke test of --steps 1, or total_steps=1) still trains, its schedule stretched to the shortest one
  // past its end.
  if (total_from_run && s.type == SchedulerType::WarmupCosineLR) {
    const std::int64_t shortest = std::max<std::int64_t>(2, s.warmup_num_steps) + 1;
    if (s.total_num_steps < shortest) {
      s.total_num_steps = shortest;
      cfg.reasons_[i_total] += detail::cat("; raised to ", shortest,
                                           ", the shortest WarmupCosineLR schedule after its warmup (the run "
                                           "ends before its cosine)");
    }
  }
}

// Where the file says "auto", or leaves warmup_num_steps out and gives strata.warmup_ratio: the ratio's
// share of `steps` (the schedule's, or the run's for WarmupLR), or transformers' default of none.
void ConfigParser::resolve_warmup(std::int64_t steps) {
  auto& s = cfg.scheduler;
  const std::size_t i_warm = std::size_t(option_index("scheduler.params.warmup_num_steps"));
  const std::size_t i_ratio = std::size_t(option_index("strata.warmup_ratio"));
  const bool warm_pending = !given[i_warm] && !overridden[i_warm] && (is_auto[i_warm] || given[i_ratio]);
  if (given[i_ratio] && cfg.strata.warmup_ratio > 0 && !warm_pending) {
    error(detail::cat("strata.warmup_ratio: ", format_number(cfg.strata.warmup_ratio),
                      " and scheduler.params.warmup_num_steps ", s.warmup_num_steps,
                      " both give the warmup; keep one (warmup_num_steps \"auto\" takes the ratio)"));
    return;
  }
  if (!warm_pending) return;
  const double ratio = cfg.strata.warmup_ratio;
  if (ratio > 0) {
    if (steps <= 0 && run.length_later) {
      cfg.sources_[i_warm] = kLeftToTheRun;
      cfg.reasons_[i_warm] =
          detail::cat("ceil(strata.warmup_ratio ", format_number(ratio), " × the run's steps)");
      return;
    }
    if (steps <= 0) {
      error(detail::cat("strata.warmup_ratio: ", format_number(ratio),
                        " needs the schedule's length, which is not known here; give the run's length "
                        "(strata train: --steps, --max-steps or --epochs) or warmup_num_steps"));
      return;
    }
    s.warmup_num_steps = std::int64_t(std::ceil(ratio * double(steps) - 1e-9));
    cfg.sources_[i_warm] = detail::cat(is_auto[i_warm] ? "auto→" : "", "strata.warmup_ratio");
    cfg.reasons_[i_warm] =
        detail::cat("ceil(strata.warmup_ratio ", format_number(ratio), " × ", steps, " steps)");
  } else {
    s.warmup_num_steps = 0;
    cfg.sources_[i_warm] = "auto→transformers' default";
    cfg.reasons_[i_warm] =
        "transformers' default warmup_steps (override warmup_steps or strata.warmup_ratio chooses; the "
        "schedule still spends DeepSpeed's 2 steps from warmup_min_lr)";
  }
}

void ConfigParser::check_nvme_path(const char* device_key, const char* path_key,
                                   const std::vector<std::string>& paths) {
  std::string key = shown_key(path_key);
  if (paths.empty()) {
    error(detail::cat(
        key, ": required when ", device_key,
        " is \"nvme\"; set it to a directory on an NVMe drive (or a list of them, one per drive)"));
    return;
  }
  for (const std::string& path : paths) check_nvme_dir(key, path);
}

void ConfigParser::check_nvme_dir(const std::string& key, const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    int err = errno;
    error(detail::cat(key, ": \"", path, "\" ", err == ENOENT ? "does not exist" : "cannot be used", " (",
                      detail::errno_text(err), "); create the directory or point ", key,
                      " at an existing one"));
    return;
  }
  if (!S_ISDIR(st.st_mode)) {
    error(detail::cat(key, ": \"", path, "\" is not a directory; point ", key,
                      " at a directory on an NVMe drive"));
    return;
  }
  if (const int err = probe_writable(path); err != 0)
    error(detail::cat(key, ": \"", path, "\" is not writable (", detail::errno_text(err),
                      "); choose a directory this user can write"));
}

void ConfigParser::check_cross_keys() {
  const auto& z = cfg.zero_optimization;
  if (cfg.fp16.enabled && cfg.bf16.enabled)
    error("fp16.enabled and bf16.enabled are both true; enable at most one of them");
  auto device_name = [](OffloadDevice d) { return detail::cat("\"", offload_device_name(d), "\""); };
  if (z.offload_param.device != OffloadDevice::none && z.stage != 3)
    error(detail::cat(shown_key("zero_optimization.offload_param.device"), ": ",
                      device_name(z.offload_param.device), " needs zero_optimization.stage 3 (stage is ",
                      z.stage, ")"));
  if (z.offload_optimizer.device == OffloadDevice::nvme && z.stage != 3)
    error(detail::cat(shown_key("zero_optimization.offload_optimizer.device"),
                      ": \"nvme\" needs zero_optimization.stage 3 (stage is ", z.stage, ")"));
  if (z.offload_optimizer.device == OffloadDevice::cpu && z.stage == 0)
    error(detail::cat(shown_key("zero_optimization.offload_optimizer.device"),
                      ": \"cpu\" needs zero_optimization.stage 1, 2 or 3 (stage is 0)"));
  if (z.offload_param.device_auto && z.stage != 3)
    warn(detail::cat(shown_key("zero_optimization.offload_param.device"),
                     ": \"auto\" considers \"none\" only below stage 3 (stage is ", z.stage,
                     "): parameters are offloaded at stage 3"));
  check_offload_ratio();
  // With "auto", a named nvme_path is checked as "nvme" would check it: the choice may take it.
  if (z.offload_param.device == OffloadDevice::nvme ||
      (z.offload_param.device_auto && z.stage == 3 && !z.offload_param.nvme_paths.empty()))
    check_nvme_path("zero_optimization.offload_param.device", "zero_optimization.offload_param.nvme_path",
                    z.offload_param.nvme_paths);
  if (z.offload_optimizer.device_auto && z.stage == 3 && !z.offload_optimizer.nvme_paths.empty())
    check_nvme_path("zero_optimization.offload_optimizer.device",
                    "zero_optimization.offload_optimizer.nvme_path", z.offload_optimizer.nvme_paths);
  if (z.offload_optimizer.device == OffloadDevice::nvme)
    check_nvme_path("zero_optimization.offload_optimizer.device",
                    "zero_optimization.offload_optimizer.nvme_path", z.offload_optimizer.nvme_paths);

  const auto& s = cfg.scheduler;
  if (s.type == SchedulerType::WarmupDecayLR && s.total_num_steps > 0 &&
      s.total_num_steps < s.warmup_num_steps)
    warn(detail::cat("scheduler.params.total_num_steps ", s.total_num_steps,
                     " is less than warmup_num_steps ", s.warmup_num_steps, ": the rate warms up for ",
                     s.warmup_num_steps,
                     " steps and then drops straight to warmup_min_lr (the decay would have ended at step ",
                     s.total_num_steps, ")"));
  // The cosine runs over the steps after warmup; with none (DeepSpeed divides by their count, zero) the
  // rate would jump between its maximum and minimum every step.
  // Warmup lasts at least 2 steps, as in DeepSpeed (zero3/lr_schedule.cpp), so that is the bound.
  const std::int64_t warmup = std::max<std::int64_t>(2, s.warmup_num_steps);
  if (s.type == SchedulerType::WarmupCosineLR && s.total_num_steps > 0 && s.total_num_steps <= warmup)
    error(detail::cat("scheduler.params.total_num_steps: ", s.total_num_steps,
                      " must be greater than warmup_num_steps (", s.warmup_num_steps,
                      s.warmup_num_steps < 2 ? ", which counts as 2: warmup lasts at least 2 steps" : "",
                      ") for WarmupCosineLR, whose cosine decays over the steps after warmup; raise "
                      "total_num_steps to the run's optimizer steps, or lower warmup_num_steps"));
  if ((s.type == SchedulerType::WarmupDecayLR || s.type == SchedulerType::WarmupCosineLR) &&
      s.total_num_steps == 0 && !run.length_later)
    error(detail::cat(
        "scheduler.params.total_num_steps",
        is_auto[std::size_t(option_index("scheduler.params.total_num_steps"))] ? " \"auto\"" : "",
        ": required by scheduler.type ",
        show(read(options()[std::size_t(option_index("scheduler.type"))], cfg)),
        " and the run's length is not known here; strata train takes it from --steps, --max-steps "
        "or --epochs, and the total_steps override (--set total_steps=N, or initialize(..., "
        "total_steps=N) in Python) gives it; or set the key to the run's optimizer steps"));
  if (cfg.optimizer.type == OptimizerType::AdamW && !cfg.optimizer.adam_w_mode)
    warn(
        "optimizer.params.adam_w_mode: false has no effect with AdamW (always decoupled); use type Adam for "
        "L2 weight decay");
  if (cfg.optimizer.torch_adam)
    warn("optimizer.params.torch_adam: true has no effect; Strata has one Adam implementation");
  if (cfg.aio.use_gds) warn("aio.use_gds: true has no effect; GPUDirect Storage is not implemented");
}

// The strata.lora block's keys are checked one by one (config_schema_lora.cpp) and PEFT's other options in
// the walk (peft_option); what is left needs the whole block: the adapters' targets.
void ConfigParser::check_lora() {
  const auto& lora = cfg.strata.lora;
  if (lora.enabled && lora.target_modules.empty())
    error(detail::cat(shown_key("strata.lora.target_modules"), ": required in a strata.lora block; ",
                      kTargetModulesRequired));
}

// A ratio below 1, or "auto" (the engine's choice of one), splits the optimizer between the device and
// its offload target, which only stage 3 does (zero3/placement.cpp), and only with a target: "auto" at
// stage 1 or 2 and any such ratio with device "none" would otherwise be ignored in silence.
void ConfigParser::check_offload_ratio() {
  const auto& z = cfg.zero_optimization;
  const auto& oo = z.offload_optimizer;
  if (!oo.ratio_auto && oo.ratio >= 1.0) return;
  const std::string key = shown_key("zero_optimization.offload_optimizer.ratio");
  const std::string value = oo.ratio_auto ? std::string("\"auto\"") : format_number(oo.ratio);
  if (oo.device == OffloadDevice::none && !(oo.device_auto && z.stage == 3)) {
    error(detail::cat(key, ": ", value, " (partial offload) needs ",
                      shown_key("zero_optimization.offload_optimizer.device"), " \"cpu\" or \"nvme\"",
                      z.stage != 3 ? " and zero_optimization.stage 3" : "", " (device is \"none\"",
                      z.stage != 3 ? detail::cat(", stage is ", z.stage) : std::string(),
                      ": there is no offloaded optimizer to split); offload the optimizer",
                      z.stage != 3 ? " at stage 3" : "", ", or remove ratio"));
  } else if (z.stage != 3) {
    error(detail::cat(
        key, ": ", value, " (partial offload) needs zero_optimization.stage 3 (stage is ", z.stage,
        "; below stage 3 the whole optimizer is offloaded or none of it); set stage 3, or remove ratio"));
  }
}

// Note [Keys without effect] in config_schema_zero.cpp: one warning per key the file sets, unless its value
// asks for what Strata does anyway. "auto" and null ask for nothing.
void ConfigParser::warn_no_effect() {
  for (std::size_t i = 0; i < options().size(); ++i) {
    const Option& o = options()[i];
    if (!o.no_effect || !given[i]) continue;
    const nlohmann::json v = read(o, cfg);
    if (o.strata_does && v == o.strata_does(cfg)) continue;
    warn(detail::cat(shown_key(o.path), ": ", show(v), " has no effect; ", o.no_effect));
  }
}

Config Config::parse(const nlohmann::json& doc, const Overrides& overrides, int world_size,
                     std::string_view origin, const RunFacts& run) {
  ConfigParser p(overrides, run, origin);
  p.check_override_names(world_size);
  p.throw_if_errors();
  if (!doc.is_object())
    throw ConfigError(
        detail::cat(origin, ": the top level is ", show(doc), ", not a JSON object of settings"));
  p.apply_static_defaults();
  p.doc = doc;
  p.legacy_zero_flag();
  p.apply_aliases();
  p.walk(p.doc, "");
  p.throw_if_errors();  // type errors first: the checks below assume well-typed values
  p.cfg.strata.lora.enabled = p.sections_given.count("strata.lora") > 0;  // "lora": {...}, not null
  p.apply_dynamic_defaults();
  p.check_applicability();
  p.resolve_overrides_and_auto();
  {  // offload_optimizer.ratio "auto" is resolved by the engine, which measures (config.h)
    const std::size_t i = std::size_t(option_index("zero_optimization.offload_optimizer.ratio"));
    p.cfg.zero_optimization.offload_optimizer.ratio_auto = p.is_auto[i] && !p.cfg.sources_[i].empty();
    if (p.cfg.zero_optimization.offload_optimizer.ratio_auto)
      p.cfg.reasons_[i] =
          "the engine measures the device and the CPU optimizer at start-up and says what it chose";
  }
  for (const char* key :
       {"zero_optimization.offload_param.device", "zero_optimization.offload_optimizer.device"}) {
    // offload devices "auto" are resolved by the engine, which plans and predicts each placement (config.h)
    const std::size_t i = std::size_t(option_index(key));
    const bool chosen = p.is_auto[i] && !p.cfg.sources_[i].empty();
    (std::string_view(key).find("param") != std::string_view::npos
         ? p.cfg.zero_optimization.offload_param.device_auto
         : p.cfg.zero_optimization.offload_optimizer.device_auto) = chosen;
    if (chosen)
      p.cfg.reasons_[i] =
          "the engine plans every placement that fits the device and the host, predicts each one's step and "
          "takes the fastest (printed with the table it chose from)";
  }
  p.infer_batch();
  p.resolve_schedule();
  p.check_cross_keys();
  p.check_lora();
  p.throw_if_errors();
  p.warn_no_effect();
  return std::move(p.cfg);
}

Config Config::load(const std::string& path, const Overrides& overrides, int world_size,
                    const RunFacts& run) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw ConfigError(
        detail::cat(path, ": cannot read the config file (", detail::errno_text(errno), "); check the path"));
  if (S_ISDIR(st.st_mode)) throw ConfigError(detail::cat(path, ": is a directory, not a JSON config file"));
  std::ifstream in(path);
  if (!in)
    throw ConfigError(detail::cat(path, ": cannot open the config file (", detail::errno_text(errno), ")"));
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    // e.what(): "[json.exception.parse_error.101] parse error at line 3, column 5: syntax error ...", or
    // out_of_range.406 for a number too large for a double (1e400), met before any syntax error after it.
    std::string what = e.what();
    if (auto close = what.find("] "); what.rfind("[json.exception", 0) == 0 && close != std::string::npos)
      what = what.substr(close + 2);
    throw ConfigError(detail::cat(path, ": malformed JSON: ", what));
  }
  return parse(doc, overrides, world_size, path, run);
}

std::string Config::source(std::string_view key) const {
  int i = option_index(key);
  if (i < 0) throw ConfigError(detail::cat(key, ": not a config key (see docs/config.md)"));
  return sources_.empty() ? std::string() : sources_[std::size_t(i)];
}

}  // namespace strata
