// strata/prefetch/trace.h: the order in which one pass (a forward and its backward) acquires chunks.
//
// Example:
//   strata::prefetch::Trace t;
//   t.begin_pass();                 // recording: nothing known yet
//   t.on_acquire(0); t.on_acquire(1); ...
//   t.end_pass();                   // the recorded order becomes the trace
//   t.begin_pass();                 // replaying
//   Trace::Check c = t.on_acquire(0);   // matches entry 0
//   t.next_use(1, /*after=*/0);     // position of chunk 1's next acquire after position 0
//
// A pass is recording until it ends with end_pass(); the next pass replays it. While replaying, each
// acquire is compared with the entry at the current position: a different chunk, or a pass that ends
// early or late, is a divergence. On a divergence the trace is dropped and the pass in progress is
// recorded instead (the entries that matched so far are its prefix), so the pass after it replays the
// new order. Not thread-safe (the engine calls it from the training thread).
#pragma once

#include <cstdint>
#include <vector>

namespace strata::prefetch {

class Trace {
 public:
  enum class Mode { recording, replaying };
  struct Check {
    bool diverged = false;     // this acquire did not match the trace (which is now being re-recorded)
    int expected = -1;         // the chunk the trace expected (when diverged), -1 past its end
    std::size_t position = 0;  // this acquire's position in the pass
  };

  void begin_pass();
  Check on_acquire(int chunk);
  // Ends the pass; returns true when a replaying pass ended early (fewer acquires than the trace), which
  // also counts as a divergence (the shorter order is recorded).
  bool end_pass();
  // Ends a pass that stops short on purpose (a forward whose backward will not run): nothing of it is
  // recorded or counted, and a trace being replayed stays as it was.
  void abandon_pass();

  Mode mode() const { return mode_; }
  bool valid() const { return !trace_.empty(); }  // a recorded order exists
  std::size_t position() const { return pos_; }   // acquires so far in this pass
  const std::vector<int>& entries() const { return trace_; }
  // The first position > `after` where the trace acquires `chunk`, or -1 (none, or not replaying).
  std::int64_t next_use(int chunk, std::size_t after) const;
  // The first position >= position() (not yet acquired in this pass) where `chunk` is acquired, or -1.
  std::int64_t upcoming(int chunk) const;
  std::uint64_t divergences() const { return divergences_; }
  std::uint64_t recordings() const { return recordings_; }  // passes recorded and kept as the trace

 private:
  Mode mode_ = Mode::recording;
  bool in_pass_ = false;
  std::vector<int> trace_;      // the recorded order (valid while replaying)
  std::vector<int> recording_;  // this pass, while recording
  std::size_t pos_ = 0;
  std::uint64_t divergences_ = 0, recordings_ = 0;
};

}  // namespace strata::prefetch
