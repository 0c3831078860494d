// The caching allocator: block splitting and reuse, fenced reuse, PyTorch-style stats, the budget.
#include <gtest/gtest.h>

#include <iterator>
#include <random>
#include <set>
#include <vector>

#include "tests/common/stream_gate.h"
#include "tests/tiering/tiering_fixture.h"
#include "tiering/caching_allocator.h"

namespace strata::tiering {
namespace {

using test::TieringTest;

class Allocator : public TieringTest {
 protected:
  std::unique_ptr<CachingAllocator> make_alloc(std::uint64_t capacity) {
    dev = open_device({.backend = GetParam(), .ordinal = 0, .memory_cap = 0});
    return make_device_allocator(*dev, {.name = "device", .capacity = capacity});
  }
};

TEST_P(Allocator, SmallBlocksAreSplitFromOneSegmentAndReusedAfterFree) {
  auto a = make_alloc(64 << 20);
  void* p1 = a->allocate(1000);
  void* p2 = a->allocate(3000);
  AllocatorStats s = a->stats();
  EXPECT_EQ(s.segment[0].current, 1u) << "both small blocks come from one 2 MiB segment";
  EXPECT_EQ(s.reserved_bytes[0].current, 2u << 20);
  EXPECT_EQ(s.allocated_bytes[0].current, 1024u + 3072u) << "sizes round up to 512";
  EXPECT_EQ(s.requested_bytes[0].current, 4000u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p1) % 512, 0u);
  a->free(p1);
  void* p3 = a->allocate(900);
  EXPECT_EQ(p3, p1) << "the freed block is the best fit and is reused";
  a->free(p2);
  a->free(p3);
  s = a->stats();
  EXPECT_EQ(s.allocated_bytes[0].current, 0u);
  EXPECT_EQ(s.allocation[0].peak, 2u);
  EXPECT_EQ(a->empty_cache(), 2u << 20) << "after merging, the segment is one free block and goes back";
  EXPECT_EQ(a->stats().reserved_bytes[0].current, 0u);
}

TEST_P(Allocator, LargeRequestsGetTheirOwnRoundedSegmentAndStatsPerPool) {
  auto a = make_alloc(256 << 20);
  void* big = a->allocate((11 << 20) + 1);  // >= 10 MiB: own segment, rounded to 2 MiB
  void* mid = a->allocate(3 << 20);         // large pool, 20 MiB segment, split
  void* mid2 = a->allocate(3 << 20);        // from the rest of that segment
  AllocatorStats s = a->stats();
  EXPECT_EQ(s.segment[int(StatType::large_pool)].current, 2u);
  EXPECT_EQ(s.reserved_bytes[int(StatType::large_pool)].current, (12u << 20) + (20u << 20));
  EXPECT_EQ(s.segment[int(StatType::small_pool)].current, 0u);
  EXPECT_EQ(static_cast<char*>(mid2) - static_cast<char*>(mid), 3 << 20);
  a->free(big);
  a->free(mid);
  a->free(mid2);
  EXPECT_EQ(a->stats().allocated_bytes[0].current, 0u);
  EXPECT_EQ(a->stats().allocated_bytes[0].peak, (12u << 20) + (6u << 20));
}

TEST_P(Allocator, AFreedBlockIsNotReusedBeforeItsLastUseCompletes) {
  auto a = make_alloc(64 << 20);
  void* p = a->allocate(4096);
  auto last_use = std::make_shared<Flag>();
  a->free(p, last_use);
  EXPECT_EQ(a->stats().pending_bytes[0].current, 4096u);
  std::set<void*> handed;
  for (int i = 0; i < 8; ++i) handed.insert(a->allocate(4096));
  EXPECT_EQ(handed.count(p), 0u) << "reused while its last use was still running";
  last_use->signal();
  void* q = a->allocate(4096);
  EXPECT_EQ(q, p) << "once the fence is ready the block is the best fit again";
  EXPECT_EQ(a->stats().pending_bytes[0].current, 0u);
  a->free(q);
  for (void* h : handed) a->free(h);
  EXPECT_EQ(a->stats().allocation[0].current, 0u);
}

TEST_P(Allocator, AStreamFreeWaitsForTheWorkEnqueuedOnThatStream) {
  auto a = make_alloc(64 << 20);
  auto s = dev->create_stream("compute");
  void* p = a->allocate(1 << 20);
  strata::test::StreamGate gate;
  gate.hold(*s);  // the stream is busy until the test opens the gate
  a->free(p, *s);
  void* q = a->allocate(1 << 20);
  EXPECT_NE(q, p);
  gate.open();
  s->synchronize();
  a->free(q);
  EXPECT_EQ(a->stats().pending_bytes[0].current, 0u);
}

TEST_P(Allocator, ReservedBytesNeverExceedTheCapacityAndFailureIsCounted) {
  auto a = make_alloc(10 << 20);
  std::vector<void*> live;
  std::mt19937_64 rng(3);
  for (int i = 0; i < 400; ++i) {
    if (!live.empty() && rng() % 3 == 0) {
      std::size_t k = rng() % live.size();
      a->free(live[k]);
      live.erase(live.begin() + long(k));
      continue;
    }
    if (void* p = a->try_allocate(1 + rng() % (3 << 20))) live.push_back(p);
    ASSERT_LE(a->stats().reserved_bytes[0].current, 10u << 20);
  }
  AllocatorStats s = a->stats();
  EXPECT_LE(s.reserved_bytes[0].peak, 10u << 20);
  EXPECT_GT(s.num_ooms, 0u) << "random requests past 10 MiB must have failed sometimes";
  EXPECT_GT(s.num_alloc_retries, 0u) << "a full budget releases cached segments before failing";
  for (void* p : live) a->free(p);
}

TEST_P(Allocator, OutOfMemoryNamesTheRequestTheStatsAndTheSetting) {
  auto a = make_alloc(4 << 20);
  void* p = a->allocate(3 << 20);
  try {
    a->allocate(2 << 20, "layers.7.params");
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("layers.7.params"), std::string::npos) << m;
    EXPECT_NE(m.find("capacity 4.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("allocated 3.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("strata.device_memory_cap"), std::string::npos) << m;
  }
  a->free(p);
}

TEST_P(Allocator, PinnedSlabsArePageAlignedAndReportedToTheHooks) {
  dev = open_device({.backend = GetParam(), .ordinal = 0, .memory_cap = 0});
  std::size_t slabs = 0, released = 0;
  {
    auto a = make_pinned_allocator(*dev, {.capacity = 16 << 20,
                                          .slab_bytes = 4 << 20,
                                          .on_slab = [&](void*, std::size_t) { ++slabs; },
                                          .on_release = [&](void*, std::size_t) { ++released; }});
    void* x = a->allocate(1500 << 10);  // large pool: shares a 4 MiB slab
    void* y = a->allocate(1500 << 10);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(x) % 4096, 0u);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(y) % 4096, 0u);
    EXPECT_EQ(slabs, 1u);
    void* z = a->allocate(6 << 20);  // bigger than a slab: a slab of its own
    EXPECT_EQ(slabs, 2u);
    a->free(x);
    a->free(y);
    a->free(z);
  }
  EXPECT_EQ(released, slabs);
}

