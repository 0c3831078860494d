// A FetchTarget that models the engine's chunks: fetches stay in flight until the test lets them land
// (land_all) or the prefetcher waits for one; it checks the budgets at every start.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "prefetch/prefetch.h"

namespace strata::prefetch::test {

class MockTarget final : public FetchTarget {
 public:
  explicit MockTarget(std::vector<std::uint64_t> sizes)
      : sizes_(std::move(sizes)), state_(sizes_.size(), Residency::absent) {}

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
    (demand ? demand_starts_ : prefetch_starts_).push_back(c);
    max_live_ = std::max(max_live_, live_numel());
    return true;
  }
  void wait_fetch(int c) override {
    EXPECT_EQ(state_.at(std::size_t(c)), Residency::in_flight);
    state_.at(std::size_t(c)) = Residency::resident;
    ++waits_;
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
  std::vector<int> prefetch_starts_, demand_starts_;
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
