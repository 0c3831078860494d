// strata/config/config_impl.h: the config schema's types, shared by config/config*.cpp. Not a public header.
//
// One Option per key (config/config_schema.cpp; other names in config_names.cpp) holds everything the rest
// needs: JSON path, kind, default, range or allowed values, how "auto" resolves, a one-line meaning and where
// the value lives in Config. Parsing (config.cpp), value conversion (config_values.cpp), the resolved table,
// to_json() and the markdown reference (config_print.cpp) all read this table and nothing else.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "config/config.h"

namespace strata::config_detail {

enum class Kind {
  boolean,    // true | false
  integer,    // whole number (5e8 accepted when exact)
  count,      // whole number of elements >= 0: 5e8, "500M", "64Ki" (no byte units)
  bytes,      // whole number of bytes >= 0: 5e8, "512MB", "2GiB", "1.5G"
  real,       // any finite number within the range
  choice,     // one string out of `choices`
  path,       // a filesystem path (null or "" = unset)
  paths,      // one filesystem path, or a list of them (null or "" = unset)
  real_pair,  // [a, b], each within the range (betas)
  names,      // a list of distinct non-empty strings (null or [] = none): PEFT's modules_to_save
  modules,    // PEFT's target_modules: a list of names or module paths, "all-linear" (any case), or
              // one other string, a regular expression the whole module path must match
};

// A typed pointer to one Config field. Enumerations are stored by their index in Option::choices, so an
// enum's enumerators must be declared in the same order as its choices.
struct EnumRef {
  void* p;
  int (*get)(const void*);
  void (*set)(void*, int);
};
// Kind::modules: the list, and whether its one entry is a regular expression (the JSON was a string).
struct ModulesRef {
  std::vector<std::string>* names;
  bool* pattern;
};
using FieldRef = std::variant<bool*, std::int64_t*, std::uint64_t*, double*, std::string*,
                              std::array<double, 2>*, EnumRef, std::vector<std::string>*, ModulesRef>;

template <class E>
EnumRef enum_ref(E& e) {
  return {&e, [](const void* p) { return int(*static_cast<const E*>(p)); },
          [](void* p, int v) { *static_cast<E*>(p) = static_cast<E>(v); }};
}

// What an "auto" value sees when it falls back (no command-line override for it).
struct AutoContext {
  const Config& config;  // keys earlier in the schema are already resolved
  std::optional<std::uint64_t> hidden_size;
};
// value null: leave the key to be decided later (batch sizes by inference, the schedule's length from the
// run). source: shown in the resolved table. why: the sentence Config::auto_report() gives.
struct AutoValue {
  nlohmann::json value;
  std::string source;
  std::string why = {};
};

// The source of a schedule value `strata config` leaves to the run (RunFacts::length_later): the parser
// sets it, Config::auto_report shows it.
inline constexpr const char* kLeftToTheRun = "auto→the run's length";

inline constexpr double kUnbounded = std::numeric_limits<double>::infinity();

struct Option {
  const char* path;  // "zero_optimization.offload_param.device"
  Kind kind;
  nlohmann::json def;   // the default; null = none (required where it applies, or inferred)
  const char* meaning;  // one line, for docs/config.md
  FieldRef (*field)(Config&);
  double min = -kUnbounded;  // numeric kinds: allowed range
  double max = kUnbounded;
  bool min_exclusive = false;
  bool max_exclusive = false;
  std::uint64_t multiple_of = 0;              // integer/count/bytes: value must be a multiple (0: any)
  std::vector<std::string> choices = {};      // choice: allowed values (canonical spelling)
  std::vector<std::string> unsupported = {};  // choice: DeepSpeed values Strata knowingly does not implement
  bool case_insensitive = false;              // choice: matched ignoring case (stored canonical)
  // "auto": the command-line override consulted first (also checked against an explicit file value) ...
  const char* override_name = nullptr;
  // ... and what "auto" becomes without one. "auto" is rejected when both are null.
  AutoValue (*auto_fallback)(const AutoContext&) = nullptr;
  const char* auto_note = nullptr;  // docs: what "auto" resolves to
  // A default that depends on other keys (evaluated after the file is read) and its docs text.
  nlohmann::json (*dynamic_default)(const Config&) = nullptr;
  const char* default_note = nullptr;
  // Whether the key is in force for this configuration (e.g. betas only for Adam, AdamW, Lion). A key
  // given in the file where it does not apply is an error; applies_note names where it does.
  bool (*applies)(const Config&) = nullptr;
  const char* applies_note = nullptr;
  // A DeepSpeed key Strata accepts and does not act on: why (what Strata does instead). docs/config.md
  // and the resolved table say so. A value from the file gives one warning with the reason, unless it
  // asks for what Strata does anyway: strata_does(config), null when no value does (a bucket size).
  const char* no_effect = nullptr;
  nlohmann::json (*strata_does)(const Config&) = nullptr;

