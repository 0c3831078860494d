// Config values: JSON → typed fields with range checks, sizes with units, and how values are shown.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <regex>

#include "config/config_impl.h"
#include "core/error.h"

namespace strata::config_detail {
namespace {

[[noreturn]] void fail(std::string_view key, const nlohmann::json& v, std::string_view what) {
  throw ConfigError(detail::cat(key, ": ", show(v), " ", what));
}

[[noreturn]] void fail_allowed(std::string_view key, const nlohmann::json& v, std::string_view what,
                               const Option& o) {
  throw ConfigError(detail::cat(key, ": ", show(v), " ", what, "; allowed: ", allowed_text(o)));
}

bool below_min(const Option& o, double x) {
  return o.min_exclusive ? x <= o.min : x < o.min;
}
bool above_max(const Option& o, double x) {
  return o.max_exclusive ? x >= o.max : x > o.max;
}
bool out_of_range(const Option& o, double x) {
  return below_min(o, x) || above_max(o, x);
}

std::string range_text(const Option& o) {
  bool lo = std::isfinite(o.min), hi = std::isfinite(o.max);
  if (o.kind == Kind::real || o.kind == Kind::real_pair) {
    if (lo && hi)
      return detail::cat(" in ", o.min_exclusive ? "(" : "[", format_number(o.min), ", ",
                         format_number(o.max), o.max_exclusive ? ")" : "]");
  } else if (lo && hi) {
    return detail::cat(" from ", format_number(o.min), " to ", format_number(o.max));
  }
  if (lo) return detail::cat(o.min_exclusive ? " > " : " >= ", format_number(o.min));
  if (hi) return detail::cat(o.max_exclusive ? " < " : " <= ", format_number(o.max));
  return "";
}

std::int64_t integer_from_json(const nlohmann::json& v, std::string_view key, const Option& o) {
  if (v.is_number_unsigned()) {
    auto u = v.get<std::uint64_t>();
    if (u > std::uint64_t(INT64_MAX)) fail_allowed(key, v, "is too large", o);
    return std::int64_t(u);
  }
  if (v.is_number_integer()) return v.get<std::int64_t>();
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (!std::isfinite(d) || std::floor(d) != d) fail_allowed(key, v, "is not a whole number", o);
    if (std::fabs(d) >= 9.2e18) fail_allowed(key, v, "is too large", o);
    return std::int64_t(d);
  }
  fail_allowed(key, v, "is not an integer", o);
}

double real_from_json(const nlohmann::json& v, std::string_view key, const Option& o) {
  if (!v.is_number()) fail_allowed(key, v, "is not a number", o);
  double d = v.get<double>();
  if (!std::isfinite(d)) fail_allowed(key, v, "is not a finite number", o);
  return d;
}

bool iequal(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower((unsigned char)x) == std::tolower((unsigned char)y);
         });
}

int choice_index(const Option& o, const nlohmann::json& v, std::string_view key) {
  // A choice among "true" and "false" (and others, such as "auto") takes JSON's true and false as well.
  const bool has_bool = std::find(o.choices.begin(), o.choices.end(), "true") != o.choices.end();
  if (has_bool && v.is_boolean()) return choice_index(o, v.get<bool>() ? "true" : "false", key);
  if (!v.is_string()) fail_allowed(key, v, "is not a string", o);
  const auto& s = v.get_ref<const std::string&>();
  for (std::size_t i = 0; i < o.choices.size(); ++i)
    if (o.choices[i] == s || (o.case_insensitive && iequal(o.choices[i], s))) return int(i);
  for (const auto& u : o.unsupported)
    if (iequal(u, s))
      throw ConfigError(detail::cat(key, ": ", show(v), " is a DeepSpeed choice Strata does not implement; ",
                                    allowed_text(o)));
  for (const auto& c : o.choices)
    if (iequal(c, s))
      throw ConfigError(detail::cat(key, ": ", show(v), " is not ", allowed_text(o),
                                    " (names are case-sensitive: \"", c, "\")"));
  throw ConfigError(detail::cat(key, ": ", show(v), " is not ", allowed_text(o)));
}

