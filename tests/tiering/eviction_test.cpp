// Eviction: least recently used first, pinned tensors never, the only copy one tier down; and the
// OutOfMemory message when nothing can go.
#include <gtest/gtest.h>

#include "tests/tiering/tiering_fixture.h"

namespace strata::tiering {
namespace {

using test::Bytes;
using test::random_bytes;
using test::TieringTest;

class Eviction : public TieringTest {
 protected:
  static constexpr std::size_t kMiB3 = 3 << 20;
  // Room on the device for exactly three 3 MiB tensors (segments of exactly that size at the budget's end).
  void make_three_slot_device() {
    make({.device_budget = 9 << 20,
          .pinned_budget = 32 << 20,
          .pinned_slab = 4 << 20,
          .nvme_capacity = 64 << 20});
  }
  std::vector<TensorId> evicted_from(Tier tier) {
    std::vector<TensorId> out;
    for (const MemEvent& e : tm->events_since(0))
      if (e.type == EventType::evict && e.tier == tier) out.push_back(e.tensor);
    return out;
  }
};

TEST_P(Eviction, TheLeastRecentlyUsedUnpinnedTensorGoesFirst) {
  make_three_slot_device();
  std::vector<TensorId> t;
  for (int i = 0; i < 5; ++i) {
    t.push_back(add(test::label("t", i), kMiB3, Tier::pinned));
    write(t[i], Tier::pinned, random_bytes(kMiB3, i));
  }
  for (int i = 0; i < 3; ++i) tm->fetch(t[i], Tier::device).wait();  // device: t0 t1 t2
  tm->touch(t[0]);                                                   // LRU order now: t1 t2 t0
  tm->fetch(t[3], Tier::device).wait();
  EXPECT_EQ(evicted_from(Tier::device), (std::vector<TensorId>{t[1]}));
  tm->pin(t[2]);  // LRU order: t0 t3 t2, but t2 is pinned
  tm->fetch(t[4], Tier::device).wait();
  EXPECT_EQ(evicted_from(Tier::device), (std::vector<TensorId>{t[1], t[0]}));
  for (int i : {2, 3, 4}) EXPECT_TRUE(has(tm->info(t[i]).allocated, Tier::device)) << i;
  for (int i : {0, 1}) EXPECT_FALSE(has(tm->info(t[i]).allocated, Tier::device)) << i;
  tm->unpin(t[2]);
  expect_within_budgets("after evictions");
}

TEST_P(Eviction, AValidCopyElsewhereIsDroppedAndTheOnlyCopyMovesOneTierDown) {
  make_three_slot_device();
  Bytes only = random_bytes(kMiB3, 7);
  TensorId a = add("only-on-device", kMiB3, Tier::nvme);
  write(a, Tier::device, only);  // its only copy
  TensorId b = add("also-pinned", kMiB3, Tier::pinned);
  write(b, Tier::pinned, random_bytes(kMiB3, 8));
  tm->fetch(b, Tier::device).wait();
  TensorId c = add("c", kMiB3, Tier::pinned);
  write(c, Tier::device, random_bytes(kMiB3, 9));
  tm->touch(c);
  tm->touch(b);  // LRU: a, c, b
  TensorId d = add("d", kMiB3, Tier::pinned);
  write(d, Tier::device, random_bytes(kMiB3, 10));  // evicts a: device -> pinned (one tier down)
  tm->synchronize();
  TensorInfo ia = tm->info(a);
  EXPECT_EQ(ia.valid, bit(Tier::pinned));
  EXPECT_EQ(ia.state, State::dirty) << "home is nvme; the pinned copy is not written back yet";
  EXPECT_EQ(tm->snapshot(false).moves[direction(Tier::device, Tier::pinned)].count, 1u);
  TensorId e = add("e", kMiB3, Tier::pinned);
  write(e, Tier::device, random_bytes(kMiB3, 11));  // LRU on the device: c, b, d
  EXPECT_EQ(evicted_from(Tier::device).back(), c);
  // b is next: it has a valid pinned copy, so it is dropped without a transfer.
  TensorId f = add("f", kMiB3, Tier::pinned);
  write(f, Tier::device, random_bytes(kMiB3, 12));
  EXPECT_EQ(evicted_from(Tier::device).back(), b);
  tm->synchronize();
  EXPECT_EQ(tm->info(b).valid, bit(Tier::pinned));
  EXPECT_EQ(tm->snapshot(false).moves[direction(Tier::device, Tier::pinned)].count, 2u)
      << "a and c moved, b did not";
  EXPECT_EQ(read(a), only);
}

TEST_P(Eviction, ADiscardedBlockIsFreedWithoutACopyAndItsDataIsGone) {
  make_three_slot_device();
  TensorId a = add("dead-after-use", kMiB3, Tier::pinned);
  write(a, Tier::device, random_bytes(kMiB3, 3));  // its only copy
  tm->discard(a, Tier::device);
  tm->synchronize();
  TensorInfo ia = tm->info(a);
  EXPECT_FALSE(has(ia.allocated, Tier::device));
  EXPECT_EQ(ia.valid, TierMask(0));
  EXPECT_EQ(tm->snapshot(false).moves[direction(Tier::device, Tier::pinned)].count, 0u) << "nothing copied";
  EXPECT_EQ(tm->usage().bytes[int(Tier::device)][int(Kind::param)], 0u);
  try {
    tm->fetch(a, Tier::pinned);
    FAIL() << "expected an error: the data was discarded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("discarded"), std::string::npos) << e.what();
  }
  write(a, Tier::device, random_bytes(kMiB3, 4));  // written again, it is valid again
  tm->pin(a);
  EXPECT_THROW(tm->discard(a, Tier::device), Error) << "a pinned tensor is in use";
  tm->unpin(a);
  expect_within_budgets("after the discard");
}

TEST_P(Eviction, PinnedTierEvictsToNvmeWhenItIsFull) {
  make({.device_budget = 8 << 20,
        .pinned_budget = 4 << 20,
        .pinned_slab = 2 << 20,
        .nvme_capacity = 64 << 20});
  std::vector<TensorId> t;
  std::vector<Bytes> data;
  for (int i = 0; i < 6; ++i) {
    t.push_back(add(test::label("p", i), 900'000, Tier::pinned));
    data.push_back(random_bytes(900'000, 20 + i));
    write(t[i], Tier::pinned, data[i]);
  }
  tm->synchronize();
  Snapshot s = tm->snapshot(false);
  EXPECT_GE(s.moves[direction(Tier::pinned, Tier::nvme)].count, 2u) << "4 MiB holds four 0.9 MB tensors";
  EXPECT_LE(s.tiers[int(Tier::pinned)].reserved, 4u << 20);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(read(t[i]), data[i]) << i;
}

TEST_P(Eviction, OutOfMemoryListsEveryTierAndNamesTheSetting) {
  make_three_slot_device();
  std::vector<TensorId> t;
  for (int i = 0; i < 3; ++i) {
    t.push_back(add(test::label("held", i), kMiB3, Tier::pinned));
    tm->pin(t[i]);
    write(t[i], Tier::device, random_bytes(kMiB3, 30 + i));
  }
  TensorId x = add("layers.9.param", kMiB3, Tier::pinned);
  write(x, Tier::pinned, random_bytes(kMiB3, 40));
  try {
    tm->fetch(x, Tier::device);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    std::string m = e.what();
    for (const char* want :
         {"device tier", "layers.9.param", "3 pinned", "capacity", "used", "reserved", "free", "device ",
          "pinned ", "nvme ", "9.00 MiB", "strata.device_memory_cap", "unpin"})
      EXPECT_NE(m.find(want), std::string::npos) << "missing \"" << want << "\" in:\n" << m;
  }
  Snapshot s = tm->snapshot();
  EXPECT_EQ(s.ooms, 1u);
  EXPECT_EQ(s.events.back().type, EventType::oom);
  EXPECT_EQ(s.events.back().bytes, kMiB3);
  for (TensorId id : t) tm->unpin(id);
  tm->fetch(x, Tier::device).wait();  // now it fits, by evicting
}

TEST_P(Eviction, WithoutAnNvmeTierThePinnedOutOfMemoryNamesThePinnedBudget) {
  make({.device_budget = 8 << 20, .pinned_budget = 2 << 20, .pinned_slab = 2 << 20, .nvme_capacity = 0});
  TensorId a = add("a", 1'500'000, Tier::pinned);
  write(a, Tier::pinned, random_bytes(1'500'000, 1));
  TensorId b = add("b", 1'500'000, Tier::pinned);
  try {
    tm->allocate(b, Tier::pinned);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("pinned tier"), std::string::npos) << m;
    EXPECT_NE(m.find("1 with no tier below"), std::string::npos) << m;
    EXPECT_NE(m.find("not configured"), std::string::npos) << m;
    EXPECT_NE(m.find("max_in_cpu"), std::string::npos) << m;
  }
}

STRATA_TIERING_BACKENDS(Eviction);

}  // namespace
}  // namespace strata::tiering
