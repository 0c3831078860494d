// strata/config/config_schema_util.h: what the schema's files (config_schema*.cpp) share to declare keys:
// a typed pointer to a Config field, and the sections built in files of their own. Not a public header.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "config/config_impl.h"

namespace strata::config_detail {

inline FieldRef ref(bool& v) {
  return &v;
}
inline FieldRef ref(std::int64_t& v) {
  return &v;
}
inline FieldRef ref(std::uint64_t& v) {
  return &v;
}
inline FieldRef ref(double& v) {
  return &v;
}
inline FieldRef ref(std::string& v) {
  return &v;
}
inline FieldRef ref(std::array<double, 2>& v) {
  return &v;
}
inline FieldRef ref(std::vector<std::string>& v) {
  return &v;
}
template <class E>
requires std::is_enum_v<E> FieldRef ref(E& e) {
  return enum_ref(e);
}

#define STRATA_FIELD(member) [](Config& c) -> FieldRef { return ref(c.member); }

// The zero_optimization section's keys, appended in table order (Note [order]).
void add_zero_options(std::vector<Option>& o);
// The strata.lora block's keys (config_schema_lora.cpp), appended after the other strata keys.
void add_lora_options(std::vector<Option>& o);

}  // namespace strata::config_detail