// PEFT's shorthand for every linear layer but the output one (matched ignoring case, as PEFT does).
constexpr const char* kAllLinear = "all-linear";

// A JSON list of distinct non-empty strings, into `out`.
void store_string_list(const Option& o, std::vector<std::string>& out, const nlohmann::json& v,
                       std::string_view key) {
  out.clear();
  for (const nlohmann::json& e : v) {
    if (!e.is_string() || e.get_ref<const std::string&>().empty())
      fail_allowed(key, v, detail::cat("has an entry ", show(e), " that is not a non-empty string"), o);
    const std::string& name = e.get_ref<const std::string&>();
    if (std::find(out.begin(), out.end(), name) != out.end())
      fail_allowed(key, v, detail::cat("lists \"", name, "\" twice"), o);
    out.push_back(name);
  }
}

void store_names(const Option& o, std::vector<std::string>& out, const nlohmann::json& v,
                 std::string_view key) {
  out.clear();
  if (v.is_null()) return;
  if (!v.is_array()) fail_allowed(key, v, "is not a list of strings", o);
  store_string_list(o, out, v, key);
}

// Note [target_modules as PEFT reads it]: PEFT's check_target_module_exists takes a JSON list as names
// (a module whose path equals an entry or ends with "." + entry) and a string as a regular expression
// re.fullmatch()ed against the path, except "all-linear" in any case (_maybe_include_all_linear_layers).
// A list entry "all-linear" would be a module name matching nothing, so it is refused with the spelling
// that works; "all-linear" is kept in lower case, the spelling model/lora.cpp compares. A pattern must
// compile as a std::regex (ECMAScript), which model/lora.cpp matches with (std::regex_match, a full match
// as re.fullmatch): the common Python patterns (.*, groups, alternation, classes) read the same there;
// Python-only syntax such as (?P<name>...) is refused here, before any model exists.
void store_modules(const Option& o, ModulesRef m, const nlohmann::json& v, std::string_view key) {
  m.names->clear();
  *m.pattern = false;
  if (v.is_null()) return;
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    if (s.empty()) fail_allowed(key, v, "is empty", o);
    if (iequal(s, kAllLinear)) {
      m.names->push_back(kAllLinear);
      return;
    }
    try {
      std::regex check(s, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      fail(key, v,
           detail::cat("is not a regular expression Strata can match (", e.what(),
                       "); a string is PEFT's regular expression over the whole module path, e.g. "
                       "\".*\\\\.(q_proj|v_proj)\" (a list gives names: [\"q_proj\", \"v_proj\"])"));
    }
    m.names->push_back(s);
    *m.pattern = true;
    return;
  }
  if (!v.is_array()) fail_allowed(key, v, "is neither a string nor a list of strings", o);
  if (v.empty()) fail_allowed(key, v, "is empty", o);
  store_string_list(o, *m.names, v, key);
  for (const std::string& name : *m.names)
    if (iequal(name, kAllLinear))
      fail(key, v,
           detail::cat("lists \"", name,
                       "\", which PEFT reads as a module name inside a list; write \"target_modules\": "
                       "\"all-linear\" (a string) for every linear layer"));
}

}  // namespace

std::string kind_name(Kind k) {
  switch (k) {
    case Kind::boolean:
      return "bool";
    case Kind::integer:
      return "integer";
    case Kind::count:
      return "count";
    case Kind::bytes:
      return "bytes";
    case Kind::real:
      return "number";
    case Kind::choice:
      return "string";
    case Kind::path:
      return "path";
    case Kind::paths:
      return "path or [paths]";
    case Kind::real_pair:
      return "[number, number]";
    case Kind::names:
      return "[strings]";
    case Kind::modules:
      return "string or [strings]";
  }
  return "?";
}

