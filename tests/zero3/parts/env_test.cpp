// The fake environment is a real one: the chunks, device blocks and routes env_fixture.h sets by hand are
// those the plan makes for its config at one rank (zero3/placement.h), so the parts' tests run the routes
// users get.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "tests/zero3/parts/env_fixture.h"
#include "zero3/placement.h"

namespace strata::zero3 {
namespace {

TEST(PartsEnv, ChunksAndRoutesAreThePlans) {
  for (const bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlapped" : "not overlapped");
    const test::PartsEnv env({.overlap = overlap});
    PlanInput in = plan_input(env.cfg, env.layout, env.mcfg.tie_embeddings, 1, 0, env.act);
    in.device_capacity = 1ull << 30;
    Plan p = plan_memory(in, env.cfg.zero_optimization);
    if (overlap) {
      ASSERT_TRUE(overlap_asked(in));
      const OverlapDecision d = plan_overlap(p.routes, p.memory, in, 1ull << 30, [&](int c) {
        return overlap_copy_bytes(in, in.chunks[std::size_t(c)].shard.numel);
      });
      ASSERT_EQ(d.chunks, int(env.slots.size())) << d.why_not;
      EXPECT_EQ(env.plan.overlap_host, p.memory.overlap_host);
    }
    ASSERT_EQ(env.slots.size(), p.routes.size());
    ASSERT_EQ(env.slots.size(), 4u);  // the tiny model: embedding, two blocks, head
    for (const ChunkSlot& s : env.slots) {
      const std::size_t c = std::size_t(s.id);
      EXPECT_EQ(s.route, p.routes[c])
          << s.name << ": " << describe(s.route) << ", the plan's " << describe(p.routes[c]);
      EXPECT_EQ(s.gather_block, p.gather_block[c]) << s.name;
      EXPECT_EQ(s.grad_block, p.grad_block[c]) << s.name;
      EXPECT_EQ(s.shard.numel, s.numel) << s.name;  // one rank holds the whole chunk
      EXPECT_LT(s.numel, 10000u) << s.name;         // small: the tests take milliseconds
    }
    EXPECT_EQ(env.largest_shard, p.largest_shard);
  }
}

}  // namespace
}  // namespace strata::zero3
