// 64 MiB buffers: one case per collective kind (the per-element reference makes these the slow tests).
#include <gtest/gtest.h>

#include "tests/comm/comm_env.h"

namespace strata::testing {
namespace {

constexpr std::size_t k64MiB = std::size_t(64) << 20;

TEST(Large, AllReduceFp32Sum64MiBInPlaceOnStream) {
  Case c{.coll = Coll::all_reduce,
         .dtype = DType::fp32,
         .op = comm::ReduceOp::sum,
         .count = k64MiB / 4,
         .in_place = true,
         .stream = true};
  EXPECT_EQ(run_and_check(world(), c, 64), 0u);
}

TEST(Large, ReduceScatterBf16Avg64MiB) {
  // send is 64 MiB of bf16: world * recv_count elements.
  Case c{.coll = Coll::reduce_scatter,
         .dtype = DType::bf16,
         .op = comm::ReduceOp::avg,
         .count = k64MiB / 2 / std::size_t(world().world_size())};
  EXPECT_EQ(run_and_check(world(), c, 65), 0u);
}

TEST(Large, AllGatherFp16To64MiBInPlace) {
  // recv is 64 MiB of fp16.
  Case c{.coll = Coll::all_gather,
         .dtype = DType::fp16,
         .count = k64MiB / 2 / std::size_t(world().world_size()),
         .in_place = true};
  EXPECT_EQ(run_and_check(world(), c, 66), 0u);
}

}  // namespace
}  // namespace strata::testing
