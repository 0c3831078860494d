// A FetchTarget that models the engine's chunks: fetches stay in flight until the test lets them land
// (land_all) or the prefetcher waits for one (taking at least set_transfer_time, timed here as the
// prefetcher's wait must contain it); it checks the budgets at every start.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "prefetch/prefetch.h"

namespace strata::prefetch::test {

class MockTarget final : public FetchTarget {
 public:
  explicit MockTarget(std::vector<std::uint64_t> sizes)
      : sizes_(std::move(sizes)), state_(sizes_.size(), Residency::absent), demand_(sizes_.size(), false) {}

  std::uint64_t numel(int c) const override { return sizes_.at(std::size_t(c)); }
  Residency residency(int c) override { return state_.at(std::size_t(c)); }
  bool start_fetch(int c, bool demand) override {
    EXPECT_EQ(state_.at(std::size_t(c)), Residency::absent) << "chunk " << c << " fetched twice";
    if (!demand && declines_left_ > 0) {
      --declines_left_;
      return false;
    }
    if (!demand) {
      std::uint64_t flying = 0;
      for (std::size_t i = 0; i < state_.size(); ++i)
        if (state_[i] == Residency::in_flight) flying += sizes_[i];
      max_in_flight_ = std::max(max_in_flight_, flying + sizes_.at(std::size_t(c)));
    }
    state_.at(std::size_t(c)) = Residency::in_flight;
    demand_.at(std::size_t(c)) = demand;
    (demand ? demand_starts_ : prefetch_starts_).push_back(c);
    max_live_ = std::max(max_live_, live_numel());
    return true;
  }
  void wait_fetch(int c) override {
    EXPECT_EQ(state_.at(std::size_t(c)), Residency::in_flight);
    const auto t0 = std::chrono::steady_clock::now();
    if (transfer_time_.count() > 0) std::this_thread::sleep_for(transfer_time_);
    state_.at(std::size_t(c)) = Residency::resident;
    ++waits_;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    (demand_.at(std::size_t(c)) ? demand_wait_s_ : prefetch_wait_s_) += s;
  }
  std::uint64_t live_numel() const override {
    std::uint64_t n = 0;
    for (std::size_t i = 0; i < state_.size(); ++i)
      if (state_[i] != Residency::absent) n += sizes_[i];
    return n;
  }

  // The copy streams finished everything in flight (compute took long enough).
  void land_all() {
    for (auto& s : state_)
      if (s == Residency::in_flight) s = Residency::resident;
  }
  void drop(int c) { state_.at(std::size_t(c)) = Residency::absent; }
  void drop_all() { std::fill(state_.begin(), state_.end(), Residency::absent); }
  void decline_next(int n) { declines_left_ = n; }
  // Each wait_fetch takes at least `t` (a transfer still under way when its chunk is needed).
  void set_transfer_time(std::chrono::microseconds t) { transfer_time_ = t; }
  // Seconds spent inside wait_fetch for fetches the prefetcher started ahead, and for demand fetches.
  double prefetch_wait_s() const { return prefetch_wait_s_; }
  double demand_wait_s() const { return demand_wait_s_; }

  const std::vector<int>& prefetch_starts() const { return prefetch_starts_; }
  const std::vector<int>& demand_starts() const { return demand_starts_; }
  std::uint64_t max_in_flight() const { return max_in_flight_; }
  std::uint64_t max_live() const { return max_live_; }
  void clear_log() {
    prefetch_starts_.clear();
    demand_starts_.clear();
  }

 private:
  std::vector<std::uint64_t> sizes_;
  std::vector<Residency> state_;
  std::vector<bool> demand_;  // how each chunk's last fetch was started
  std::vector<int> prefetch_starts_, demand_starts_;
  std::chrono::microseconds transfer_time_{0};
  double prefetch_wait_s_ = 0, demand_wait_s_ = 0;
  std::uint64_t max_in_flight_ = 0, max_live_ = 0;
  int waits_ = 0, declines_left_ = 0;
};

// One pass the way the engine runs it: acquire, compute (optionally letting transfers land), release
// (dropping the chunk unless the prefetcher keeps it). Returns what each acquire found.
inline std::vector<Access> run_pass(Prefetcher& pf, MockTarget& t, const std::vector<int>& order,
                                    bool transfers_land_during_compute = true) {
  std::vector<Access> got;
  pf.begin_pass();
  for (int c : order) {
    if (transfers_land_during_compute) t.land_all();
    got.push_back(pf.acquire(c));
    if (transfers_land_during_compute) t.land_all();
    if (!pf.keep_after_release(c)) t.drop(c);
  }
  pf.end_pass();
  return got;
}

// The model's order: embedding, blocks, head, then backward: head, blocks reversed (the embedding's
// backward needs only its gradients).
inline std::vector<int> model_order(int layers) {
  std::vector<int> o;
  for (int c = 0; c <= layers + 1; ++c) o.push_back(c);
  for (int c = layers + 1; c >= 1; --c) o.push_back(c);
  return o;
}

}  // namespace strata::prefetch::test
