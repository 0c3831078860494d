#include "prefetch/trace.h"

#include "core/error.h"

namespace strata::prefetch {

void Trace::begin_pass() {
  STRATA_CHECK(!in_pass_, "prefetch trace: begin_pass while a pass is open");
  in_pass_ = true;
  pos_ = 0;
  if (trace_.empty()) {
    mode_ = Mode::recording;
    recording_.clear();
  } else {
    mode_ = Mode::replaying;
  }
}

Trace::Check Trace::on_acquire(int chunk) {
  STRATA_CHECK(in_pass_, "prefetch trace: acquire outside a pass (call begin_pass first)");
  Check c;
  c.position = pos_;
  if (mode_ == Mode::replaying) {
    if (pos_ < trace_.size() && trace_[pos_] == chunk) {
      ++pos_;
      return c;
    }
    c.diverged = true;
    c.expected = pos_ < trace_.size() ? trace_[pos_] : -1;
    ++divergences_;
    recording_.assign(trace_.begin(), trace_.begin() + std::ptrdiff_t(pos_));
    trace_.clear();
    mode_ = Mode::recording;
  }
  recording_.push_back(chunk);
  ++pos_;
  return c;
}

bool Trace::end_pass() {
  STRATA_CHECK(in_pass_, "prefetch trace: end_pass without begin_pass");
  in_pass_ = false;
  if (mode_ == Mode::replaying) {
    if (pos_ == trace_.size()) return false;
    ++divergences_;
    recording_.assign(trace_.begin(), trace_.begin() + std::ptrdiff_t(pos_));
    trace_ = std::move(recording_);
    ++recordings_;
    return true;
  }
  trace_ = std::move(recording_);
  recording_.clear();
  ++recordings_;
  return false;
}

void Trace::abandon_pass() {
  STRATA_CHECK(in_pass_, "prefetch trace: abandon_pass without begin_pass");
  in_pass_ = false;
  recording_.clear();
  if (!trace_.empty()) mode_ = Mode::replaying;  // a divergence in the abandoned pass cleared the trace
}

std::int64_t Trace::next_use(int chunk, std::size_t after) const {
  if (mode_ != Mode::replaying) return -1;
  for (std::size_t q = after + 1; q < trace_.size(); ++q)
    if (trace_[q] == chunk) return std::int64_t(q);
  return -1;
}

}  // namespace strata::prefetch

namespace strata::prefetch {

std::int64_t Trace::upcoming(int chunk) const {
  if (mode_ != Mode::replaying) return -1;
  for (std::size_t q = pos_; q < trace_.size(); ++q)
    if (trace_[q] == chunk) return std::int64_t(q);
  return -1;
}

}  // namespace strata::prefetch
