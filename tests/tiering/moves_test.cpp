// Moves through all three tiers: every path reads back exactly what was written; random sequences of
// moves keep every tensor with a valid copy and every pool within its budget.
#include <gtest/gtest.h>

#include <cstring>

#include "tests/common/stream_gate.h"
#include "tests/tiering/tiering_fixture.h"

namespace strata::tiering {
namespace {

using test::Bytes;
using test::random_bytes;
using test::TieringTest;

class Moves : public TieringTest {};

TEST_P(Moves, EachOfTheSixPathsCarriesTheBytesExactly) {
  make();
  const std::size_t n = 777'777;  // not a multiple of any alignment
  Bytes data = random_bytes(n, 1);
  TensorId id = add("t", n, Tier::nvme);
  write(id, Tier::pinned, data);
  // pinned -> nvme -> device -> pinned -> device -> nvme -> pinned, dropping the source each time.
  const Tier route[] = {Tier::pinned, Tier::nvme, Tier::device, Tier::pinned,
                        Tier::device, Tier::nvme, Tier::pinned};
  for (std::size_t i = 0; i + 1 < std::size(route); ++i) {
    Move m = tm->evict(id, route[i], route[i + 1]);
    ASSERT_TRUE(m) << to_string(route[i]) << " -> " << to_string(route[i + 1]) << " moved nothing";
    m.wait();
    TensorInfo info = tm->info(id);
    EXPECT_EQ(info.valid, bit(route[i + 1]))
        << "after " << to_string(route[i]) << " -> " << to_string(route[i + 1]);
    EXPECT_EQ(info.allocated, bit(route[i + 1]));
  }
  EXPECT_EQ(read(id), data);
  Snapshot s = tm->snapshot(false);
  for (int d = 0; d < kDirectionCount; ++d) {
    EXPECT_EQ(s.moves[d].count, 1u) << direction_name(d);
    EXPECT_EQ(s.moves[d].bytes, n) << direction_name(d);
  }
  EXPECT_EQ(s.tiers[int(Tier::pinned)].by_kind[int(Kind::staging)].peak, n)
      << "device <-> NVMe passes through one pinned staging block";
  EXPECT_EQ(s.tiers[int(Tier::pinned)].by_kind[int(Kind::staging)].current, 0u);
}

TEST_P(Moves, FetchKeepsTheOtherCopiesValidAndWritingMakesThemStale) {
  make();
  Bytes a = random_bytes(300'000, 2), b = random_bytes(300'000, 3);
  TensorId id = add("t", a.size(), Tier::nvme);
  write(id, Tier::pinned, a);
  tm->fetch(id, Tier::nvme).wait();
  tm->fetch(id, Tier::device).wait();
  EXPECT_EQ(tm->info(id).valid, bit(Tier::device) | bit(Tier::pinned) | bit(Tier::nvme));
  EXPECT_EQ(tm->info(id).state, State::resident);
  write(id, Tier::device, b);
  TensorInfo i = tm->info(id);
  EXPECT_EQ(i.valid, bit(Tier::device));
  EXPECT_EQ(i.allocated, bit(Tier::device) | bit(Tier::pinned) | bit(Tier::nvme)) << "stale blocks stay";
  EXPECT_EQ(i.state, State::dirty) << "home (nvme) no longer holds a valid copy";
  EXPECT_EQ(read(id), b) << "the pinned copy was refreshed from the device, not the stale one used";
  tm->fetch(id, Tier::nvme).wait();
  EXPECT_EQ(tm->info(id).state, State::resident);
}

TEST_P(Moves, AMoveWaitsForTheCallersLastUseEvent) {
  make();
  Bytes a = random_bytes(1 << 20, 4), b = random_bytes(1 << 20, 5);
  TensorId id = add("t", a.size(), Tier::pinned);
  write(id, Tier::device, a);
  // The "compute" stream overwrites the device copy with b, behind a gate; the eviction must see b. b comes
  // from pinned memory: a held stream takes no copy from pageable memory (tests/common/stream_gate.h).
  PinnedBuffer staged(*dev, b.size());  // before the stream: it outlives the copy
  std::memcpy(staged.data(), b.data(), b.size());
  auto compute = dev->create_stream("compute");
  auto done = dev->create_event();
  strata::test::StreamGate gate;  // after the stream: opened before it goes
  void* d = tm->data(id, Tier::device);
  gate.hold(*compute);
  compute->copy_async(d, staged.data(), b.size(), CopyKind::host_to_device);
  compute->record(*done);
  Move m = tm->evict(id, Tier::device, Tier::pinned, done.get());
  EXPECT_FALSE(m.done());
  gate.open();
  m.wait();
  EXPECT_EQ(read(id), b);
}

// The property test: random fetches, evictions and rewrites through all tiers with budgets small enough
// that most operations evict something.
TEST_P(Moves, RandomSequencesKeepACopyReadBackExactlyAndStayWithinBudgets) {
  make({.device_budget = 4 << 20,
        .pinned_budget = 6 << 20,
        .pinned_slab = 2 << 20,
        .nvme_capacity = 64 << 20});
  std::mt19937_64 rng(GetParam() == "host" ? 11 : 12);
  const int kTensors = 14;
  std::vector<TensorId> ids;
  std::vector<Bytes> want;
  for (int i = 0; i < kTensors; ++i) {
    std::size_t n = 50'000 + rng() % 1'200'000;
    Tier home = Tier(rng() % 3);
    ids.push_back(add(test::label("t", i), n, home, Kind(rng() % 5)));
    want.push_back(random_bytes(n, 100 + i));
    write(ids[i], rng() % 2 ? Tier::pinned : Tier::device, want[i]);
  }
  const Tier tiers[] = {Tier::device, Tier::pinned, Tier::nvme};
  std::vector<Move> in_flight;
  for (int op = 0; op < 400; ++op) {
    int i = int(rng() % kTensors);
    TensorId id = ids[i];
    switch (rng() % 6) {
      case 0:
      case 1:
        in_flight.push_back(tm->fetch(id, tiers[rng() % 3]));
        break;
      case 2:
      case 3: {
        Tier from = tiers[rng() % 3], to = tiers[rng() % 3];
        if (from != to) in_flight.push_back(tm->evict(id, from, to));
        break;
      }
      case 4:
        want[i] = random_bytes(want[i].size(), 1000 + op);
        write(id, rng() % 2 ? Tier::pinned : Tier::device, want[i]);
        break;
      case 5:
        ASSERT_EQ(read(id), want[i]) << "tensor " << i << " after op " << op;
        break;
    }
    if (rng() % 8 == 0) {
      for (Move& m : in_flight) m.wait();
      in_flight.clear();
      // An eviction the manager issued itself, to make room, may still carry a tensor's only copy: it
      // has no valid copy until that move lands, and then it must have one.
      for (TensorId t : ids) {
        TensorInfo info = tm->info(t);
        ASSERT_TRUE(info.valid != 0 || info.state == State::in_flight)
            << info.desc.name << " has no valid copy and no move in flight after op " << op;
        ASSERT_EQ(info.valid & ~info.allocated, 0) << "a valid copy without a block";
      }
      tm->synchronize();
      for (TensorId t : ids)
        ASSERT_NE(tm->info(t).valid, 0) << tm->info(t).desc.name << " has no valid copy after op " << op;
    }
    expect_within_budgets("during the random sequence");
  }
  tm->synchronize();
  for (int i = 0; i < kTensors; ++i) EXPECT_EQ(read(ids[i]), want[i]) << "tensor " << i;
  Snapshot s = tm->snapshot(false);
  EXPECT_GT(s.evictions, 0u) << "the budgets were meant to force evictions";
  for (int t = 0; t < kTierCount; ++t) EXPECT_LE(s.tiers[t].reserved, s.tiers[t].capacity);
  EXPECT_EQ(s.failed_moves, 0u);
}

STRATA_TIERING_BACKENDS(Moves);

}  // namespace
}  // namespace strata::tiering