std::string format_number(double d) {
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (std::floor(d) == d && std::fabs(d) < 1e15) return detail::cat(std::int64_t(d));
  char buf[40];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  return buf;
}

std::string show(const nlohmann::json& v) {
  if (v.is_number_float()) return format_number(v.get<double>());
  if (v.is_array() && v.size() <= 4) {
    std::string s = "[";
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + show(v[i]);
    return s + "]";
  }
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

std::string allowed_text(const Option& o) {
  std::string mult = o.multiple_of ? detail::cat(", a multiple of ", o.multiple_of) : std::string();
  switch (o.kind) {
    case Kind::boolean:
      return "true or false";
    case Kind::integer:
      return detail::cat("an integer", range_text(o), mult);
    case Kind::count:
      return detail::cat("a whole number of elements", range_text(o), mult,
                         " (e.g. 500000000, 5e8, \"500M\")");
    case Kind::bytes:
      return detail::cat("a byte size", range_text(o), mult, " (e.g. 1048576, 5e8, \"512MB\", \"2GiB\")");
    case Kind::real:
      return detail::cat("a number", range_text(o));
    case Kind::path:
      return "a path (string)";
    case Kind::paths:
      return "a path (string) or a list of distinct paths";
    case Kind::real_pair:
      return detail::cat("a pair [a, b] of numbers", range_text(o));
    case Kind::names:
      return "a list of distinct module names, e.g. [\"lm_head\"]";
    case Kind::modules:
      return "PEFT's module names or paths, e.g. [\"q_proj\", \"v_proj\"], or \"all-linear\", or one "
             "string: a regular expression the whole module path must match";
    case Kind::choice: {
      std::string s = "one of ";
      for (std::size_t i = 0; i < o.choices.size(); ++i) s += (i ? ", " : "") + o.choices[i];
      return s;
    }
  }
  return "";
}

// Note [exact sizes]: "1.5GiB" must become exactly 1610612736, never 1610612735.99; the mantissa is kept
// as an integer and the decimal exponent applied in 128-bit arithmetic, and a size that is not a whole
// number ("1.0001KB") is an error rather than rounded.
std::uint64_t parse_size(std::string_view text, bool bytes, std::string_view key) {
  const std::string shown = detail::cat("\"", text, "\"");
  auto bad = [&](std::string_view why) -> ConfigError {
    return ConfigError(
        detail::cat(key, ": ", shown, " ", why, "; allowed: ",
                    bytes ? "a byte size such as 1048576, 5e8, \"512MB\" (10^6), \"2GiB\" (2^30), "
                            "\"1.5G\" (10^9)"
                          : "a whole number of elements such as 500000000, 5e8, \"500M\", \"64Ki\""));
  };
  std::size_t i = 0, n = text.size();
  auto skip_space = [&] {
    while (i < n && std::isspace((unsigned char)text[i])) ++i;
  };
  skip_space();
  if (i < n && text[i] == '-') throw bad("is negative");
  if (i < n && text[i] == '+') ++i;
  std::string digits;  // significant digits of the mantissa
  int scale = 0;       // value = digits × 10^scale × unit
  bool any = false, dot = false;
  for (; i < n; ++i) {
    char c = text[i];
    if (c == '.' && !dot) {
      dot = true;
    } else if (std::isdigit((unsigned char)c)) {
      any = true;
      if (!(digits.empty() && c == '0')) digits += c;
      if (dot) --scale;
    } else {
      break;
    }
  }
  if (!any) throw bad("is not a size");
  if (i < n && (text[i] == 'e' || text[i] == 'E') && i + 1 < n &&
      (std::isdigit((unsigned char)text[i + 1]) || text[i + 1] == '-' || text[i + 1] == '+')) {
    ++i;
    int sign = 1;
    if (text[i] == '-' || text[i] == '+') sign = text[i++] == '-' ? -1 : 1;
    if (i >= n || !std::isdigit((unsigned char)text[i])) throw bad("has a malformed exponent");
    int e = 0;
    for (; i < n && std::isdigit((unsigned char)text[i]); ++i) e = std::min(e * 10 + (text[i] - '0'), 100000);
    scale += sign * e;
  }
  skip_space();
  std::string unit;
  for (; i < n && std::isalpha((unsigned char)text[i]); ++i)
    unit += char(std::tolower((unsigned char)text[i]));
  skip_space();
  if (i != n) throw bad("is not a size");
  if (!unit.empty() && unit.back() == 'b') {
    if (!bytes) throw bad("is a count of elements, not bytes (drop the B)");
    unit.pop_back();
  }
  static const std::pair<const char*, unsigned __int128> units[] = {
      {"", 1},
      {"k", 1000},
      {"m", 1000000},
      {"g", 1000000000},
      {"t", 1000000000000ull},
      {"p", 1000000000000000ull},
      {"ki", 1ull << 10},
      {"mi", 1ull << 20},
      {"gi", 1ull << 30},
      {"ti", 1ull << 40},
      {"pi", 1ull << 50},
  };
  unsigned __int128 mult = 0;
  for (const auto& [name, m] : units)
    if (unit == name) mult = m;
  if (mult == 0)
    throw bad(detail::cat("has an unknown unit \"", unit, "\" (K, M, G, T, P or Ki, Mi, Gi, Ti, Pi)"));
  while (!digits.empty() && digits.back() == '0' && scale < 0) {  // 1.50 -> 15 × 10^-1
    digits.pop_back();
    ++scale;
  }
  if (digits.empty()) return 0;
  if (digits.size() > 30) throw bad("has too many digits");
  unsigned __int128 v = 0;  // < 10^30 < 2^100
  for (char c : digits) v = v * 10 + unsigned(c - '0');
  if (v > ~(unsigned __int128)0 / mult) throw bad("is too large");
  v *= mult;
  const unsigned __int128 limit = ~std::uint64_t(0);
  for (; scale > 0; --scale) {
    v *= 10;
    if (v > limit) throw bad("is too large");
  }
  for (; scale < 0; ++scale) {
    if (v % 10 != 0) throw bad(bytes ? "is not a whole number of bytes" : "is not a whole number");
    v /= 10;
  }
  if (v > limit) throw bad("is too large");
  return std::uint64_t(v);
}

std::uint64_t size_from_json(const nlohmann::json& v, bool bytes, std::string_view key) {
  if (v.is_string()) return parse_size(v.get_ref<const std::string&>(), bytes, key);
  const char* what = bytes ? "a byte size" : "a whole number of elements";
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer()) {  // signed: a document built in C++ from int keeps its positive sizes signed
    if (v.get<std::int64_t>() < 0) fail(key, v, detail::cat("is negative; allowed: ", what, " >= 0"));
    return std::uint64_t(v.get<std::int64_t>());
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (!std::isfinite(d) || std::floor(d) != d)
      fail(key, v, detail::cat("is not a whole number; allowed: ", what));
    if (d < 0) fail(key, v, detail::cat("is negative; allowed: ", what, " >= 0"));
    if (d >= 18446744073709551616.0) fail(key, v, "is too large");
    return std::uint64_t(d);
  }
  fail(key, v, detail::cat("is not ", what, " (a number, or a string such as \"512MB\")"));
}

