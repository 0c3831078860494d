// Every collective against the local reference (collective_check.cpp): each dtype and op, counts 0, 1 and
// 1001, in place and out of place, with and without a stream — and once more with MPI messages split
// into pieces of 7 elements (the path messages longer than INT_MAX elements take).
#include <gtest/gtest.h>

#include <climits>
#include <string>
#include <tuple>

#include "comm/mpi_impl.h"
#include "tests/comm/comm_env.h"

namespace strata::testing {
namespace {

using comm::ReduceOp;
// coll, dtype, op, count, in place, stream, root, max MPI message elements (0: the default).
using Param = std::tuple<Coll, DType, ReduceOp, std::size_t, bool, bool, int, std::size_t>;

class Collective : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    if (std::get<7>(GetParam())) comm::detail::set_mpi_max_message_count(std::get<7>(GetParam()));
  }
  void TearDown() override { comm::detail::set_mpi_max_message_count(INT_MAX); }
};

TEST_P(Collective, MatchesLocalReference) {
  const auto& [coll, dtype, op, count, in_place, stream, root, pieces] = GetParam();
  Case c{.coll = coll,
         .dtype = dtype,
         .op = op,
         .count = count,
         .in_place = in_place,
         .stream = stream,
         .root = root};
  EXPECT_EQ(run_and_check(world(), c, std::uint32_t(count)), 0u);
}

std::string name(const ::testing::TestParamInfo<Param>& i) {
  const auto& [coll, dtype, op, count, in_place, stream, root, pieces] = i.param;
  std::string s = std::string(coll_name(coll)) + "_" + dtype_name(dtype);
  if (coll == Coll::reduce_scatter || coll == Coll::all_reduce || coll == Coll::reduce)
    s += std::string("_") + comm::to_string(op);
  s += "_n" + std::to_string(count) + (in_place ? "_inplace" : "_outofplace") + (stream ? "_stream" : "_now");
  if (coll == Coll::broadcast || coll == Coll::reduce) s += root ? "_rootlast" : "_root0";
  if (pieces) s += "_pieces" + std::to_string(pieces);
  return s;
}

// root: 0 or the last rank (1000 is clamped to world - 1).
constexpr int kLast = 1000;

INSTANTIATE_TEST_SUITE_P(Reductions, Collective,
                         ::testing::Combine(::testing::Values(Coll::reduce_scatter, Coll::all_reduce),
                                            ::testing::Values(DType::fp32, DType::bf16, DType::fp16),
                                            ::testing::Values(ReduceOp::sum, ReduceOp::avg, ReduceOp::max,
                                                              ReduceOp::min),
                                            ::testing::Values(0, 1, 1001), ::testing::Bool(),
                                            ::testing::Bool(), ::testing::Values(0), ::testing::Values(0)),
                         name);
INSTANTIATE_TEST_SUITE_P(
    Reduce, Collective,
    ::testing::Combine(::testing::Values(Coll::reduce),
                       ::testing::Values(DType::fp32, DType::bf16, DType::fp16),
                       ::testing::Values(ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min),
                       ::testing::Values(0, 1, 1001), ::testing::Bool(), ::testing::Bool(),
                       ::testing::Values(0, kLast), ::testing::Values(0)),
    name);
INSTANTIATE_TEST_SUITE_P(
    AllGather, Collective,
    ::testing::Combine(::testing::Values(Coll::all_gather),
                       ::testing::Values(DType::fp32, DType::bf16, DType::fp16, DType::i32, DType::u8),
                       ::testing::Values(ReduceOp::sum), ::testing::Values(0, 1, 1001), ::testing::Bool(),
                       ::testing::Bool(), ::testing::Values(0), ::testing::Values(0)),
    name);
INSTANTIATE_TEST_SUITE_P(
    Broadcast, Collective,
    ::testing::Combine(::testing::Values(Coll::broadcast),
                       ::testing::Values(DType::fp32, DType::bf16, DType::fp16, DType::i32, DType::u8),
                       ::testing::Values(ReduceOp::sum), ::testing::Values(0, 1, 1001), ::testing::Bool(),
                       ::testing::Bool(), ::testing::Values(0, kLast), ::testing::Values(0)),
    name);
// Messages split into pieces: every collective, both layouts, a 16-bit and a 32-bit type.
INSTANTIATE_TEST_SUITE_P(SplitMessages, Collective,
                         ::testing::Combine(::testing::Values(Coll::broadcast, Coll::all_gather,
                                                              Coll::reduce_scatter, Coll::all_reduce,
                                                              Coll::reduce),
                                            ::testing::Values(DType::fp32, DType::bf16),
                                            ::testing::Values(ReduceOp::sum), ::testing::Values(1001),
                                            ::testing::Bool(), ::testing::Bool(), ::testing::Values(kLast),
                                            ::testing::Values(7)),
                         name);

}  // namespace
}  // namespace strata::testing
