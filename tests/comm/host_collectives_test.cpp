// The host collectives (Note [Communicator semantics]): host_all_gather puts every rank's bytes at its slot
// on every rank, in place and not; host_broadcast gives every rank the root's bytes; both over ordinary
// host memory (std::vector), for sizes 0, 1, 13 and 100,003 bytes, and with MPI messages split into
// pieces of 7 elements.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "comm/mpi_impl.h"
#include "core/error.h"
#include "tests/comm/comm_env.h"

namespace strata::testing {
namespace {

// Rank r's byte i (salted), so that every rank can check every other rank's bytes.
std::uint8_t byte_of(int rank, std::size_t i, std::uint32_t salt) {
  return std::uint8_t(input_value(rank, i, salt) * 64);
}

std::vector<std::uint8_t> bytes_of(int rank, std::size_t n, std::uint32_t salt) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = byte_of(rank, i, salt);
  return v;
}

// bytes, a flag (all_gather: in place; broadcast: the root is the last rank, not 0), max MPI message
// elements (0: the default).
using Param = std::tuple<std::size_t, bool, std::size_t>;

class HostCollective : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    if (std::get<2>(GetParam())) comm::detail::set_mpi_max_message_count(std::get<2>(GetParam()));
  }
  void TearDown() override { comm::detail::set_mpi_max_message_count(INT_MAX); }
};
class HostAllGather : public HostCollective {};
class HostBroadcast : public HostCollective {};

TEST_P(HostAllGather, PutsEveryRanksBytesAtItsSlot) {
  const auto& [n, in_place, pieces] = GetParam();
  const int W = world().world_size(), me = world().rank();
  const std::uint32_t salt = std::uint32_t(n) + 11;
  std::vector<std::uint8_t> recv(std::size_t(W) * n + 1, 0xee);  // one guard byte past the end
  std::vector<std::uint8_t> send = bytes_of(me, n, salt);
  const void* from = send.data();
  if (in_place) {
    std::copy(send.begin(), send.end(), recv.begin() + std::ptrdiff_t(std::size_t(me) * n));
    from = recv.data() + std::size_t(me) * n;
  }
  world().host_all_gather(from, recv.data(), n);
  std::size_t bad = 0;
  for (int r = 0; r < W; ++r)
    for (std::size_t i = 0; i < n; ++i) bad += recv[std::size_t(r) * n + i] != byte_of(r, i, salt);
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(recv.back(), 0xee) << "wrote past world * bytes";
  EXPECT_EQ(send, bytes_of(me, n, salt)) << "send is read only";
}

TEST_P(HostBroadcast, GivesEveryRankTheRootsBytes) {
  const auto& [n, root_last, pieces] = GetParam();
  const int W = world().world_size(), me = world().rank();
  const int root = root_last ? W - 1 : 0;
  const std::uint32_t salt = std::uint32_t(n) + 23;
  std::vector<std::uint8_t> buf = me == root ? bytes_of(root, n, salt) : std::vector<std::uint8_t>(n, 0);
  world().host_broadcast(buf.data(), n, root);
  EXPECT_EQ(buf, bytes_of(root, n, salt));
}

std::string name(const ::testing::TestParamInfo<Param>& i, const char* flag) {
  const auto& [n, set, pieces] = i.param;
  std::string s = "n" + std::to_string(n) + "_" + (set ? "" : "not") + flag;
  if (pieces) s += "_pieces" + std::to_string(pieces);
  return s;
}
std::string gather_name(const ::testing::TestParamInfo<Param>& i) {
  return name(i, "inplace");
}
std::string broadcast_name(const ::testing::TestParamInfo<Param>& i) {
  return name(i, "rootlast");
}

const auto kSizes =
    ::testing::Combine(::testing::Values(0, 1, 13, 100003), ::testing::Bool(), ::testing::Values(0));
const auto kPieces = ::testing::Combine(::testing::Values(13, 1001), ::testing::Bool(), ::testing::Values(7));
INSTANTIATE_TEST_SUITE_P(Sizes, HostAllGather, kSizes, gather_name);
INSTANTIATE_TEST_SUITE_P(Pieces, HostAllGather, kPieces, gather_name);
INSTANTIATE_TEST_SUITE_P(Sizes, HostBroadcast, kSizes, broadcast_name);
INSTANTIATE_TEST_SUITE_P(Pieces, HostBroadcast, kPieces, broadcast_name);

TEST(HostCollectives, ABadRootThrowsOnEveryRankAndTheCommunicatorStillWorks) {
  std::uint64_t x = 5;
  EXPECT_THROW(world().host_broadcast(&x, sizeof x, world().world_size()), Error);
  // What the engine's checkpoint does with a few counters: every rank's value, on every rank.
  const int W = world().world_size();
  std::vector<std::uint64_t> all(static_cast<std::size_t>(W));
  const std::uint64_t mine = 1000 + std::uint64_t(world().rank());
  world().host_all_gather(&mine, all.data(), sizeof mine);
  for (int r = 0; r < W; ++r) EXPECT_EQ(all[std::size_t(r)], 1000u + std::uint64_t(r));
}

TEST(HostCollectives, ADupHasItsOwnHostCollectives) {
  std::unique_ptr<comm::Communicator> d = world().dup();
  double v = d->rank() == 0 ? 2.5 : 0.0;
  d->host_broadcast(&v, sizeof v, 0);
  EXPECT_EQ(v, 2.5);
}

}  // namespace
}  // namespace strata::testing
