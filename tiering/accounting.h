// strata/tiering/accounting.h: where the bytes are — per tier × kind current and peak bytes, moves per
// direction, evictions, OOMs — and the bounded ring of timestamped events the prefetcher and memprof read.
//
// Example:
//   EventRing ring(1 << 16);
//   ring.push({.t_ns = now, .type = EventType::alloc, .tier = Tier::device, .kind = Kind::param, ...});
//   std::uint64_t dropped = 0;
//   for (const MemEvent& e : ring.since(last_seq, &dropped)) ...;   // dropped: overwritten before read
//
// Locking: none here; the tier manager owns these and guards them with its mutex.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "tiering/types.h"

namespace strata::tiering {

enum class EventType : std::uint8_t {
  alloc,           // a tensor (or staging buffer) got bytes on `tier`
  free,            // ... gave them back
  move_issued,     // a transfer tier -> to was issued
  move_done,       // ... completed (t_ns: when the data was in place)
  move_failed,     // ... failed (I/O or device error)
  evict,           // the manager chose this tensor to make room on `tier` (to == tier: dropped, a copy
                   // already existed elsewhere)
  oom,             // `bytes` could not be placed on `tier` and nothing could be evicted
  marker,          // step / phase boundary (set_step)
  tensor_added,    // registered
  tensor_removed,  // unregistered
};
inline constexpr int kEventTypeCount = 10;
const char* to_string(EventType t);
EventType parse_event_type(const char* name);  // ConfigError for an unknown name

struct MemEvent {
  std::uint64_t seq = 0;  // 1, 2, ... in issue order
  std::int64_t t_ns = 0;  // steady clock, since the manager was created
  EventType type = EventType::alloc;
  Tier tier = Tier::device;
  Tier to = Tier::device;  // moves and evictions: destination
  Kind kind = Kind::param;
  Phase phase = Phase::idle;
  TensorId tensor = 0;  // 0: none (markers, staging)
  std::uint64_t bytes = 0;
  std::int64_t step = 0;
  friend bool operator==(const MemEvent&, const MemEvent&) = default;
};

// A fixed-size ring; the oldest events are overwritten. seq numbers keep counting, so a reader that
// remembers the last seq it saw learns how many it missed.
class EventRing {
 public:
  explicit EventRing(std::size_t capacity);
  // Stamps e.seq and stores it; returns the seq.
  std::uint64_t push(MemEvent e);
  // Events with seq > after, oldest first; *dropped (if given) gets how many of those were overwritten.
  std::vector<MemEvent> since(std::uint64_t after, std::uint64_t* dropped = nullptr) const;
  std::uint64_t last_seq() const { return next_ - 1; }
  std::size_t capacity() const { return buf_.size(); }

 private:
  std::vector<MemEvent> buf_;
  std::uint64_t next_ = 1;
};

// Moves by direction. Index with direction(from, to).
inline constexpr int kDirectionCount = 6;
int direction(Tier from, Tier to);  // device->pinned 0, pinned->device 1, pinned->nvme 2, nvme->pinned 3,
                                    // device->nvme 4, nvme->device 5
Tier direction_from(int d);
Tier direction_to(int d);
const char* direction_name(int d);  // "device_to_pinned", ...

struct MoveCounter {
  std::uint64_t count = 0;  // COUNT of completed moves
  std::uint64_t bytes = 0;  // SUM of their bytes
  friend bool operator==(const MoveCounter&, const MoveCounter&) = default;
};

using KindStats = std::array<Stat, kKindCount>;

struct Accounting {
  std::array<KindStats, kTierCount> bytes;  // SUM: bytes held, per tier × kind
  std::array<Stat, kTierCount> tier_bytes;  // SUM: bytes held per tier, all kinds (its peak: the tier's)
  std::array<MoveCounter, kDirectionCount> moves;
  std::uint64_t evictions = 0;      // COUNT of tensors the manager evicted to make room
  std::uint64_t evicted_bytes = 0;  // SUM of their bytes
  std::uint64_t ooms = 0;           // COUNT of OutOfMemory raised
  std::uint64_t failed_moves = 0;   // COUNT

  void add(Tier t, Kind k, std::uint64_t n) {
    bytes[int(t)][int(k)].add(n);
    tier_bytes[int(t)].add(n);
  }
  void sub(Tier t, Kind k, std::uint64_t n) {
    bytes[int(t)][int(k)].sub(n);
    tier_bytes[int(t)].sub(n);
  }
};

}  // namespace strata::tiering
