// strata/tiering/snapshot.h: everything the tier manager knows at one instant, as a value and as
// versioned JSON ({"schema": "strata.memprof", "version": 1, "type": "snapshot", ...}).
//
// Example:
//   strata::tiering::Snapshot s = manager.snapshot();
//   std::string text = s.to_json().dump(2);
//   Snapshot back = Snapshot::from_json(nlohmann::json::parse(text));   // back == s
//
// from_json raises strata::ConfigError for another schema, a newer version, or a field of the wrong type
// (naming the field).
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "tiering/accounting.h"
#include "tiering/caching_allocator.h"
#include "tiering/types.h"

namespace strata::tiering {

inline constexpr const char* kSchema = "strata.memprof";
inline constexpr int kSchemaVersion = 1;

struct TierSnapshot {
  bool present = false;                 // false: no such tier configured (e.g. no NVMe store)
  std::uint64_t capacity = 0;           // the budget; 0 with present: unlimited
  std::uint64_t used = 0;               // CURRENT bytes asked for by live blocks
  std::uint64_t reserved = 0;           // CURRENT bytes taken from the tier
  std::uint64_t free = 0;               // CURRENT capacity - reserved
  std::uint64_t pending = 0;            // CURRENT freed bytes waiting for their last use
  std::uint64_t retries = 0, ooms = 0;  // COUNT, from the pool
  KindStats by_kind;                    // SUM per kind (current, peak, allocated, freed)
  Stat total;                           // SUM over kinds
  bool has_allocator = false;           // device and pinned: the caching allocator's stats below
  AllocatorStats allocator;
  friend bool operator==(const TierSnapshot&, const TierSnapshot&) = default;
};

struct TensorSnapshot {
  TensorId id = 0;
  std::string name;
  Kind kind = Kind::param;
  DType dtype = DType::fp32;
  std::uint64_t bytes = 0;
  Tier home = Tier::device;
  std::int32_t chunk = -1, shard = 0;
  TierMask valid = 0;      // tiers holding a valid copy
  TierMask allocated = 0;  // tiers holding storage for it (valid or stale)
  State state = State::absent;
  std::int32_t pins = 0;
  friend bool operator==(const TensorSnapshot&, const TensorSnapshot&) = default;
};

struct Snapshot {
  std::int64_t t_ns = 0;
  std::int64_t step = 0;
  Phase phase = Phase::idle;
  std::string backend;  // "host", "cuda"
  std::array<TierSnapshot, kTierCount> tiers;
  std::array<MoveCounter, kDirectionCount> moves;
  std::uint64_t evictions = 0, evicted_bytes = 0, ooms = 0, failed_moves = 0;
  std::vector<TensorSnapshot> tensors;  // by id
  std::vector<MemEvent> events;         // the ring, oldest first (empty when not asked for)
  std::uint64_t events_dropped = 0;     // events overwritten before the oldest one listed

  nlohmann::json to_json() const;
  static Snapshot from_json(const nlohmann::json& j);
  friend bool operator==(const Snapshot&, const Snapshot&) = default;
};

// The pieces, shared with the trace writer and reader.
// `v` as the integer type T, for the readers of memprof JSON: a number of another kind would convert with
// undefined behaviour (1e55 to an integer), so integers must be written as integers, unsigned ones without
// a sign; ConfigError naming `what` otherwise.
template <typename T>
T json_whole(const nlohmann::json& v, std::string_view what) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  if (!v.is_number_integer() || (std::is_unsigned_v<T> && !v.is_number_unsigned()))
    throw ConfigError(detail::cat("memprof JSON: ", what, " is ", v.dump().substr(0, 40),
                                  ", not a whole number", std::is_unsigned_v<T> ? " >= 0" : ""));
  // In range of T (a larger one would be narrowed to another number). A signed value reaches here only
  // for a signed T.
  const bool fits = v.is_number_unsigned()
                        ? v.get<std::uint64_t>() <= std::uint64_t(std::numeric_limits<T>::max())
                        : v.get<std::int64_t>() >= std::int64_t(std::numeric_limits<T>::min()) &&
                              v.get<std::int64_t>() <= std::int64_t(std::numeric_limits<T>::max());
  if (!fits)
    throw ConfigError(detail::cat("memprof JSON: ", what, " is ", v.dump().substr(0, 40), ", out of range"));
  return v.get<T>();
}

nlohmann::json to_json(const Stat& s);
Stat stat_from_json(const nlohmann::json& j, const char* field);
nlohmann::json to_json(const MemEvent& e);
MemEvent event_from_json(const nlohmann::json& j);
nlohmann::json to_json(const AllocatorStats& a);
AllocatorStats allocator_stats_from_json(const nlohmann::json& j);
std::string tier_mask_string(TierMask m);  // "device,nvme"
TierMask parse_tier_mask(const std::string& s);

}  // namespace strata::tiering