void store(const Option& o, Config& cfg, const nlohmann::json& v, std::string_view key) {
  FieldRef f = o.field(cfg);
  auto check_multiple = [&](std::uint64_t x) {
    if (o.multiple_of && x % o.multiple_of != 0)
      fail_allowed(key, v, detail::cat("is not a multiple of ", o.multiple_of), o);
  };
  switch (o.kind) {
    case Kind::boolean:
      if (!v.is_boolean()) fail(key, v, "is not a boolean (true or false)");
      *std::get<bool*>(f) = v.get<bool>();
      return;
    case Kind::integer: {
      std::int64_t x = integer_from_json(v, key, o);
      if (out_of_range(o, double(x))) fail_allowed(key, v, "is out of range", o);
      if (x >= 0) check_multiple(std::uint64_t(x));
      *std::get<std::int64_t*>(f) = x;
      return;
    }
    case Kind::count:
    case Kind::bytes: {
      std::uint64_t x = size_from_json(v, o.kind == Kind::bytes, key);
      if (out_of_range(o, double(x))) fail_allowed(key, v, "is out of range", o);
      check_multiple(x);
      *std::get<std::uint64_t*>(f) = x;
      return;
    }
    case Kind::real: {
      double x = real_from_json(v, key, o);
      if (out_of_range(o, x)) fail_allowed(key, v, "is out of range", o);
      *std::get<double*>(f) = x;
      return;
    }
    case Kind::choice: {
      int i = choice_index(o, v, key);
      if (auto* s = std::get_if<std::string*>(&f))
        **s = o.choices[std::size_t(i)];
      else
        std::get<EnumRef>(f).set(std::get<EnumRef>(f).p, i);
      return;
    }
    case Kind::path:
      if (v.is_null()) {
        std::get<std::string*>(f)->clear();
        return;
      }
      if (!v.is_string()) fail_allowed(key, v, "is not a string", o);
      *std::get<std::string*>(f) = v.get<std::string>();
      return;
    case Kind::paths: {
      std::vector<std::string>& out = *std::get<std::vector<std::string>*>(f);
      out.clear();
      if (v.is_null() || (v.is_string() && v.get<std::string>().empty())) return;
      if (v.is_string()) {
        out.push_back(v.get<std::string>());
        return;
      }
      if (!v.is_array() || v.empty()) fail_allowed(key, v, "is neither a string nor a list of them", o);
      for (const nlohmann::json& e : v) {
        if (!e.is_string() || e.get<std::string>().empty())
          fail_allowed(key, v, detail::cat("has an entry ", show(e), " that is not a non-empty string"), o);
        if (std::find(out.begin(), out.end(), e.get<std::string>()) != out.end())
          fail_allowed(key, v, detail::cat("lists \"", e.get<std::string>(), "\" twice"), o);
        out.push_back(e.get<std::string>());
      }
      return;
    }
    case Kind::names:
      store_names(o, *std::get<std::vector<std::string>*>(f), v, key);
      return;
    case Kind::modules:
      store_modules(o, std::get<ModulesRef>(f), v, key);
      return;
    case Kind::real_pair: {
      if (!v.is_array() || v.size() != 2) fail_allowed(key, v, "is not a pair", o);
      std::array<double, 2> p{};
      for (std::size_t i = 0; i < 2; ++i) {
        p[i] = real_from_json(v[i], key, o);
        if (out_of_range(o, p[i])) fail_allowed(key, v, "is out of range", o);
      }
      *std::get<std::array<double, 2>*>(f) = p;
      return;
    }
  }
}

