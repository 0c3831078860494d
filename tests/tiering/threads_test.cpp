// Moves from several threads at once, sharing budgets small enough that threads evict each other's
// tensors: every thread reads back exactly what it wrote, and no budget is exceeded.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "tests/tiering/tiering_fixture.h"

namespace strata::tiering {
namespace {

using test::Bytes;
using test::random_bytes;
using test::TieringTest;

class Threads : public TieringTest {};

TEST_P(Threads, ConcurrentFetchesEvictionsAndRewritesKeepEveryTensorIntact) {
  make({.device_budget = 6 << 20,
        .pinned_budget = 8 << 20,
        .pinned_slab = 2 << 20,
        .nvme_capacity = 128 << 20});
  constexpr int kThreads = 4, kPerThread = 5, kOps = 120;
  std::atomic<int> failures{0};
  std::vector<std::string> errors(kThreads);
  auto body = [&](int th) {
    try {
      std::mt19937_64 rng(500 + th);
      std::vector<TensorId> ids;
      std::vector<Bytes> want;
      for (int i = 0; i < kPerThread; ++i) {
        std::size_t n = 40'000 + rng() % 700'000;
        ids.push_back(add(test::label("th", th, i), n, Tier(rng() % 3)));
        want.push_back(random_bytes(n, th * 100 + i));
        write(ids[i], Tier::pinned, want[i]);
      }
      const Tier tiers[] = {Tier::device, Tier::pinned, Tier::nvme};
      for (int op = 0; op < kOps; ++op) {
        int i = int(rng() % kPerThread);
        switch (rng() % 5) {
          case 0:
            tm->fetch(ids[i], tiers[rng() % 3]);
            break;
          case 1: {
            Tier from = tiers[rng() % 3], to = tiers[rng() % 3];
            if (from != to) tm->evict(ids[i], from, to);
            break;
          }
          case 2:
            want[i] = random_bytes(want[i].size(), 7000 + th * kOps + op);
            write(ids[i], rng() % 2 ? Tier::pinned : Tier::device, want[i]);
            break;
          default:
            if (read(ids[i]) != want[i]) {
              errors[th] = test::label("read back wrong: tensor ", i, op);
              ++failures;
              return;
            }
        }
      }
      for (int i = 0; i < kPerThread; ++i)
        if (read(ids[i]) != want[i]) {
          errors[th] = test::label("read back wrong at the end: tensor ", i);
          ++failures;
          return;
        }
    } catch (const std::exception& e) {
      errors[th] = e.what();
      ++failures;
    }
  };
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) threads.emplace_back(body, th);
  for (auto& t : threads) t.join();
  for (int th = 0; th < kThreads; ++th)
    EXPECT_TRUE(errors[th].empty()) << "thread " << th << ": " << errors[th];
  EXPECT_EQ(failures.load(), 0);
  tm->synchronize();
  expect_within_budgets("after the threads");
  Snapshot s = tm->snapshot(false);
  EXPECT_GT(s.evictions, 0u) << "the budgets were meant to force evictions across threads";
  for (const TensorSnapshot& t : s.tensors) EXPECT_NE(t.valid, 0) << t.name;
}

STRATA_TIERING_BACKENDS(Threads);

}  // namespace
}  // namespace strata::tiering
