// GradientPath alone (zero3/engine_grads.h): gradient buffers, their hand-off to the pinned fp32 shards,
// accumulation, the gate's hand-off counts and the norm, with a FakeGate for the optimizer overlap and a
// FakeRoom for the chunk cache's device room.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tests/zero3/parts/env_fixture.h"
#include "zero3/engine_grads.h"

namespace strata::zero3 {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The gradient path over the fake environment, its chunks added as the engine's construction adds them.
struct GradsRig {
  GradsRig() {
    for (const ChunkSlot& s : env.slots) grads.add_chunk(s);
    grads.open();
  }
  ~GradsRig() { env.sync(); }

  // The model's part of a backward through chunk c: its gradients `g` (numel) written into the buffer
  // after the buffer's zeroing (the model's ops follow it on the compute stream), then handed back.
  void backward_through(int c, const std::vector<float>& g) {
    float* buf = grads.acquire_grads(c);
    env.compute_stream->synchronize();
    std::memcpy(buf, g.data(), g.size() * sizeof(float));
    grads.release_grads(c);
  }
  // Every chunk's gradients in one backward that ends the step (a fresh seed per chunk).
  std::vector<std::vector<float>> one_backward(std::uint32_t seed) {
    std::vector<std::vector<float>> g;
    grads.begin_backward({});
    for (const ChunkSlot& s : env.slots) {
      g.push_back(test::test_values(s.numel, seed + std::uint32_t(s.id), 1e-2f));
      backward_through(s.id, g.back());
    }
    grads.end_backward();
    grads.sync();
    return g;
  }
  float* shard(int c) const { return env.slots[std::size_t(c)].grad; }
  std::size_t numel(int c) const { return env.slots[std::size_t(c)].shard.numel; }
  void fill_shard(int c, float v) const { std::fill(shard(c), shard(c) + numel(c), v); }
  double sum_sq(const std::vector<float>& g) const {
    return env.opt->grad_stats(g.data(), DType::fp32, g.size()).sum_sq;
  }