nlohmann::json read(const Option& o, Config& cfg) {
  FieldRef f = o.field(cfg);
  switch (o.kind) {
    case Kind::boolean:
      return *std::get<bool*>(f);
    case Kind::integer:
      return *std::get<std::int64_t*>(f);
    case Kind::count:
    case Kind::bytes:
      return *std::get<std::uint64_t*>(f);
    case Kind::real:
      return *std::get<double*>(f);
    case Kind::choice:
      if (auto* s = std::get_if<std::string*>(&f)) return **s;
      return o.choices[std::size_t(std::get<EnumRef>(f).get(std::get<EnumRef>(f).p))];
    case Kind::path: {
      const std::string& s = *std::get<std::string*>(f);
      return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s);
    }
    case Kind::paths: {
      const std::vector<std::string>& s = *std::get<std::vector<std::string>*>(f);
      if (s.empty()) return nullptr;
      return s.size() == 1 ? nlohmann::json(s[0]) : nlohmann::json(s);  // DeepSpeed's string when one
    }
    case Kind::real_pair: {
      const auto& p = *std::get<std::array<double, 2>*>(f);
      return nlohmann::json::array({p[0], p[1]});
    }
    case Kind::names: {
      const std::vector<std::string>& s = *std::get<std::vector<std::string>*>(f);
      return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s);
    }
    case Kind::modules: {
      const ModulesRef m = std::get<ModulesRef>(f);
      if (m.names->empty()) return nullptr;
      if (*m.pattern || (m.names->size() == 1 && (*m.names)[0] == kAllLinear)) return (*m.names)[0];
      return *m.names;
    }
  }
  return nullptr;
}

