// Many requests outstanding at once: every one completes with its own bytes, in whatever order the
// caller collects them.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <thread>

#include "nvme/engine.h"
#include "nvme/file.h"
#include "tests/nvme/test_util.h"

namespace strata::nvme {
namespace {

using test::ScratchDir;

class InFlight : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override { STRATA_SKIP_IF_UNAVAILABLE(GetParam()); }
  AioOptions opts(int threads) const {
    AioOptions o;
    o.backend = GetParam();
    o.block_size = 16 << 10;
    o.queue_depth = 32;
    o.intra_op_parallelism = threads;
    return o;
  }
};

TEST_P(InFlight, FiveHundredRequestsSubmittedBeforeAnyWaitAllLandAndReadBack) {
  ScratchDir dir("nvme");
  AioEngine engine(opts(2));
  File f = File::open(dir.file("many.bin"), OpenMode::create);
  constexpr int kRequests = 512;
  std::mt19937_64 rng(3);
  std::vector<std::uint64_t> offs;
  std::vector<std::vector<std::uint8_t>> data;
  std::uint64_t at = 0;
  for (int i = 0; i < kRequests; ++i) {
    std::size_t len = 1 + rng() % 40'000;
    offs.push_back(at);
    data.push_back(test::random_bytes(len, 1000 + i));
    at += len + rng() % 3;  // packed tight: neighbours share pages
  }
  std::vector<IoHandle> hs;
  for (int i = 0; i < kRequests; ++i)
    hs.push_back(engine.submit_write(f, data[i].data(), data[i].size(), offs[i]));
  EXPECT_GT(engine.stats().pending, 0u);
  std::vector<int> order(kRequests);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  for (int i : order) engine.wait(hs[i]);

  std::vector<std::vector<std::uint8_t>> back;
  hs.clear();
  for (int i = 0; i < kRequests; ++i) back.emplace_back(data[i].size());
  for (int i = 0; i < kRequests; ++i)
    hs.push_back(engine.submit_read(f, back[i].data(), back[i].size(), offs[i]));
  // Collect by polling, in submission order, as a scheduler that overlaps I/O with work would.
  std::size_t done = 0;
  std::vector<bool> collected(kRequests, false);
  while (done < hs.size()) {
    for (int i = 0; i < kRequests; ++i) {
      if (!collected[i] && engine.poll(hs[i])) {
        engine.wait(hs[i]);
        collected[i] = true;
        ++done;
      }
    }
    std::this_thread::yield();
  }
  for (int i = 0; i < kRequests; ++i)
    ASSERT_EQ(test::first_difference(back[i].data(), data[i].data(), data[i].size()), -1) << "request " << i;
  EXPECT_EQ(engine.stats().pending, 0u);
  EXPECT_EQ(engine.stats().failed_requests, 0u);
}

TEST_P(InFlight, WaitAllCollectsEveryPendingRequestAndHandlesThenBecomeUnknown) {
  ScratchDir dir("nvme");
  AioEngine engine(opts(1));
  File f = File::open(dir.file("all.bin"), OpenMode::create);
  auto content = test::random_bytes(300 * 4096, 5);
  std::vector<IoHandle> hs;
  for (int i = 0; i < 300; ++i)
    hs.push_back(engine.submit_write(f, content.data() + i * 4096, 4096, i * 4096));
  engine.wait_all();
  EXPECT_EQ(engine.stats().pending, 0u);
  EXPECT_THROW(engine.wait(hs[17]), Error);
  auto back = test::oracle_read(dir.file("all.bin"), 0, content.size());
  EXPECT_EQ(test::first_difference(back.data(), content.data(), content.size()), -1);
}

TEST_P(InFlight, SubmittersOnSeveralThreadsShareOneEngine) {
  ScratchDir dir("nvme");
  AioEngine engine(opts(2));
  File f = File::open(dir.file("shared.bin"), OpenMode::create);
  constexpr int kThreads = 4, kEach = 64, kLen = 5000;
  std::vector<std::vector<std::uint8_t>> data(kThreads * kEach);
  for (int i = 0; i < kThreads * kEach; ++i) data[i] = test::random_bytes(kLen, 77 + i);
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      std::vector<IoHandle> hs;
      for (int k = 0; k < kEach; ++k) {
        int i = t * kEach + k;
        hs.push_back(engine.submit_write(f, data[i].data(), kLen, std::uint64_t(i) * kLen));
      }
      for (IoHandle h : hs) engine.wait(h);
    });
  for (auto& t : ts) t.join();
  for (int i = 0; i < kThreads * kEach; ++i) {
    auto back = test::oracle_read(dir.file("shared.bin"), std::uint64_t(i) * kLen, kLen);
    ASSERT_EQ(test::first_difference(back.data(), data[i].data(), kLen), -1) << "request " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, InFlight, ::testing::ValuesIn(test::all_backends()),
                         test::backend_param_name);

}  // namespace
}  // namespace strata::nvme
