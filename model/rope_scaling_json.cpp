// Hugging Face's rope scaling keys, read and written: model/rope_scaling_json.h.
#include "model/rope_scaling_json.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <optional>
#include <vector>

#include "core/error.h"
#include "core/log.h"

namespace strata::model {

using json = nlohmann::json;

namespace {

double get_number(const json& obj, const char* key, const std::string& where) {
  if (!obj.contains(key) || !obj[key].is_number())
    throw ConfigError(detail::cat(where, ": '", key,
                                  "' must be a number (llama3 rope scaling needs factor, "
                                  "low_freq_factor, high_freq_factor and original_max_position_embeddings)"));
  return obj[key].get<double>();
}

std::vector<double> get_factors(const json& obj, const char* key, const std::string& where) {
  if (!obj.contains(key) || !obj[key].is_array() || obj[key].empty() ||
      !std::all_of(obj[key].begin(), obj[key].end(), [](const json& v) { return v.is_number() && v > 0; }))
    throw ConfigError(detail::cat(
        where, ": '", key, "' must be a list of positive numbers, one per rotary frequency (longrope)"));
  return obj[key].get<std::vector<double>>();
}

// The keys a linear or yarn rope object may hold besides rope_type / type, rope_theta and
// partial_rotary_factor (transformers' _validate_<type>_rope_parameters); another is refused by name.
void check_rope_keys(const json& r, const std::string& type, std::initializer_list<const char*> keys,
                     const std::string& where) {
  for (const auto& item : r.items()) {
    const std::string& k = item.key();
    if (k == "rope_type" || k == "type" || k == "rope_theta" || k == "partial_rotary_factor" ||
        std::any_of(keys.begin(), keys.end(), [&](const char* known) { return k == known; }))
      continue;
    std::string known;
    for (const char* key : keys) known += detail::cat(known.empty() ? "" : ", ", "'", key, "'");
    throw ConfigError(detail::cat(where, ": '", k, "' is not a key of ", type, " rope scaling; it takes ",
                                  known, " (besides rope_type and rope_theta)"));
  }
}

// An optional number of a rope object (absent or null: std::nullopt) and what it must be: any number, a
// number >= 0 or a number > 0.
enum class Bound { any, non_negative, positive };
std::optional<double> optional_number(const json& r, const char* key, Bound bound, const std::string& where) {
  if (!r.contains(key) || r[key].is_null()) return std::nullopt;
  const json& v = r[key];
  const bool ok =
      v.is_number() && (bound == Bound::any || (bound == Bound::non_negative && v.get<double>() >= 0) ||
                        (bound == Bound::positive && v.get<double>() > 0));
  if (!ok)
    throw ConfigError(detail::cat(where, ": '", key, "' is ", v.dump(), "; it must be null or a number",
                                  bound == Bound::positive       ? " > 0"
                                  : bound == Bound::non_negative ? " >= 0"
                                                                 : ""));
  return v.get<double>();
}

// YaRN's keys (transformers' _validate_yarn_rope_parameters); the defaults that need the model's sizes are
// set by finish_yarn.
void parse_yarn(const json& r, RopeScaling& s, const std::string& where) {
  check_rope_keys(r, "yarn",
                  {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
                   "mscale", "mscale_all_dim", "truncate"},
                  where);
  if (!r.contains("factor"))
    throw ConfigError(detail::cat(where,
                                  ": yarn rope scaling needs 'factor': a number > 0, or null for "
                                  "max_position_embeddings / original_max_position_embeddings"));
  if (const std::optional<double> f = optional_number(r, "factor", Bound::positive, where)) {
    s.factor = *f;
    s.factor_given = true;
  }
  if (const std::optional<double> a = optional_number(r, "attention_factor", Bound::positive, where)) {
    s.attention_factor = *a;
    s.attention_factor_given = true;
  }
  s.original_max_position_embeddings = 0;  // the top-level key's or max_position_embeddings (finish_yarn)
  if (r.contains("original_max_position_embeddings") && !r["original_max_position_embeddings"].is_null()) {
    const json& o = r["original_max_position_embeddings"];
    if (!o.is_number_integer() || o.get<int64_t>() < 1)
      throw ConfigError(detail::cat(where, ": 'original_max_position_embeddings' is ", o.dump(),
                                    "; it must be null or a whole number >= 1"));
    s.original_max_position_embeddings = o.get<int64_t>();
  }
  s.beta_fast = optional_number(r, "beta_fast", Bound::non_negative, where);
  s.beta_slow = optional_number(r, "beta_slow", Bound::non_negative, where);
  s.mscale = optional_number(r, "mscale", Bound::any, where);
  s.mscale_all_dim = optional_number(r, "mscale_all_dim", Bound::any, where);
  if (r.contains("truncate")) {
    if (!r["truncate"].is_boolean())
      throw ConfigError(
          detail::cat(where, ": 'truncate' is ", r["truncate"].dump(), "; it must be true or false"));
    s.truncate = r["truncate"].get<bool>();
  }
}

}  // namespace

// Hugging Face's rope_scaling object (or rope_parameters, which also carries rope_theta).
// `phi3`: Phi-3's config reads "yarn" as longrope too, and takes no other scaling (transformers' Phi3Config).
RopeScaling parse_rope_scaling(const json& r, const std::string& where, bool phi3) {
  RopeScaling s;
  if (r.is_null()) return s;
  if (!r.is_object()) throw ConfigError(detail::cat(where, ": expected an object or null, got ", r.dump()));
  const json* type = r.contains("rope_type") ? &r["rope_type"] : r.contains("type") ? &r["type"] : nullptr;
  if (!type || !type->is_string())
    throw ConfigError(detail::cat(where,
                                  ": 'rope_type' must be a string (\"default\", \"linear\", \"llama3\", "
                                  "\"yarn\" or \"longrope\")"));
  s.type = type->get<std::string>();
  if (s.type == "su" || (phi3 && s.type == "yarn")) s.type = "longrope";  // as transformers reads Phi-3's
  if (r.contains("partial_rotary_factor") &&
      !(r["partial_rotary_factor"].is_number() && r["partial_rotary_factor"] == 1))
    throw ConfigError(detail::cat(where, ": partial_rotary_factor ", r["partial_rotary_factor"].dump(),
                                  " is not implemented; the rotary embedding covers the whole head here"));
  if (s.type == "default") return s;
  if (phi3 && s.type != "longrope")
    throw ConfigError(detail::cat(where, ": rope_type \"", s.type,
                                  "\" in a phi3 config; transformers' Phi3Config takes only \"default\" and "
                                  "\"longrope\" (\"su\" and \"yarn\" read as it)"));
  if (s.type == "linear") {
    check_rope_keys(r, "linear", {"factor"}, where);
    if (!r.contains("factor") || !r["factor"].is_number() || !(r["factor"].get<double>() > 0))
      throw ConfigError(detail::cat(where,
                                    ": linear rope scaling needs 'factor', a number > 0 (the positions' "
                                    "divisor); got ",
                                    r.contains("factor") ? r["factor"].dump() : std::string("none")));
    s.factor = r["factor"].get<double>();
    return s;
  }
  if (s.type == "yarn") {
    parse_yarn(r, s, where);
    return s;
  }
  if (s.type == "longrope") {
    s.short_factor = get_factors(r, "short_factor", where);
    s.long_factor = get_factors(r, "long_factor", where);
    if (r.contains("original_max_position_embeddings")) {
      const json& o = r["original_max_position_embeddings"];
      if (!o.is_number_integer() || o.get<int64_t>() < 1)
        throw ConfigError(
            detail::cat(where, ": 'original_max_position_embeddings' must be a whole number >= 1"));
      s.original_max_position_embeddings = o.get<int64_t>();
    } else {
      s.original_max_position_embeddings = 0;  // the top-level key's (from_json)
    }
    for (const char* k : {"factor", "attention_factor"})
      if (r.contains(k) && !r[k].is_null() && !(r[k].is_number() && r[k] > 0))
        throw ConfigError(detail::cat(where, ": '", k, "' must be a positive number"));
    s.factor_given = r.contains("factor") && !r["factor"].is_null();
    s.attention_factor_given = r.contains("attention_factor") && !r["attention_factor"].is_null();
    if (s.factor_given) s.factor = r["factor"].get<double>();
    if (s.attention_factor_given) s.attention_factor = r["attention_factor"].get<double>();
    return s;
  }
  if (s.type != "llama3")
    throw ConfigError(detail::cat(where, ": rope_type \"", s.type,
                                  "\" is not implemented; Strata computes \"default\", "
                                  "\"linear\", \"llama3\", \"yarn\" and \"longrope\" rotary frequencies"));
  s.factor = get_number(r, "factor", where);
  s.low_freq_factor = get_number(r, "low_freq_factor", where);
  s.high_freq_factor = get_number(r, "high_freq_factor", where);
  const double omp = get_number(r, "original_max_position_embeddings", where);
  s.original_max_position_embeddings = int64_t(omp);
  if (!(s.factor > 0) || !(s.low_freq_factor > 0) || !(s.high_freq_factor > s.low_freq_factor) ||
      !(omp >= 1) || double(s.original_max_position_embeddings) != omp)
    throw ConfigError(detail::cat(where,
                                  ": llama3 rope scaling needs factor > 0, 0 < low_freq_factor < "
                                  "high_freq_factor and a whole original_max_position_embeddings >= 1; got ",
                                  r.dump()));
  return s;
}

// longrope's remaining parameters, once the model's sizes are known (transformers'
// _compute_longrope_parameters): the original length (top-level when not in the rope object), the factors'
// count, and the attention factor's default.
void finish_longrope(RopeScaling& s, const json& j, int64_t max_seq_len, int64_t head_dim,
                     const std::string& where) {
  if (s.original_max_position_embeddings == 0) {
    if (!j.contains("original_max_position_embeddings") ||
        !j["original_max_position_embeddings"].is_number_integer() ||
        j["original_max_position_embeddings"].get<int64_t>() < 1)
      throw ConfigError(detail::cat(where,
                                    ": longrope rope scaling needs original_max_position_embeddings "
                                    "(in rope_scaling or at the top level), a whole number >= 1"));
    s.original_max_position_embeddings = j["original_max_position_embeddings"].get<int64_t>();
  }
  for (const auto* f : {&s.short_factor, &s.long_factor})
    if (int64_t(f->size()) != head_dim / 2)
      throw ConfigError(detail::cat(
          where, ": longrope's ", f == &s.short_factor ? "short_factor" : "long_factor", " holds ", f->size(),
          " factors; head_dim ", head_dim, " has ", head_dim / 2, " rotary frequencies"));
  if (!s.factor_given) s.factor = double(max_seq_len) / double(s.original_max_position_embeddings);
  if (!s.attention_factor_given)
    s.attention_factor =
        s.factor <= 1.0
            ? 1.0
            : std::sqrt(1.0 + std::log(s.factor) / std::log(double(s.original_max_position_embeddings)));
}

// yarn's remaining parameters, once the model's sizes are known (transformers' standardize_rope_params and
// _compute_yarn_parameters): the original length, factor when null, the attention factor's default.
void finish_yarn(RopeScaling& s, const json& j, int64_t max_seq_len, const std::string& where) {
  const json* top =
      j.contains("original_max_position_embeddings") ? &j["original_max_position_embeddings"] : nullptr;
  if (top && !(top->is_number_integer() && top->get<int64_t>() >= 1))
    throw ConfigError(detail::cat(where, ": the top-level 'original_max_position_embeddings' is ",
                                  top->dump(), "; yarn reads it, so it must be a whole number >= 1"));
  if (top && s.original_max_position_embeddings > 0 &&
      top->get<int64_t>() != s.original_max_position_embeddings)
    throw ConfigError(detail::cat(where, ": original_max_position_embeddings ",
                                  s.original_max_position_embeddings,
                                  " differs from the top-level original_max_position_embeddings ",
                                  top->dump(), ", which transformers would use instead; keep one"));
  if (s.original_max_position_embeddings == 0)
    s.original_max_position_embeddings = top ? top->get<int64_t>() : max_seq_len;
  const double implicit = double(max_seq_len) / double(s.original_max_position_embeddings);
  if (!s.factor_given) s.factor = implicit;
  if (implicit != s.factor && implicit != 1.0)
    STRATA_LOG_WARN(where, ": yarn's factor ", s.factor,
                    " is not max_position_embeddings / original_max_position_embeddings = ", implicit,
                    "; the factor is used, as transformers does");
  const double fast = s.beta_fast.value_or(0.0) != 0.0 ? *s.beta_fast : 32.0;
  const double slow = s.beta_slow.value_or(0.0) != 0.0 ? *s.beta_slow : 1.0;
  if (fast < slow)
    throw ConfigError(detail::cat(where, ": yarn's beta_fast ", fast, " is below beta_slow ", slow,
                                  "; beta_fast (default 32) must be at least beta_slow (default 1)"));
  if (s.attention_factor_given) return;
  auto get_mscale = [&](double m) { return s.factor <= 1.0 ? 1.0 : 0.1 * m * std::log(s.factor) + 1.0; };
  const double m = s.mscale.value_or(0.0), m_all = s.mscale_all_dim.value_or(0.0);
  s.attention_factor = m != 0.0 && m_all != 0.0 ? get_mscale(m) / get_mscale(m_all) : get_mscale(1.0);
  if (!(s.attention_factor > 0.0) || !std::isfinite(s.attention_factor))
    throw ConfigError(detail::cat(where, ": yarn's attention factor from mscale ", m, " and mscale_all_dim ",
                                  m_all, " is ", s.attention_factor,
                                  "; it must be a finite number > 0: change them or set attention_factor"));
}

json rope_scaling_json(const RopeScaling& s) {
  if (s.is_default()) return nullptr;
  if (s.type == "linear") return json{{"rope_type", "linear"}, {"factor", s.factor}};
  if (s.type == "yarn") {
    json j{{"rope_type", "yarn"},
           {"factor", s.factor_given ? json(s.factor) : json(nullptr)},
           {"original_max_position_embeddings", s.original_max_position_embeddings}};
    if (s.attention_factor_given) j["attention_factor"] = s.attention_factor;
    if (s.beta_fast) j["beta_fast"] = *s.beta_fast;
    if (s.beta_slow) j["beta_slow"] = *s.beta_slow;
    if (s.mscale) j["mscale"] = *s.mscale;
    if (s.mscale_all_dim) j["mscale_all_dim"] = *s.mscale_all_dim;
    if (s.truncate) j["truncate"] = *s.truncate;
    return j;
  }
  if (s.type == "longrope") {
    json j{{"rope_type", "longrope"},
           {"short_factor", s.short_factor},
           {"long_factor", s.long_factor},
           {"original_max_position_embeddings", s.original_max_position_embeddings}};
    if (s.factor_given) j["factor"] = s.factor;
    if (s.attention_factor_given) j["attention_factor"] = s.attention_factor;
    return j;
  }
  return json{{"rope_type", s.type},
              {"factor", s.factor},
              {"low_freq_factor", s.low_freq_factor},
              {"high_freq_factor", s.high_freq_factor},
              {"original_max_position_embeddings", s.original_max_position_embeddings}};
}

}  // namespace strata::model
