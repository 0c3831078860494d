// ChunkCache alone (zero3/engine_cache.h): gathers, release, device room and its counts, with a FakeGate for
// the optimizer overlap.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/zero3/parts/env_fixture.h"
#include "zero3/engine_cache.h"

namespace strata::zero3 {
namespace {

using test::EnvOptions;
using test::Precision;
using Gather = CacheEntry::Gather;

// The cache over the fake environment, its chunks added as the engine's construction adds them.
struct CacheRig {
  explicit CacheRig(EnvOptions o = {}) : env(o) {
    cache.open();
    for (const ChunkSlot& s : env.slots) cache.add_chunk(s);
  }
  ~CacheRig() { env.sync(); }
  std::uint64_t device_bytes_used() const { return env.tm->pool_stats(Tier::device).used.current; }

  test::PartsEnv env;
  test::FakeGate gate;
  ChunkCache cache{env, gate};
};

class PartsChunkCacheGather : public ::testing::TestWithParam<Precision> {};

TEST_P(PartsChunkCacheGather, AcquireGivesTheWorkingParamsInTheActivationDtype) {
  CacheRig r({.precision = GetParam()});
  // The engine's pairs: bf16 training gathers into bf16 activations; fp16 and fp32 training into fp32.
  EXPECT_EQ(r.env.act, GetParam() == Precision::bf16 ? DType::bf16 : DType::fp32);
  for (const ChunkSlot& s : r.env.slots) {
    const model::ChunkView v = r.cache.acquire(s.id);
    r.env.compute_stream->synchronize();  // where the model's ops read it
    EXPECT_EQ(v.dtype, r.env.act);
    EXPECT_EQ(v.layout, &r.env.layout.chunk(s.id));
    const std::vector<std::byte> want = test::widened(s.param_home, r.env.working_dtype, r.env.act, s.numel);
    EXPECT_TRUE(test::same_bytes(v.data, want.data(), want.size(), dtype_bytes(r.env.act))) << s.name;
    r.cache.release(s.id);
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, PartsChunkCacheGather,
                         ::testing::Values(Precision::bf16, Precision::fp16, Precision::fp32),
                         [](const auto& info) { return std::string(test::name(info.param)); });

TEST(PartsChunkCache, SettlesTheChunkBeforeItsGatherStarts) {
  CacheRig r;
  struct AtSettle {
    int chunk;
    Gather gather;
    std::uint64_t gathers;
  };
  std::vector<AtSettle> seen;
  r.gate.on_settle = [&](int c) {
    seen.push_back({c, r.cache.entry(c).gather, r.cache.transfers().gathers});
  };
  r.cache.begin_pass(false);
  for (const ChunkSlot& s : r.env.slots) {
    r.cache.acquire(s.id);
    r.cache.release(s.id);
  }
  r.cache.end_pass();
  ASSERT_EQ(seen.size(), r.env.slots.size());
  for (std::size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].chunk, int(i));
    EXPECT_EQ(seen[i].gather, Gather::absent) << "chunk " << i;  // nothing started for it yet
    EXPECT_EQ(seen[i].gathers, i) << "chunk " << i;              // nor counted
  }
  EXPECT_EQ(r.cache.transfers().gathers, r.env.slots.size());
}

TEST(PartsChunkCache, AcquireOutsideAPassUndoesTheEarlyUpdatesFirst) {
  CacheRig r;
  r.cache.acquire(1);  // an evaluation, or reading the weights: the last step's values
  r.cache.release(1);
  EXPECT_EQ(r.gate.calls, (std::vector<std::string>{"undo(cancellation)", "settle(1)"}));
  r.gate.calls.clear();
  r.cache.begin_pass(false);  // a training pass: the early updates stand
  r.cache.acquire(1);
  r.cache.release(1);
  r.cache.end_pass();
  EXPECT_EQ(r.gate.calls, (std::vector<std::string>{"settle(1)"}));
}

TEST(PartsChunkCache, ReleaseOutsideAPassDropsTheBlock) {
  CacheRig r;
  const ChunkSlot& s = r.env.slots[2];
  const std::uint64_t before = r.device_bytes_used();
  r.cache.acquire(s.id);
  EXPECT_EQ(r.device_bytes_used(), before + s.numel * dtype_bytes(r.env.act));
  r.cache.release(s.id);
  r.env.sync();
  EXPECT_EQ(r.device_bytes_used(), before);
  EXPECT_EQ(r.cache.entry(s.id).gather, Gather::absent);
  EXPECT_EQ(r.cache.entry(s.id).gptr, nullptr);
  EXPECT_EQ(r.cache.live_numel(), 0u);
}

TEST(PartsChunkCache, ADemandDropsACachedChunkWhereAPrefetchGetsNothing) {
  // A device pool of exactly two blocks the size of chunk 0's gathered copy.
  const std::uint64_t block = test::PartsEnv().slots[0].gather_block;
  CacheRig r({.device_budget = 2 * block});
  const std::uint64_t bytes = r.env.slots[0].numel * dtype_bytes(r.env.act);
  const tiering::TensorId a = r.env.device_tensor("test.a", bytes), b = r.env.device_tensor("test.b", bytes),
                          c = r.env.device_tensor("test.c", bytes);
  ASSERT_TRUE(r.cache.start_fetch(0, /*demand=*/false));  // chunk 0 prefetched: in the cache
  ASSERT_NE(r.cache.device_alloc(a, AllocFor::demand), nullptr);
  // The device is full: a prefetch gets no block, and drops nothing for one.
  EXPECT_EQ(r.cache.device_alloc(b, AllocFor::prefetch), nullptr);
  EXPECT_EQ(r.cache.entry(0).gather, Gather::in_flight);
  // A demand drops the cached chunk instead of failing.
  EXPECT_NE(r.cache.device_alloc(b, AllocFor::demand), nullptr);
  EXPECT_EQ(r.cache.entry(0).gather, Gather::absent);
  EXPECT_EQ(r.cache.entry(0).gptr, nullptr);
  // With nothing cached left, a demand fails.
  EXPECT_THROW(r.cache.device_alloc(c, AllocFor::demand), OutOfMemory);
}

TEST(PartsChunkCache, TransfersCountGathersAndTheirWorkingBytes) {
  // fp16 training: 2-byte working params gathered into 4-byte activations; the count is of what is read.
  CacheRig r({.precision = Precision::fp16});
  std::uint64_t bytes = 0;
  for (const int c : {0, 1, 2, 3, 0}) {
    r.cache.acquire(c);
    r.cache.release(c);
    bytes += r.env.slots[std::size_t(c)].param_numel * 2;
  }
  EXPECT_EQ(r.cache.transfers().gathers, 5u);
  EXPECT_EQ(r.cache.transfers().gather_bytes, bytes);
  EXPECT_EQ(r.cache.transfers().gather_host_waits, 0u);  // no NVMe home: the host never waits for a gather
}

}  // namespace
}  // namespace strata::zero3
