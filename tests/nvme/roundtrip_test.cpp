// Random data at odd sizes and offsets through each backend, checked byte for byte against the psync
// backend and against plain pread/pwrite.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <tuple>

#include "nvme/engine.h"
#include "nvme/file.h"
#include "tests/nvme/test_util.h"

namespace strata::nvme {
namespace {

using test::ScratchDir;

struct Range {
  std::uint64_t off;
  std::size_t len;
};

// Disjoint ranges with odd offsets and lengths, some spanning many blocks, in shuffled order.
std::vector<Range> odd_ranges(std::uint64_t seed, int count, std::size_t max_len) {
  std::mt19937_64 rng(seed);
  std::vector<Range> r;
  std::uint64_t at = 1 + rng() % 4095;
  for (int i = 0; i < count; ++i) {
    std::size_t len = 1 + rng() % max_len;
    r.push_back({at, len});
    at += len + rng() % 9000;
  }
  std::shuffle(r.begin(), r.end(), rng);
  return r;
}

AioOptions small_blocks(Backend b, bool direct) {
  AioOptions o;
  o.backend = b;
  o.block_size = 64 << 10;  // many pieces per request
  o.queue_depth = 4;
  o.use_direct = direct;
  return o;
}

class RoundTrip : public ::testing::TestWithParam<std::tuple<Backend, bool>> {
 protected:
  void SetUp() override { STRATA_SKIP_IF_UNAVAILABLE(std::get<0>(GetParam())); }
  Backend backend() const { return std::get<0>(GetParam()); }
  bool direct() const { return std::get<1>(GetParam()); }
};

TEST_P(RoundTrip, WritesAtOddSizesAndOffsetsReadBackIdenticallyThroughTheOracle) {
  ScratchDir dir("nvme");
  AioEngine engine(small_blocks(backend(), direct()));
  File f = File::open(dir.file("data.bin"), OpenMode::create, direct());
  auto ranges = odd_ranges(1, 24, 300'000);
  std::vector<std::vector<std::uint8_t>> data;
  std::vector<IoHandle> hs;
  for (std::size_t i = 0; i < ranges.size(); ++i) data.push_back(test::random_bytes(ranges[i].len, 100 + i));
  for (std::size_t i = 0; i < ranges.size(); ++i)
    hs.push_back(engine.submit_write(f, data[i].data(), ranges[i].len, ranges[i].off));
  for (IoHandle h : hs) engine.wait(h);

  AioOptions oracle_opts = small_blocks(Backend::psync, false);
  AioEngine oracle(oracle_opts);
  File g = File::open(dir.file("data.bin"), OpenMode::read_only, false);
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    std::vector<std::uint8_t> via_psync(ranges[i].len);
    oracle.read(g, via_psync.data(), ranges[i].len, ranges[i].off);
    auto via_pread = test::oracle_read(dir.file("data.bin"), ranges[i].off, ranges[i].len);
    EXPECT_EQ(test::first_difference(via_psync.data(), data[i].data(), ranges[i].len), -1)
        << "range " << i << " at " << ranges[i].off << "+" << ranges[i].len;
    EXPECT_EQ(test::first_difference(via_pread.data(), data[i].data(), ranges[i].len), -1) << "range " << i;
  }
  if (direct() && f.direct()) {
    EXPECT_GT(engine.stats().direct_pieces, 0u);
  }
}

TEST_P(RoundTrip, ReadsAtOddSizesAndOffsetsMatchWhatTheOracleWrote) {
  ScratchDir dir("nvme");
  const std::size_t n = 3'000'001;
  auto content = test::random_bytes(n, 7);
  test::oracle_write(dir.file("data.bin"), content.data(), n, 0);
  AioEngine engine(small_blocks(backend(), direct()));
  File f = File::open(dir.file("data.bin"), OpenMode::read_only, direct());
  auto ranges = odd_ranges(2, 20, 140'000);
  std::vector<std::vector<std::uint8_t>> got;
  std::vector<IoHandle> hs;
  for (const Range& r : ranges) got.emplace_back(r.len, 0xEE);
  for (std::size_t i = 0; i < ranges.size(); ++i)
    hs.push_back(engine.submit_read(f, got[i].data(), ranges[i].len, ranges[i].off));
  for (IoHandle h : hs) engine.wait(h);
  for (std::size_t i = 0; i < ranges.size(); ++i)
    EXPECT_EQ(test::first_difference(got[i].data(), content.data() + ranges[i].off, ranges[i].len), -1)
        << "range " << i << " at " << ranges[i].off << "+" << ranges[i].len;
}

TEST_P(RoundTrip, RequestsSplitAcrossThreadsKeepEveryByte) {
  ScratchDir dir("nvme");
  AioOptions o = small_blocks(backend(), direct());
  o.intra_op_parallelism = 3;
  AioEngine engine(o);
  File f = File::open(dir.file("data.bin"), OpenMode::create, direct());
  const std::size_t n = (5 << 20) + 12345;
  const std::uint64_t off = 777;
  auto content = test::random_bytes(n, 9);
  engine.write(f, content.data(), n, off);
  std::vector<std::uint8_t> back(n);
  engine.read(f, back.data(), n, off);
  EXPECT_EQ(test::first_difference(back.data(), content.data(), n), -1);
  auto via_pread = test::oracle_read(dir.file("data.bin"), off, n);
  EXPECT_EQ(test::first_difference(via_pread.data(), content.data(), n), -1);
}

INSTANTIATE_TEST_SUITE_P(Backends, RoundTrip,
                         ::testing::Combine(::testing::ValuesIn(test::all_backends()), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(to_string(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_direct" : "_buffered");
                         });

// DeepSpeed's submission modes change how pieces reach the kernel, never which bytes land where.
class SubmitModes : public ::testing::TestWithParam<std::tuple<Backend, bool, bool>> {};

TEST_P(SubmitModes, SingleSubmitAndLockStepCompletionMoveTheSameBytes) {
  auto [backend, single_submit, overlap] = GetParam();
  STRATA_SKIP_IF_UNAVAILABLE(backend);
  ScratchDir dir("nvme");
  AioOptions o = small_blocks(backend, true);
  o.queue_depth = 3;
  o.single_submit = single_submit;
  o.overlap_events = overlap;
  AioEngine engine(o);
  File f = File::open(dir.file("data.bin"), OpenMode::create, true);
  const std::size_t n = (1 << 20) + 4097;
  auto content = test::random_bytes(n, 11);
  engine.write(f, content.data(), n, 4096 * 3 + 5);
  std::vector<std::uint8_t> back(n);
  engine.read(f, back.data(), n, 4096 * 3 + 5);
  EXPECT_EQ(test::first_difference(back.data(), content.data(), n), -1);
}

INSTANTIATE_TEST_SUITE_P(Backends, SubmitModes,
                         ::testing::Combine(::testing::ValuesIn(test::all_backends()), ::testing::Bool(),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(to_string(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_single" : "_batch") +
                                  (std::get<2>(info.param) ? "_overlap" : "_lockstep");
                         });

}  // namespace
}  // namespace strata::nvme
