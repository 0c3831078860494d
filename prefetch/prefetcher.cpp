#include <algorithm>
#include <chrono>

#include "core/log.h"
#include "prefetch/prefetch.h"

namespace strata::prefetch {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

const char* to_string(Access a) {
  switch (a) {
    case Access::hit:
      return "hit";
    case Access::late:
      return "late";
    case Access::miss:
      return "miss";
    case Access::recording:
      return "recording";
  }
  return "?";
}

Prefetcher::Prefetcher(FetchTarget& target, PrefetchOptions opts) : target_(target), opts_(opts) {}

void Prefetcher::log_divergence(const char* what, std::size_t position, int expected, int got) {
  ++stats_.invalidations;
  if (stats_.invalidations == 1) {
    STRATA_LOG_WARN("prefetch: the chunk order changed (", what, " at position ", position,
                    ": expected chunk ", expected, ", got ", got,
                    "); the trace is dropped and recorded again. Prefetching is off until a pass repeats "
                    "the order.");
  } else {
    STRATA_LOG_DEBUG("prefetch: the chunk order changed again (", what, " at position ", position,
                     "); invalidation ", stats_.invalidations);
  }
}

void Prefetcher::begin_pass(bool repeat) {
  repeat_ = repeat;
  trace_.begin_pass();
  if (trace_.mode() == Trace::Mode::replaying) issue_ahead(-1);
}

Access Prefetcher::acquire(int c) {
  Trace::Check ck = trace_.on_acquire(c);
  if (ck.diverged) log_divergence("acquire", ck.position, ck.expected, c);
  const bool replaying = trace_.mode() == Trace::Mode::replaying;
  if (held_at_.size() <= std::size_t(c)) held_at_.resize(std::size_t(c) + 1, -1);
  held_at_[std::size_t(c)] = std::int64_t(ck.position);

  Access a;
  switch (target_.residency(c)) {
    case Residency::resident:
      a = Access::hit;
      break;
    case Residency::in_flight: {
      auto t0 = Clock::now();
      target_.wait_fetch(c);
      stats_.late_wait_s += seconds_since(t0);
      a = Access::late;
      break;
    }
    case Residency::absent:
    default: {
      auto t0 = Clock::now();
      target_.start_fetch(c, /*demand=*/true);
      target_.wait_fetch(c);
      stats_.demand_wait_s += seconds_since(t0);
      a = replaying ? Access::miss : Access::recording;
      break;
    }
  }
  if (replaying) {
    if (a == Access::hit) ++stats_.hits;
    if (a == Access::late) ++stats_.late;
    if (a == Access::miss) ++stats_.misses;
    issue_ahead(std::int64_t(ck.position));
  } else {
    // A chunk found resident or in flight while recording (kept from the previous pass) is not a demand
    // fetch; only those fetched here are counted.
    if (a == Access::recording) ++stats_.recording_fetches;
  }
  return a;
}

void Prefetcher::issue_ahead(std::int64_t from_position) {
  if (opts_.bucket_numel == 0) return;
  const std::vector<int>& t = trace_.entries();
  std::uint64_t ahead = 0;
  for (std::size_t q = std::size_t(from_position + 1); q < t.size(); ++q) {
    const int c = t[q];
    const Residency r = target_.residency(c);
    if (r == Residency::in_flight) {
      ahead += target_.numel(c);
      continue;
    }
    if (r == Residency::resident) continue;
    if (ahead >= opts_.bucket_numel) break;
    if (target_.live_numel() + target_.numel(c) > opts_.max_live_numel) break;
    if (!target_.start_fetch(c, /*demand=*/false)) {
      ++stats_.declined;
      break;
    }
    ++stats_.issued;
    ahead += target_.numel(c);
  }
}

std::int64_t Prefetcher::in_repeat(int c) const {
  if (!repeat_ || trace_.mode() != Trace::Mode::replaying) return -1;
  const std::vector<int>& t = trace_.entries();
  const auto it = std::find(t.begin(), t.end(), c);
  return it == t.end() ? -1 : std::int64_t(t.size()) + std::int64_t(it - t.begin());
}

std::int64_t Prefetcher::next_use(int c) const {
  if (std::size_t(c) >= held_at_.size() || held_at_[std::size_t(c)] < 0) return -1;
  const std::int64_t q = trace_.next_use(c, std::size_t(held_at_[std::size_t(c)]));
  return q >= 0 ? q : in_repeat(c);
}

std::int64_t Prefetcher::upcoming(int c) const {
  const std::int64_t q = trace_.upcoming(c);
  return q >= 0 ? q : in_repeat(c);
}

bool Prefetcher::keep_after_release(int c) const {
  const std::int64_t q = next_use(c);
  if (q < 0) return false;
  const std::vector<int>& t = trace_.entries();
  std::uint64_t distance = 0;
  for (std::int64_t k = held_at_[std::size_t(c)] + 1; k < q; ++k)  // past the end: the repeat pass
    distance += target_.numel(t[std::size_t(k) % t.size()]);
  return distance <= opts_.max_reuse_distance;
}

void Prefetcher::end_pass() {
  const std::size_t pos = trace_.position();
  const std::vector<int>& t = trace_.entries();
  const int expected = trace_.mode() == Trace::Mode::replaying && pos < t.size() ? t[pos] : -1;
  if (trace_.end_pass()) log_divergence("the pass ended", pos, expected, -1);
  ++stats_.passes;
  std::fill(held_at_.begin(), held_at_.end(), -1);
  repeat_ = false;
}

void Prefetcher::abandon_pass() {
  trace_.abandon_pass();
  std::fill(held_at_.begin(), held_at_.end(), -1);
  repeat_ = false;
}

}  // namespace strata::prefetch
