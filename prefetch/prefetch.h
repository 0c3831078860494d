// strata/prefetch/prefetch.h: the prefetcher — records the order chunks are acquired in during the first
// pass and, on later passes, starts each chunk's fetch (NVMe read, host-to-device copy) ahead of its use.
//
// Example (the engine side; tests use a mock FetchTarget):
//   class Chunks : public strata::prefetch::FetchTarget { ... };      // knows where each chunk is
//   strata::prefetch::Prefetcher pf(chunks, {.bucket_numel = 50'000'000, .max_live_numel = 1'000'000'000,
//                                            .max_reuse_distance = 1'000'000'000});
//   pf.begin_pass();                       // a forward starts; replaying passes start the first fetches
//   pf.acquire(c);                         // returns once c is resident; issues the next fetches
//   ... compute ...
//   bool keep = pf.keep_after_release(c);  // reused soon enough to stay gathered?
//   pf.end_pass();                         // after the backward; the first pass becomes the trace
//   const PrefetchStats& s = pf.stats();   // hits, late arrivals (and their wait), misses
//
// Budgets (DeepSpeed's ZeRO-3 knobs, in elements):
//   stage3_prefetch_bucket_size  bucket_numel: fetches are started while the elements in flight ahead of
//                                the current position are below it (so at least one chunk when it is > 0,
//                                as DeepSpeed's loop; 0 disables prefetching).
//   stage3_max_live_parameters   max_live_numel: no prefetch starts if it would take the gathered elements
//                                on the device (held, cached and in flight) past it.
//   stage3_max_reuse_distance    max_reuse_distance: a released chunk stays gathered when the trace uses it
//                                again within this many elements acquired in between.
//
// Note [Reuse across passes]: a pass that begins with `repeat` (begin_pass(true)) is followed by another
// pass over the same chunk values — the engine's next micro-batch of the same step, whose parameters no
// update has changed. Its chunks are then used again after this pass ends: a chunk with no later use in
// this pass has its next use at the same chunk's first position in the trace, counted on from the end
// of this pass (trace length + position), and keep_after_release measures the reuse distance across the
// boundary. So where the device has room a chunk stays gathered from one micro-batch to the next and is
// gathered once per step; with stage3_max_reuse_distance 0, or no room, nothing changes. Without
// `repeat`, uses past the end of the pass are unknown (-1), as before.
//
// Classification of each acquire while replaying: hit (already resident), late (its prefetch was in
// flight: the caller waited, and the wait is summed), miss (nothing had been started: fetched on demand).
// Acquires of recording passes are fetched on demand and counted apart. A changed order (see trace.h) is
// logged (a warning the first time, then at debug level) and counted; the pass in progress is recorded.
//
// Locking: none; one training thread drives it. The FetchTarget may use its own threads.
#pragma once

#include <cstdint>
#include <vector>

#include "prefetch/trace.h"

namespace strata::prefetch {

enum class Residency { absent, in_flight, resident };

// What the prefetcher drives: the engine's chunks on the device.
class FetchTarget {
 public:
  virtual ~FetchTarget() = default;
  // Elements of chunk `c` once gathered on the device (what the budgets count).
  virtual std::uint64_t numel(int c) const = 0;
  virtual Residency residency(int c) = 0;
  // Starts making `c` resident and returns at once. A prefetch (demand = false) may decline when there is
  // no room or no staging buffer free, returning false; a demand fetch must start or throw.
  virtual bool start_fetch(int c, bool demand) = 0;
  // Blocks until `c`, whose fetch was started, is resident; raises the fetch's error, if any.
  virtual void wait_fetch(int c) = 0;
  // Gathered elements on the device now: held, cached and in flight.
  virtual std::uint64_t live_numel() const = 0;
};

struct PrefetchOptions {
  std::uint64_t bucket_numel = 50000000;
  std::uint64_t max_live_numel = 1000000000;
  std::uint64_t max_reuse_distance = 1000000000;
};

// Counters since construction (all COUNT or SUM, monotonic).
struct PrefetchStats {
  std::uint64_t hits = 0;               // replaying acquires that found the chunk resident
  std::uint64_t late = 0;               // ... whose prefetch was still in flight (the caller waited)
  double late_wait_s = 0;               // SUM of those waits
  std::uint64_t misses = 0;             // replaying acquires with no fetch started: fetched on demand
  std::uint64_t recording_fetches = 0;  // acquires of recording passes fetched on demand
  double demand_wait_s = 0;             // SUM of the waits of demand fetches (misses and recording)
  std::uint64_t issued = 0;             // prefetches started
  std::uint64_t declined = 0;           // prefetches the target declined (no room or buffer)
  std::uint64_t invalidations = 0;      // traces dropped because the order changed
  std::uint64_t passes = 0;             // passes ended
};

// What one acquire found.
enum class Access { hit, late, miss, recording };
const char* to_string(Access a);

class Prefetcher {
 public:
  Prefetcher(FetchTarget& target, PrefetchOptions opts);

  // `repeat`: another pass over the same chunk values follows this one (Note [Reuse across passes]).
  void begin_pass(bool repeat = false);
  // Makes `c` resident (waiting or fetching on demand as needed), then starts the fetches ahead of it.
  Access acquire(int c);
  // Whether `c`, being released, is used again by this pass within max_reuse_distance elements.
  bool keep_after_release(int c) const;
  void end_pass();
  // Ends a pass cut short on purpose (Trace::abandon_pass): the trace is kept; fetches already issued
  // for the rest of the pass complete and stay resident for the next pass.
  void abandon_pass();

  // The next position at which `c` is acquired again after its current (or last) acquire: in this pass,
  // or in the repeat pass that follows (positions from the trace's length on; Note [Reuse across
  // passes]); -1 when unknown or never.
  std::int64_t next_use(int c) const;
  // The position of the next acquire of `c` not yet made (what a fetch started now is for), in this pass
  // or the repeat pass that follows, as next_use; -1 when unknown or none.
  std::int64_t upcoming(int c) const;
  const Trace& trace() const { return trace_; }
  const PrefetchStats& stats() const { return stats_; }
  const PrefetchOptions& options() const { return opts_; }

 private:
  void issue_ahead(std::int64_t from_position);
  void log_divergence(const char* what, std::size_t position, int expected, int got);

  // The position of `c`'s first acquire in the repeat pass after this one, or -1 (no repeat, no trace,
  // or not in the trace).
  std::int64_t in_repeat(int c) const;

  FetchTarget& target_;
  PrefetchOptions opts_;
  Trace trace_;
  PrefetchStats stats_;
  std::vector<std::int64_t> held_at_;  // by chunk: position of its current acquire, -1 none
  bool repeat_ = false;                // this pass is followed by one over the same values
};

}  // namespace strata::prefetch
