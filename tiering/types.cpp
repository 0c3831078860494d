#include "tiering/types.h"

#include <array>
#include <string>

#include "core/error.h"

namespace strata::tiering {
namespace {

constexpr std::array<const char*, kTierCount> kTierNames = {"device", "pinned", "nvme"};
constexpr std::array<const char*, kKindCount> kKindNames = {"param",      "grad",    "master",    "exp_avg",
                                                            "exp_avg_sq", "staging", "activation"};
constexpr std::array<const char*, 4> kStateNames = {"absent", "in_flight", "resident", "dirty"};
constexpr std::array<const char*, 4> kPhaseNames = {"idle", "forward", "backward", "optimizer"};

template <typename E, std::size_t N>
E parse(std::string_view name, std::string_view what, const std::array<const char*, N>& names) {
  for (std::size_t i = 0; i < N; ++i)
    if (name == names[i]) return E(i);
  std::string allowed;
  for (std::size_t i = 0; i < N; ++i) allowed += std::string(i ? ", " : "") + names[i];
  throw ConfigError(strata::detail::cat(what, ": \"", name, "\" is not one of ", allowed));
}

}  // namespace

const char* to_string(Tier t) {
  return kTierNames[std::size_t(t)];
}
const char* to_string(Kind k) {
  return kKindNames[std::size_t(k)];
}
const char* to_string(State s) {
  return kStateNames[std::size_t(s)];
}
const char* to_string(Phase p) {
  return kPhaseNames[std::size_t(p)];
}

Tier parse_tier(std::string_view name, std::string_view what) {
  return parse<Tier>(name, what, kTierNames);
}
Kind parse_kind(std::string_view name, std::string_view what) {
  return parse<Kind>(name, what, kKindNames);
}
DType parse_dtype(std::string_view name, std::string_view what) {
  std::array<const char*, kDTypeCount> names;
  for (std::size_t i = 0; i < names.size(); ++i) names[i] = dtype_name(DType(i));
  return parse<DType>(name, what, names);
}
State parse_state(std::string_view name, std::string_view what) {
  return parse<State>(name, what, kStateNames);
}
Phase parse_phase(std::string_view name, std::string_view what) {
  return parse<Phase>(name, what, kPhaseNames);
}

}  // namespace strata::tiering
