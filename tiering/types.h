// strata/tiering/types.h: the vocabulary of the tier manager — tiers, tensor kinds, states, phases (the
// element type is strata::DType) — and the typed statistic every counter in the module is made of.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/dtype.h"

namespace strata::tiering {

// Where bytes live, fastest first. "One tier down" from device is pinned, from pinned is nvme.
enum class Tier : std::uint8_t { device = 0, pinned = 1, nvme = 2 };
inline constexpr int kTierCount = 3;

// What a tensor holds (DESIGN.md §2: five tensors per chunk shard) plus `staging`: pinned buffers a move
// NVMe <-> device passes through, counted so that the pinned tier's bytes always add up; and `activation`:
// the model's checkpointed block inputs when they leave the device (Note [Checkpoints off the device] in
// zero3/engine_checkpoints.h).
enum class Kind : std::uint8_t { param = 0, grad, master, exp_avg, exp_avg_sq, staging, activation };
inline constexpr int kKindCount = 7;

// A tensor's state, derived from its copies:
//   absent    no tier holds a valid copy (registered, never written — or its only copy was lost)
//   in_flight a move of it has been issued and is not yet done
//   resident  a valid copy exists and the copy on its home tier is one of them
//   dirty     valid copies exist but none on its home tier (written elsewhere, not yet written back)
enum class State : std::uint8_t { absent, in_flight, resident, dirty };

// The phase of the training step, for markers in the event ring and the trace.
enum class Phase : std::uint8_t { idle, forward, backward, optimizer };

const char* to_string(Tier t);
const char* to_string(Kind k);
const char* to_string(State s);
const char* to_string(Phase p);
// Parse the names above (and a dtype's dtype_name); an unknown name raises strata::ConfigError listing the
// allowed ones. `what` names the field or option in that message.
Tier parse_tier(std::string_view name, std::string_view what = "tier");
Kind parse_kind(std::string_view name, std::string_view what = "kind");
DType parse_dtype(std::string_view name, std::string_view what = "dtype");
State parse_state(std::string_view name, std::string_view what = "state");
Phase parse_phase(std::string_view name, std::string_view what = "phase");

// A set of tiers, one bit per Tier.
using TierMask = std::uint8_t;
inline constexpr TierMask bit(Tier t) {
  return TierMask(1u << unsigned(t));
}
inline constexpr bool has(TierMask m, Tier t) {
  return (m & bit(t)) != 0;
}

// A tensor's handle in the registry; 0 is "none".
using TensorId = std::uint32_t;

// A typed statistic (after PyTorch's caching allocator): the current value, its high-water mark, and the
// running SUMs of what was added and removed. Each use says whether it counts objects (COUNT) or bytes
// (SUM).
struct Stat {
  std::uint64_t current = 0;
  std::uint64_t peak = 0;
  std::uint64_t allocated = 0;  // SUM of additions
  std::uint64_t freed = 0;      // SUM of removals

  void add(std::uint64_t n) {
    current += n;
    allocated += n;
    if (current > peak) peak = current;
  }
  void sub(std::uint64_t n) {
    current -= n;
    freed += n;
  }
  void reset_peak() { peak = current; }
  friend bool operator==(const Stat&, const Stat&) = default;
};

}  // namespace strata::tiering
