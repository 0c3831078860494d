// SwapStore: tensors of any size by handle, extent reuse, the per-run directory and leftovers of
// crashed runs, and the capacity checks.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "nvme/swap_store.h"
#include "tests/nvme/test_util.h"

namespace strata::nvme {
namespace {

namespace fs = std::filesystem;
using test::ScratchDir;

// The run directory a crashed child printed as "run_dir=<path>".
std::string run_dir_of(const std::string& output) {
  std::size_t at = output.find("run_dir=");
  if (at == std::string::npos) return "";
  at += 8;
  return output.substr(at, output.find('\n', at) - at);
}

class Swap : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override { STRATA_SKIP_IF_UNAVAILABLE(GetParam()); }
  AioOptions opts() const {
    AioOptions o;
    o.backend = GetParam();
    o.block_size = 64 << 10;
    o.queue_depth = 16;
    return o;
  }
};

TEST_P(Swap, TensorsOfOddSizesRoundTripByHandleWhileOthersAreFreedAndReplaced) {
  ScratchDir dir("nvme");
  AioEngine engine(opts());
  SwapStore store(engine, {.nvme_path = dir.path(), .capacity = 64 << 20, .grow_bytes = 4 << 20});
  std::mt19937_64 rng(8);
  std::vector<SwapExtent> ext;
  std::vector<std::vector<std::uint8_t>> data;
  std::vector<IoHandle> hs;
  for (int i = 0; i < 40; ++i) {
    data.push_back(test::random_bytes(1 + rng() % 200'000, 40 + i));
    ext.push_back(store.allocate(data.back().size()));
    EXPECT_EQ(ext.back().offset % store.alignment(), 0u);
    hs.push_back(store.write(ext.back(), data.back().data()));
  }
  for (IoHandle h : hs) store.wait(h);
  // Free every other tensor and put new ones of other sizes in their place.
  for (int i = 0; i < 40; i += 2) {
    store.free(ext[i]);
    data[i] = test::random_bytes(1 + rng() % 150'000, 400 + i);
    ext[i] = store.allocate(data[i].size());
    store.wait(store.write(ext[i], data[i].data()));
  }
  EXPECT_GT(store.stats().reused, 0u);
  std::vector<std::vector<std::uint8_t>> back(40);
  hs.clear();
  for (int i = 0; i < 40; ++i) {
    back[i].assign(data[i].size(), 0);
    hs.push_back(store.read(ext[i], back[i].data()));
  }
  for (IoHandle h : hs) store.wait(h);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(back[i], data[i]) << "tensor " << i;
}

TEST_P(Swap, PartialReadsAndWritesStayInsideTheExtent) {
  ScratchDir dir("nvme");
  AioEngine engine(opts());
  SwapStore store(engine, {.nvme_path = dir.path()});
  SwapExtent a = store.allocate(10'000), b = store.allocate(10'000);
  auto fa = test::random_bytes(10'000, 1), fb = test::random_bytes(10'000, 2),
       patch = test::random_bytes(333, 3);
  store.wait(store.write(a, fa.data()));
  store.wait(store.write(b, fb.data()));
  store.wait(store.write(a, patch.data(), patch.size(), 9'667));  // the last 333 bytes of a
  std::copy(patch.begin(), patch.end(), fa.begin() + 9'667);
  std::vector<std::uint8_t> ra(10'000), rb(10'000);
  store.wait(store.read(a, ra.data()));
  store.wait(store.read(b, rb.data()));
  EXPECT_EQ(ra, fa);
  EXPECT_EQ(rb, fb);
  EXPECT_THROW(store.write(a, patch.data(), patch.size(), 9'668), Error);
  EXPECT_THROW(store.read(a, ra.data(), 10'001), Error);
}

INSTANTIATE_TEST_SUITE_P(Backends, Swap, ::testing::ValuesIn(test::all_backends()), test::backend_param_name);

TEST(SwapStore, SameSizedShardsReuseTheirHolesAndTheFileStopsGrowing) {
  ScratchDir dir("nvme");
  AioEngine engine;
  SwapStore store(engine, {.nvme_path = dir.path(), .grow_bytes = 1 << 20});
  const std::uint64_t shard = 3 * 4096 + 100;
  std::vector<SwapExtent> step;
  for (int i = 0; i < 32; ++i) step.push_back(store.allocate(shard));
  const std::uint64_t file_after_first_step = store.stats().file_bytes;
  for (int s = 0; s < 5; ++s) {  // optimizer steps: each shard freed and allocated again
    for (int i = 0; i < 32; i += 3) store.free(step[i]);
    for (int i = 0; i < 32; i += 3) step[i] = store.allocate(shard);
  }
  SwapStats st = store.stats();
  EXPECT_EQ(st.file_bytes, file_after_first_step);
  EXPECT_EQ(st.extents.current, 32u);
  EXPECT_EQ(st.bytes.current, 32 * shard);
  EXPECT_EQ(st.hole_bytes, 0u);
  EXPECT_DOUBLE_EQ(st.fragmentation, 0.0);
  EXPECT_GE(st.reused, 5u * 11u);
}

TEST(SwapStore, FragmentationIsReportedWhenHolesSplinter) {
  ScratchDir dir("nvme");
  AioEngine engine;
  SwapStore store(engine, {.nvme_path = dir.path(), .grow_bytes = 0});
  std::vector<SwapExtent> e;
  for (int i = 0; i < 8; ++i) e.push_back(store.allocate(4096));
  store.free(e[1]);
  store.free(e[3]);
  store.free(e[4]);
  SwapStats st = store.stats();
  EXPECT_EQ(st.hole_bytes, 3u * 4096);
  EXPECT_EQ(st.largest_hole_bytes, 2u * 4096);
  EXPECT_NEAR(st.fragmentation, 1.0 / 3.0, 1e-9);
}

TEST(SwapStore, RunDirectoryExistsWhileTheStoreLivesAndIsRemovedAfter) {
  ScratchDir dir("nvme");
  AioEngine engine;
  std::string run;
  // The source outlives the store, whose destructor waits for the write still reading it.
  const auto d = test::random_bytes(5000, 4);
  {
    SwapStore store(engine, {.nvme_path = dir.path()});
    run = store.run_dir();
    EXPECT_TRUE(fs::is_directory(run));
    EXPECT_EQ(fs::path(run).parent_path(), fs::path(dir.path()));
    SwapExtent e = store.allocate(5000);
    store.write(e, d.data());  // left pending on purpose: the destructor must wait for it
  }
  EXPECT_FALSE(fs::exists(run));
  engine.wait_all();
}

TEST(SwapStore, LeftoversOfACrashedRunAreReportedAndRemovedButLiveOnesAreKept) {
  ScratchDir dir("nvme");
  // A run that dies without cleaning up: the child writes a tensor and exits skipping destructors.
  test::ChildResult crashed = test::run_in_child([&] {
    AioEngine engine;
    auto* store = new SwapStore(engine, {.nvme_path = dir.path()});
    SwapExtent e = store->allocate(100'000);
    auto d = test::random_bytes(100'000, 5);
    store->wait(store->write(e, d.data()));
    std::fprintf(stderr, "run_dir=%s\n", store->run_dir().c_str());
    std::fflush(stderr);
    ::_exit(0);  // no destructors: as after kill -9
    return 0;
  });
  ASSERT_EQ(crashed.code, 0) << crashed.output;
  std::string leftover = run_dir_of(crashed.output);
  ASSERT_TRUE(fs::is_directory(leftover)) << crashed.output;

  AioEngine engine;
  ::testing::internal::CaptureStderr();
  SwapStore live(engine, {.nvme_path = dir.path()});
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(fs::exists(leftover)) << "the next store under the same nvme_path must remove it";
  EXPECT_NE(log.find(leftover), std::string::npos) << "and say so: " << log;
  // Stores that are alive are not leftovers, whoever looks.
  SwapStore second(engine, {.nvme_path = dir.path()});
  LeftoverReport again = SwapStore::remove_leftovers(dir.path());
  EXPECT_TRUE(again.dirs.empty());
  EXPECT_TRUE(fs::is_directory(live.run_dir()));
  EXPECT_TRUE(fs::is_directory(second.run_dir()));
}

TEST(SwapStore, LeftoverReportNamesTheDirectoryAndItsSize) {
  ScratchDir dir("nvme");
  test::ChildResult crashed = test::run_in_child([&] {
    AioEngine engine;
    auto* store = new SwapStore(engine, {.nvme_path = dir.path(), .grow_bytes = 0});
    SwapExtent e = store->allocate(40'000);
    auto d = test::random_bytes(40'000, 6);
    store->wait(store->write(e, d.data()));
    std::fprintf(stderr, "run_dir=%s\n", store->run_dir().c_str());
    std::fflush(stderr);
    ::_exit(0);
    return 0;
  });
  ASSERT_EQ(crashed.code, 0) << crashed.output;
  std::string leftover = run_dir_of(crashed.output);
  ::testing::internal::CaptureStderr();
  LeftoverReport r = SwapStore::remove_leftovers(dir.path());
  std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(r.dirs.size(), 1u);
  EXPECT_EQ(r.dirs[0], leftover);
  EXPECT_GE(r.bytes, 40'000u);
  EXPECT_NE(log.find(leftover), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(leftover));
}

TEST(SwapStore, CapacityBeyondTheFreeSpaceIsRefusedUpFrontNamingPathAndSizes) {
  ScratchDir dir("nvme");
  AioEngine engine;
  const std::uint64_t huge = std::uint64_t(1) << 60;
  try {
    SwapStore store(engine, {.nvme_path = dir.path(), .capacity = huge});
    FAIL() << "no error";
  } catch (const OutOfMemory& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(dir.path()), std::string::npos) << m;
    EXPECT_NE(m.find(format_bytes(huge)), std::string::npos) << m;
    EXPECT_NE(m.find("nvme_path"), std::string::npos) << m;
  }
  EXPECT_TRUE(fs::is_empty(dir.path())) << "nothing may be left behind";
}

TEST(SwapStore, AllocationsBeyondTheCapacityRaiseOutOfMemoryWithTheStoreState) {
  ScratchDir dir("nvme");
  AioEngine engine;
  SwapStore store(engine, {.nvme_path = dir.path(), .capacity = 1 << 20});
  SwapExtent a = store.allocate(600'000);
  try {
    store.allocate(600'000);
    FAIL() << "no error";
  } catch (const OutOfMemory& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("capacity"), std::string::npos) << m;
    EXPECT_NE(m.find("1 extents"), std::string::npos) << m;
  }
  store.free(a);
  const SwapExtent whole = store.allocate(1 << 20);  // the freed room is whole again
  EXPECT_TRUE(whole);
  EXPECT_EQ(whole.offset, 0u);
  EXPECT_EQ(whole.bytes, 1u << 20);
  EXPECT_EQ(store.stats().reserved_bytes, 1u << 20);
}

TEST(SwapStore, FreeingTwiceOrUsingAFreedExtentIsRejected) {
  ScratchDir dir("nvme");
  AioEngine engine;
  SwapStore store(engine, {.nvme_path = dir.path()});
  SwapExtent e = store.allocate(100);
  store.free(e);
  EXPECT_THROW(store.free(e), Error);
  std::vector<std::uint8_t> buf(100);
  EXPECT_THROW(store.read(e, buf.data()), Error);
}

}  // namespace
}  // namespace strata::nvme