// Optimal string alignment distance (Levenshtein plus adjacent transpositions), ignoring case.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  const std::size_t n = a.size(), m = b.size();
  std::vector<std::vector<std::size_t>> d(n + 1, std::vector<std::size_t>(m + 1));
  for (std::size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= m; ++j) d[0][j] = j;
  auto lo = [](char c) { return std::tolower((unsigned char)c); };
  for (std::size_t i = 1; i <= n; ++i)
    for (std::size_t j = 1; j <= m; ++j) {
      std::size_t cost = lo(a[i - 1]) == lo(b[j - 1]) ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && lo(a[i - 1]) == lo(b[j - 2]) && lo(a[i - 2]) == lo(b[j - 1]))
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

std::string nearest(std::string_view key, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = SIZE_MAX;
  for (const auto& c : candidates) {
    std::size_t d = edit_distance(key, c);
    std::size_t shorter = std::min(key.size(), c.size());
    bool prefix = shorter >= 4 && (c.compare(0, key.size(), key) == 0 || key.compare(0, c.size(), c) == 0);
    bool close = d <= std::max<std::size_t>(2, std::max(key.size(), c.size()) / 3);
    if ((close || prefix) && d < best_d) {
      best = c;
      best_d = d;
    }
  }
  return best;
}

std::string parent_of(std::string_view path) {
  auto dot = path.rfind('.');
  return dot == std::string_view::npos ? std::string() : std::string(path.substr(0, dot));
}

std::string leaf_of(std::string_view path) {
  auto dot = path.rfind('.');
  return std::string(dot == std::string_view::npos ? path : path.substr(dot + 1));
}

namespace {
// The dot-separated keys of `path`, in order ("a.b.c" -> a, b, c).
std::vector<std::string> path_keys(std::string_view path) {
  std::vector<std::string> keys;
  for (std::size_t start = 0;;) {
    const std::size_t dot = path.find('.', start);
    keys.emplace_back(
        path.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
    if (dot == std::string_view::npos) return keys;
    start = dot + 1;
  }
}
}  // namespace

nlohmann::json* find_path(nlohmann::json& root, std::string_view path) {
  nlohmann::json* cur = &root;
  for (const std::string& key : path_keys(path)) {
    if (!cur->is_object()) return nullptr;
    auto it = cur->find(key);
    if (it == cur->end()) return nullptr;
    cur = &*it;
  }
  return cur;
}

bool set_path(nlohmann::json& root, std::string_view path, const nlohmann::json& v) {
  const std::vector<std::string> keys = path_keys(path);
  nlohmann::json* cur = &root;
  for (std::size_t i = 0; i + 1 < keys.size(); ++i) {
    nlohmann::json& next = (*cur)[keys[i]];
    if (next.is_null()) next = nlohmann::json::object();
    if (!next.is_object()) return false;
    cur = &next;
  }
  (*cur)[keys.back()] = v;
  return true;
}

void erase_path(nlohmann::json& root, std::string_view path) {
  std::string parent = parent_of(path);
  nlohmann::json* p = parent.empty() ? &root : find_path(root, parent);
  if (p && p->is_object()) p->erase(leaf_of(path));
}

}  // namespace strata::config_detail

namespace strata {

std::uint64_t parse_byte_size(std::string_view text, std::string_view key) {
  return config_detail::parse_size(text, /*bytes=*/true, key);
}

}  // namespace strata
