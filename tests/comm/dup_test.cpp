// dup(): a new communicator over the same ranks, and two of them driven at once from two threads (one
// issuing directly, one through a stream), interleaved differently on every rank.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "tests/comm/comm_env.h"

namespace strata::testing {
namespace {

TEST(Dup, SameRanksAndIndependentOrder) {
  std::unique_ptr<comm::Communicator> d = world().dup();
  EXPECT_EQ(d->rank(), world().rank());
  EXPECT_EQ(d->world_size(), world().world_size());
  EXPECT_STREQ(d->name(), world().name());
  EXPECT_EQ(run_and_check(*d, {.coll = Coll::all_reduce, .dtype = DType::bf16, .count = 1001}, 7), 0u);
}

TEST(Dup, TwoCommunicatorsFromTwoThreads) {
  std::unique_ptr<comm::Communicator> a = world().dup();
  std::unique_ptr<comm::Communicator> b = world().dup();
  constexpr int kRounds = 20;
  std::atomic<std::size_t> bad_a{0}, bad_b{0};
  std::thread ta([&] {
    for (int i = 0; i < kRounds; ++i) {
      Case c{.coll = Coll::all_reduce,
             .dtype = DType::fp32,
             .op = comm::ReduceOp::sum,
             .count = std::size_t(1001 + i),
             .stream = i % 2 == 1};
      bad_a += run_and_check(*a, c, 100 + i);
    }
  });
  std::thread tb([&] {
    for (int i = 0; i < kRounds; ++i) {
      Case c{.coll = i % 2 ? Coll::all_gather : Coll::reduce_scatter,
             .dtype = DType::bf16,
             .op = comm::ReduceOp::max,
             .count = std::size_t(333 + i),
             .stream = i % 3 == 0};
      bad_b += run_and_check(*b, c, 200 + i);
    }
  });
  ta.join();
  tb.join();
  EXPECT_EQ(bad_a.load(), 0u);
  EXPECT_EQ(bad_b.load(), 0u);
}

}  // namespace
}  // namespace strata::testing