  bool auto_allowed() const { return override_name != nullptr || auto_fallback != nullptr; }
};

// An alternative or deprecated spelling. Either `target` receives the alias's value unchanged, or (flag
// aliases) each of `when_true` is set when the alias is true. A target also given in the file is an error.
struct Alias {
  const char* path;
  const char* target;  // copy alias; nullptr for flag aliases
  std::vector<std::pair<std::string, nlohmann::json>> when_true;
  bool deprecated;
  const char* note;
};

// A DeepSpeed key or section Strata knowingly does not implement: one warning, then ignored.
struct Ignored {
  const char* path;
  const char* reason;
  // true: asking for it (anything but false, null or "enabled": false) is an error rather than a warning,
  // for a feature a user would otherwise believe on (a monitor that never writes).
  bool refused = false;
};

// A name the command line may pass in Overrides.
struct OverrideName {
  const char* name;
  Kind kind;
  const char* meaning;
};

const std::vector<Option>& options();
const std::vector<Alias>& aliases();
const std::vector<Ignored>& ignored();
const std::vector<OverrideName>& override_names();
int option_index(std::string_view path);  // -1 when unknown

// --- values (config_values.cpp) ---

// Converts `v` to the option's type and stores it; throws ConfigError "key: <value> is not ...".
// `key` is the name shown (the alias path when the value came through an alias).
void store(const Option& opt, Config& cfg, const nlohmann::json& v, std::string_view key);
// The field's current value as JSON (enums as their choice string, unset paths as null).
nlohmann::json read(const Option& opt, Config& cfg);
// A value as the user wrote it: strings quoted, numbers in shortest round-trip form.
std::string show(const nlohmann::json& v);
std::string format_number(double d);
// "one of none, cpu, nvme", "an integer from 0 to 3", "a number >= 0", ... for errors and docs.
std::string allowed_text(const Option& opt);
std::string kind_name(Kind k);
// Sizes: `bytes` selects whether B/KB/KiB units are allowed (else only K/M/Ki multipliers).
std::uint64_t parse_size(std::string_view text, bool bytes, std::string_view key);
std::uint64_t size_from_json(const nlohmann::json& v, bool bytes, std::string_view key);

// --- PEFT's LoraConfig fields (lora_peft.cpp) ---

// What Strata does with a field of PEFT's LoraConfig, in adapter_config.json and in the strata.lora block.
enum class PeftRole {
  read,      // a computation Strata does: the strata.lora key of the same name
  limited,   // a computation Strata does at `accepted` values only; others are refused by name
  metadata,  // describes the file or a computation that only a refused value turns on: ignored
};
struct PeftField {
  const char* name;
  PeftRole role;
  nlohmann::json written;  // the value PEFT 0.21 writes by default (peft_adapter_config starts from it)
  // limited: the values accepted (the default, and what asks for nothing: null, [], {}), their docs text,
  // and why any other value is refused.
  bool (*accepts)(const nlohmann::json&) = nullptr;
  const char* accepted = nullptr;
  const char* reason = nullptr;
  bool in_block = true;  // limited: also recognised in strata.lora (false: adapter_config.json only)
};
// Every field PeftModel.save_pretrained writes in PEFT 0.21.2, in its (sorted) order.
const std::vector<PeftField>& peft_fields();
const PeftField* find_peft_field(std::string_view name);  // nullptr when not one of PEFT 0.21's fields
// For a limited field: "" when `v` is accepted, else the refusal after the key, e.g.
// "true is not supported: DoRA is not computed; allowed: false".
std::string peft_refusal(const PeftField& f, const nlohmann::json& v);
// What to write where a strata.lora block or an adapter_config.json has no target_modules.
extern const char* const kTargetModulesRequired;

// --- names ---

std::size_t edit_distance(std::string_view a, std::string_view b);
// The candidate closest to `key` (case differences, typos, a missing suffix), or "" if none is close.
std::string nearest(std::string_view key, const std::vector<std::string>& candidates);
std::string parent_of(std::string_view path);  // "a.b.c" -> "a.b"; "a" -> ""
std::string leaf_of(std::string_view path);    // "a.b.c" -> "c"
// The value at dotted `path` in `root` (null: absent, or an intermediate is no object).
nlohmann::json* find_path(nlohmann::json& root, std::string_view path);
// Sets root[a][b]...; false when an intermediate exists and is not an object (the walk reports it).
bool set_path(nlohmann::json& root, std::string_view path, const nlohmann::json& v);
void erase_path(nlohmann::json& root, std::string_view path);

}  // namespace strata::config_detail