  test::PartsEnv env;
  test::FakeGate gate;
  test::FakeRoom room{env};
  GradientPath grads{env, room, gate};
};

TEST(PartsGradientPath, AcquireGradsGivesAZeroedBufferOfNumelFloats) {
  GradsRig r;
  for (const ChunkSlot& s : r.env.slots) {
    const float* buf = r.grads.acquire_grads(s.id);
    r.env.compute_stream->synchronize();
    // A demand for the chunk's gradient buffer, whose block the room hands out dirty.
    ASSERT_FALSE(r.room.allocs.empty());
    EXPECT_EQ(r.room.allocs.back(), (test::FakeRoom::Alloc{r.grads.entry(s.id).gradbuf, AllocFor::demand}));
    EXPECT_EQ(r.env.tm->info(r.grads.entry(s.id).gradbuf).desc.bytes, s.numel * sizeof(float));
    const std::vector<float> zeros(s.numel, 0.0f);
    EXPECT_TRUE(test::same_bytes(buf, zeros.data(), s.numel * sizeof(float))) << s.name;
  }
  EXPECT_EQ(r.room.allocs.size(), r.env.slots.size());
}

TEST(PartsGradientPath, TheFirstHandOffCopiesTheNextOneAdds) {
  GradsRig r;
  const int c = 1;
  const std::size_t n = r.numel(c);
  r.fill_shard(c, kNaN);  // what the shard held before this step: a copy does not read it
  const std::vector<float> g1 = test::test_values(n, 11), g2 = test::test_values(n, 12);
  r.grads.begin_backward({.ends_step = false});
  r.backward_through(c, g1);
  r.grads.end_backward();
  r.grads.sync();
  EXPECT_TRUE(test::same_bytes(r.shard(c), g1.data(), n * sizeof(float)));
  r.grads.begin_backward({.ends_step = true});
  r.backward_through(c, g2);
  r.grads.end_backward();
  r.grads.sync();
  std::vector<float> sum(n);
  for (std::size_t i = 0; i < n; ++i) sum[i] = g1[i] + g2[i];  // one fp32 add per element
  EXPECT_TRUE(test::same_bytes(r.shard(c), sum.data(), n * sizeof(float)));
  const TransferStats& t = r.grads.transfers();
  EXPECT_EQ(t.grad_handoffs, 2u);
  EXPECT_EQ(t.grad_bytes, 2 * n * sizeof(float));
  EXPECT_EQ(t.grad_offloads, 2u);
  EXPECT_EQ(t.grad_reductions, 0u);  // one rank
}

TEST(PartsGradientPath, TheGateHearsEachHandOffWithTheLastBackwardsCount) {
  GradsRig r;
  // A backward that hands chunk 2 off twice and chunk 0 once.
  auto backward = [&](bool ends_step) {
    r.grads.begin_backward({.ends_step = ends_step});
    for (const int c : {2, 2, 0})
      r.backward_through(c, std::vector<float>(r.env.slots[std::size_t(c)].numel, 1));
    r.grads.end_backward();
  };
  backward(false);  // the first: no count to expect yet
  EXPECT_EQ(r.gate.calls,
            (std::vector<std::string>{"settle(2)", "handed_off(2, seen 1, expected 0, on zero3-grads)",
                                      "settle(2)", "handed_off(2, seen 2, expected 0, on zero3-grads)",
                                      "settle(0)", "handed_off(0, seen 1, expected 0, on zero3-grads)"}));
  r.gate.calls.clear();
  backward(true);
  EXPECT_EQ(r.gate.calls,
            (std::vector<std::string>{"settle(2)", "handed_off(2, seen 1, expected 2, on zero3-grads)",
                                      "settle(2)", "handed_off(2, seen 2, expected 2, on zero3-grads)",
                                      "settle(0)", "handed_off(0, seen 1, expected 1, on zero3-grads)"}));
  r.grads.sync();
}

TEST(PartsGradientPath, StatsSumTheSquaresOfEveryShard) {
  GradsRig r;
  const std::vector<std::vector<float>> g = r.one_backward(20);
  double sum_sq = 0;
  bool finite = true;
  r.grads.stats(sum_sq, finite);
  EXPECT_TRUE(finite);
  // The CPU optimizer's reductions of the shards added in chunk order, bit for bit; and a plain sum.
  double want = 0, plain = 0;
  for (const std::vector<float>& x : g) {
    want += r.sum_sq(x);
    for (const float v : x) plain += double(v) * double(v);
  }
  EXPECT_EQ(sum_sq, want);
  EXPECT_NEAR(sum_sq, plain, 1e-12 * plain);
}

TEST(PartsGradientPath, StatsSeeANonFiniteGradient) {
  GradsRig r;
  r.grads.begin_backward({});
  for (const ChunkSlot& s : r.env.slots) {
    std::vector<float> g = test::test_values(s.numel, 30 + std::uint32_t(s.id));
    if (s.id == 2) g[s.numel / 2] = kNaN;
    r.backward_through(s.id, g);
  }
  r.grads.end_backward();
  r.grads.sync();
  double sum_sq = 0;
  bool finite = true;
  r.grads.stats(sum_sq, finite);
  EXPECT_FALSE(finite);
}

TEST(PartsGradientPath, StatsTakeTheGatesEarlyStatisticsForAChunk) {
  GradsRig r;
  const std::vector<std::vector<float>> g = r.one_backward(40);
  // The overlap's worker took chunk 2's from its final gradients: those stand in for the shard's.
  r.gate.early[2] = ShardNorm{.valid = true, .sum_sq = 1000.0, .finite = true, .blocks = {}};
  double sum_sq = 0;
  bool finite = true;
  r.grads.stats(sum_sq, finite);
  EXPECT_TRUE(finite);
  EXPECT_EQ(sum_sq, ((0.0 + r.sum_sq(g[0])) + r.sum_sq(g[1]) + 1000.0) + r.sum_sq(g[3]));
}

TEST(PartsGradientPath, StatsZeroTheShardsNoGradientReached) {
  GradsRig r;
  for (const ChunkSlot& s : r.env.slots) r.fill_shard(s.id, kNaN);  // whatever they held before this step
  const std::vector<float> g0 = test::test_values(r.numel(0), 50);
  r.grads.begin_backward({});
  r.backward_through(0, g0);
  r.grads.end_backward();
  r.grads.sync();
  double sum_sq = 0;
  bool finite = true;
  r.grads.stats(sum_sq, finite);
  EXPECT_TRUE(finite);  // the NaNs left in chunks 1-3 were not read
  EXPECT_EQ(sum_sq, r.sum_sq(g0));
  for (const int c : {1, 2, 3}) {
    const std::vector<float> zeros(r.numel(c), 0.0f);
    EXPECT_TRUE(test::same_bytes(r.shard(c), zeros.data(), r.numel(c) * sizeof(float))) << "chunk " << c;
  }
}

TEST(PartsGradientPath, NewStepMakesEveryChunkFreshAgain) {
  GradsRig r;
  const std::size_t n = r.numel(0);
  r.one_backward(60);
  double sum_sq = 0;
  bool finite = true;
  r.grads.stats(sum_sq, finite);  // the step
  r.grads.new_step();
  r.fill_shard(1, kNaN);
  const std::vector<float> g = test::test_values(n, 61);
  r.grads.begin_backward({});
  r.backward_through(0, g);
  r.grads.end_backward();
  r.grads.sync();
  // Copied, not added to the last step's gradients; and chunk 1, no longer reached, is zeroed again.
  EXPECT_TRUE(test::same_bytes(r.shard(0), g.data(), n * sizeof(float)));
  sum_sq = 0;
  r.grads.stats(sum_sq, finite);
  EXPECT_TRUE(finite);
  const std::vector<float> zeros(r.numel(1), 0.0f);
  EXPECT_TRUE(test::same_bytes(r.shard(1), zeros.data(), r.numel(1) * sizeof(float)));
}

}  // namespace
}  // namespace strata::zero3