// Note [exact segments]: a request fails exactly when the blocks in use plus block_bytes(request) exceed
// the capacity, whatever the order of earlier requests and frees (sizes across the small and large pools,
// cached segments of other sizes in the way).
TEST_P(Allocator, ExactSegmentsRefuseOnlyWhatTheBlocksInUseLeaveNoRoomFor) {
  dev = open_device({.backend = GetParam(), .ordinal = 0, .memory_cap = 0});
  const std::uint64_t cap = 24u << 20;
  auto a = make_device_allocator(*dev, {.name = "device", .capacity = cap, .exact_segments = true});
  std::mt19937_64 rng(42);
  const std::size_t sizes[] = {700, 4096, 300 << 10, (1 << 20) + 3, 3 << 20, (6 << 20) + 100, 11 << 20};
  std::vector<std::pair<void*, std::uint64_t>> live;  // block, block_bytes
  std::uint64_t in_use = 0;
  int refused = 0, granted = 0;
  for (int i = 0; i < 4000; ++i) {
    if (!live.empty() && rng() % 5 < 2) {
      const std::size_t k = rng() % live.size();
      a->free(live[k].first);
      in_use -= live[k].second;
      live.erase(live.begin() + std::ptrdiff_t(k));
      continue;
    }
    const std::size_t bytes = sizes[rng() % std::size(sizes)];
    const std::uint64_t b = a->block_bytes(bytes);
    void* p = a->try_allocate(bytes);
    ASSERT_EQ(p != nullptr, in_use + b <= cap)
        << "request " << i << " of " << bytes << " bytes with " << in_use << " in use";
    if (p) {
      EXPECT_EQ(a->block_size(p), b);
      live.push_back({p, b});
      in_use += b;
      ++granted;
    } else {
      ++refused;
    }
    EXPECT_LE(a->stats().reserved_bytes[0].current, cap);
  }
  EXPECT_GT(refused, 100) << "the sequence should press against the budget";
  EXPECT_GT(granted, 1000);
  for (auto& [p, b] : live) a->free(p);
}

STRATA_TIERING_BACKENDS(Allocator);

}  // namespace
}  // namespace strata::tiering
