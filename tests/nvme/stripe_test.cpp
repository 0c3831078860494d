// SwapStore striped over several directories (one per drive; Note [striping] in nvme/swap_store.h):
// the same bytes as a single-directory store for the same operations, each file a third of them, the
// documented layout, one stripe's failure naming its file, and the directory checks, free-space
// refusal, leftovers and clean-up applied to every directory.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <random>

#include "core/files.h"
#include "nvme/extent_allocator.h"
#include "nvme/swap_store.h"
#include "tests/nvme/test_util.h"

namespace strata::nvme {
namespace {

namespace fs = std::filesystem;
using test::ScratchDir;

constexpr std::uint64_t kStripes = 3;

// Each file's room for an extent of `bytes` (Note [striping]).
std::uint64_t share_of(std::uint64_t bytes, std::uint64_t a) {
  return ((bytes + kStripes - 1) / kStripes + a - 1) / a * a;
}

std::uint64_t file_size(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return std::uint64_t(st.st_size);
}

// Three scratch directories, as three drives would be mounted.
struct ThreeDirs {
  ScratchDir a{"nvme"}, b{"nvme-stripe1"}, c{"nvme-stripe2"};
  SwapOptions options(std::uint64_t capacity = 0, std::uint64_t grow_bytes = 4 << 20) const {
    return {.nvme_path = a.path(),
            .stripe_paths = {b.path(), c.path()},
            .capacity = capacity,
            .grow_bytes = grow_bytes};
  }
  std::vector<std::string> paths() const { return {a.path(), b.path(), c.path()}; }
};

class Striped : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override { STRATA_SKIP_IF_UNAVAILABLE(GetParam()); }
  AioOptions opts() const {
    AioOptions o;
    o.backend = GetParam();
    o.block_size = 16 << 10;  // many pieces per stripe
    o.queue_depth = 8;
    o.intra_op_parallelism = 2;
    return o;
  }
};

TEST_P(Striped, ExtentsReadBackWholeAndBySubRangesAsFromASingleDirectoryStore) {
  ThreeDirs dirs;
  ScratchDir single_dir("nvme-single");
  AioEngine engine(opts());
  SwapStore striped(engine, dirs.options());
  SwapStore single(engine, {.nvme_path = single_dir.path(), .grow_bytes = 4 << 20});
  ASSERT_EQ(striped.file_paths().size(), kStripes);
  SwapStore* stores[] = {&striped, &single};
  std::mt19937_64 rng(70);
  auto odd_size = [&] {
    switch (rng() % 4) {
      case 0:
        return std::uint64_t(1 + rng() % 10);  // all in the first stripe
      case 1:
        return std::uint64_t(4096 * (1 + rng() % 20));  // whole pages
      default:
        return std::uint64_t(1 + rng() % 200'000);
    }
  };
  // Each phase submits everything, then waits (no two requests in flight touch the same bytes).
  constexpr int kExtents = 30;
  std::vector<std::vector<std::uint8_t>> model(kExtents);
  std::vector<SwapExtent> ext[2];
  for (int i = 0; i < kExtents; ++i) {
    model[i] = test::random_bytes(odd_size(), 700 + std::uint64_t(i));
    for (int s = 0; s < 2; ++s) {
      ext[s].push_back(stores[s]->allocate(model[i].size()));
      stores[s]->write(ext[s].back(), model[i].data());
    }
  }
  engine.wait_all();
  // Patches at odd places (across stripe boundaries too), one per extent and round.
  std::vector<std::vector<std::uint8_t>> patches;
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < kExtents; ++i) {
      const std::uint64_t off = rng() % model[i].size(), len = 1 + rng() % (model[i].size() - off);
      patches.push_back(test::random_bytes(len, 2000 + patches.size()));
      for (int s = 0; s < 2; ++s) stores[s]->write(ext[s][i], patches.back().data(), len, off);
      std::copy(patches.back().begin(), patches.back().end(), model[i].begin() + long(off));
    }
    engine.wait_all();
  }
  // Some extents replaced by others of other sizes, in the holes the freed ones left.
  for (int i = 0; i < kExtents; i += 4) {
    model[i] = test::random_bytes(odd_size(), 3000 + std::uint64_t(i));
    for (int s = 0; s < 2; ++s) {
      stores[s]->free(ext[s][i]);
      ext[s][i] = stores[s]->allocate(model[i].size());
      stores[s]->write(ext[s][i], model[i].data());
    }
  }
  engine.wait_all();

  std::vector<std::uint8_t> whole[2][kExtents];
  for (int i = 0; i < kExtents; ++i)
    for (int s = 0; s < 2; ++s) {
      whole[s][i].assign(model[i].size(), 0xEE);
      stores[s]->read(ext[s][i], whole[s][i].data());
    }
  engine.wait_all();
  for (int i = 0; i < kExtents; ++i) {
    EXPECT_EQ(test::first_difference(whole[0][i].data(), whole[1][i].data(), model[i].size()), -1)
        << "extent " << i;
    EXPECT_EQ(test::first_difference(whole[0][i].data(), model[i].data(), model[i].size()), -1)
        << "extent " << i;
  }

  struct Range {
    int i;
    std::uint64_t off, len;
  };
  std::vector<Range> ranges;
  std::vector<std::uint8_t> part[2][60];
  for (int j = 0; j < 60; ++j) {
    const int i = int(rng() % kExtents);
    const std::uint64_t off = rng() % model[i].size(), len = 1 + rng() % (model[i].size() - off);
    ranges.push_back({i, off, len});
    for (int s = 0; s < 2; ++s) {
      part[s][j].assign(len + 1, 0xEE);  // read to data() + 1: misaligned memory
      stores[s]->read(ext[s][i], part[s][j].data() + 1, len, off);
    }
  }
  engine.wait_all();
  for (int j = 0; j < 60; ++j) {
    const auto [i, off, len] = ranges[std::size_t(j)];
    EXPECT_EQ(test::first_difference(part[0][j].data() + 1, part[1][j].data() + 1, len), -1)
        << "extent " << i << " at " << off << "+" << len;
    EXPECT_EQ(test::first_difference(part[0][j].data() + 1, model[i].data() + off, len), -1)
        << "extent " << i << " at " << off << "+" << len;
  }
}

TEST_P(Striped, StripeKHoldsItsShareOfTheExtentAtTheExtentsOffsetInFileK) {
  ThreeDirs dirs;
  AioEngine engine(opts());
  SwapStore store(engine, dirs.options());
  const std::uint64_t a = store.alignment();
  for (std::uint64_t bytes : {std::uint64_t(1), a + 1, 3 * a, 3 * a + 2, std::uint64_t(250'001)}) {
    SCOPED_TRACE(bytes);
    SwapExtent e = store.allocate(bytes);
    auto data = test::random_bytes(bytes, bytes);
    store.wait(store.write(e, data.data()));
    const std::uint64_t share = share_of(bytes, a);
    for (std::uint64_t k = 0; k < kStripes && k * share < bytes; ++k) {
      const std::uint64_t len = std::min(bytes, (k + 1) * share) - k * share;
      auto got = test::oracle_read(store.file_paths()[k], e.offset, len);
      EXPECT_EQ(test::first_difference(got.data(), data.data() + k * share, len), -1) << "stripe " << k;
    }
  }
}

TEST_P(Striped, EachFileHoldsAThirdOfTheBytes) {
  ThreeDirs dirs;
  AioEngine engine(opts());
  SwapStore store(engine, dirs.options(0, /*grow_bytes=*/0));  // the files are as long as what was written
  std::mt19937_64 rng(71);
  std::uint64_t written = 0;
  const int extents = 20;
  for (int i = 0; i < extents; ++i) {
    auto data = test::random_bytes(50'000 + rng() % 250'000, 800 + std::uint64_t(i));
    SwapExtent e = store.allocate(data.size());
    store.wait(store.write(e, data.data()));
    written += data.size();
  }
  const std::uint64_t a = store.alignment();
  std::vector<std::uint64_t> sizes;
  for (const std::string& p : store.file_paths()) sizes.push_back(file_size(p));
  const auto [lo, hi] = std::minmax_element(sizes.begin(), sizes.end());
  EXPECT_LE(*hi - *lo, kStripes * a) << "file sizes " << sizes[0] << ", " << sizes[1] << ", " << sizes[2];
  for (std::uint64_t s : sizes) {
    EXPECT_GE(s + kStripes * a, written / kStripes) << s << " of " << written;
    EXPECT_LE(s, written / kStripes + extents * a) << s << " of " << written;
  }
}

TEST_P(Striped, AFailedWriteOnOneStripeRaisesIoErrorNamingThatStripesFile) {
  ThreeDirs dirs;
  const SwapOptions so = dirs.options(0, /*grow_bytes=*/0);
  const AioOptions o = opts();
  constexpr std::uint64_t kLimit = (1 << 20) + 8192;  // page-aligned: O_DIRECT stops short, not EINVAL
  test::ChildResult r = test::run_in_child([&] {
    std::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of death
    rlimit rl{kLimit, kLimit};
    if (::setrlimit(RLIMIT_FSIZE, &rl) != 0) return test::kChildSkip;
    AioEngine engine(o);
    SwapStore store(engine, so);
    SwapExtent before = store.allocate(300'001);
    auto data = test::random_bytes(300'001, 90);
    store.wait(store.write(before, data.data()));
    store.allocate(kStripes * kLimit);  // never written: moves the next extent past the limit
    SwapExtent past = store.allocate(300'001);
    const std::uint64_t share = share_of(300'001, store.alignment());
    std::string error;
    try {
      store.wait(store.write(past, data.data(), 1000, share + 5));  // inside stripe 1 only
    } catch (const IoError& e) {
      error = e.what();
    }
    const auto& files = store.file_paths();
    if (error.find(files[1]) == std::string::npos || error.find("File too large") == std::string::npos ||
        error.find(files[0]) != std::string::npos || error.find(files[2]) != std::string::npos) {
      std::fprintf(stderr, "expected an IoError naming only %s and EFBIG, got: '%s'\n", files[1].c_str(),
                   error.c_str());
      return 1;
    }
    std::vector<std::uint8_t> back(data.size());
    store.wait(store.read(before, back.data()));
    if (back != data) {
      std::fprintf(stderr, "the extent written before the failure was corrupted\n");
      return 1;
    }
    return 0;
  });
  if (r.code == test::kChildSkip) GTEST_SKIP() << "setrlimit(RLIMIT_FSIZE) refused: " << r.output;
  EXPECT_EQ(r.code, 0) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Backends, Striped, ::testing::ValuesIn(test::all_backends()),
                         test::backend_param_name);

TEST(StripedStore, OneDirectoryIsTheUnstripedLayout) {
  ScratchDir dir("nvme");
  AioEngine engine;
  SwapStore store(engine, {.nvme_path = dir.path(), .capacity = 8 << 20});
  ASSERT_EQ(store.file_paths().size(), 1u);
  EXPECT_EQ(store.file_paths()[0], store.file_path());
  EXPECT_EQ(fs::path(store.file_path()).parent_path(), fs::path(store.run_dir()));
  ExtentAllocator reference(store.alignment(), 8 << 20);
  for (std::uint64_t bytes :
       {std::uint64_t(1), std::uint64_t(5000), std::uint64_t(123'457), std::uint64_t(4096)}) {
    SwapExtent e = store.allocate(bytes);
    EXPECT_EQ(e.offset, *reference.allocate(bytes)) << bytes;
    auto data = test::random_bytes(bytes, bytes);
    store.wait(store.write(e, data.data()));
    EXPECT_EQ(test::oracle_read(store.file_path(), e.offset, bytes), data) << bytes;
  }
  EXPECT_EQ(store.stats().capacity_bytes, 8u << 20);
  EXPECT_EQ(store.stats().reserved_bytes, reference.stats().reserved_bytes.current);
}

TEST(StripedStore, CapacityIsTheTotalOverTheDrives) {
  ThreeDirs dirs;
  AioEngine engine;
  const std::uint64_t capacity = 3 << 20;
  SwapStore store(engine, dirs.options(capacity));
  const std::uint64_t a = store.alignment();
  EXPECT_EQ(store.stats().capacity_bytes, kStripes * (capacity / kStripes + a));
  SwapExtent whole = store.allocate(capacity);  // one extent of the whole capacity fits
  EXPECT_EQ(store.stats().reserved_bytes, capacity);
  EXPECT_THROW(store.allocate(kStripes * a + 1), OutOfMemory);  // one unit more in each file than is left
  SwapExtent last = store.allocate(kStripes * a);
  EXPECT_EQ(last.offset, capacity / kStripes);
  EXPECT_EQ(store.stats().free_bytes, 0u);
  store.free(whole);
  store.free(last);
}

TEST(StripedStore, PreallocationGrowsEveryFileAlike) {
  ThreeDirs dirs;
  AioEngine engine;
  SwapStore store(engine, dirs.options(0, /*grow_bytes=*/1 << 20));
  store.allocate(5'000'000);  // 1.6 MB in each file: more than one step
  if (file_size(store.file_path()) == 0) GTEST_SKIP() << "the scratch file system cannot preallocate";
  const std::uint64_t each = store.stats().file_bytes;
  EXPECT_GE(each, 5'000'000 / kStripes);
  for (const std::string& p : store.file_paths()) EXPECT_EQ(file_size(p), each) << p;
}

TEST(StripedStore, CapacityBeyondTheFreeSpaceIsRefusedNamingTheDirectoriesOnThatFileSystem) {
  ThreeDirs dirs;
  AioEngine engine;
  const std::uint64_t huge = std::uint64_t(1) << 60;
  try {
    SwapStore store(engine, dirs.options(huge));
    FAIL() << "no error";
  } catch (const OutOfMemory& e) {
    std::string m = e.what();
    for (const std::string& d : dirs.paths()) EXPECT_NE(m.find(d), std::string::npos) << m;
    EXPECT_NE(m.find(format_bytes(huge)), std::string::npos) << m;
    EXPECT_NE(m.find("one file system"), std::string::npos) << m;
    EXPECT_NE(m.find("nvme_path"), std::string::npos) << m;
  }
  for (const std::string& d : dirs.paths()) EXPECT_TRUE(fs::is_empty(d)) << "nothing may be left in " << d;
}

// Needs two file systems with clearly different free space: the scratch area and /dev/shm.
TEST(StripedStore, CapacityBeyondOneDrivesFreeSpaceIsRefusedNamingThatDrive) {
  ScratchDir disk("nvme");
  const fs::path shm_dir = fs::path("/dev/shm") / ("strata-stripe-test." + std::to_string(::getpid()));
  std::error_code ec;
  if (!fs::create_directory(shm_dir, ec) || ec) GTEST_SKIP() << "no /dev/shm to put a second drive on";
  struct Remove {
    fs::path p;
    ~Remove() {
      std::error_code e;
      fs::remove_all(p, e);
    }
  } remove{shm_dir};
  struct stat a {
  }, b{};
  ASSERT_EQ(::stat(disk.path().c_str(), &a), 0);
  ASSERT_EQ(::stat(shm_dir.c_str(), &b), 0);
  if (a.st_dev == b.st_dev) GTEST_SKIP() << "/dev/shm is on the scratch area's file system";
  const std::uint64_t free_disk = free_disk_bytes(disk.path()).value_or(0),
                      free_shm = free_disk_bytes(shm_dir.string()).value_or(0);
  const std::uint64_t lo = std::min(free_disk, free_shm), hi = std::max(free_disk, free_shm);
  if (hi - lo < (std::uint64_t(2) << 30))
    GTEST_SKIP() << "the two file systems' free space is too close to tell apart (" << lo << ", " << hi
                 << ")";
  const std::string short_dir = free_disk < free_shm ? disk.path() : shm_dir.string();
  const std::string roomy_dir = free_disk < free_shm ? shm_dir.string() : disk.path();
  const std::uint64_t share = lo + (hi - lo) / 2;  // more than one has, less than the other
  AioEngine engine;
  try {
    SwapStore store(engine,
                    {.nvme_path = disk.path(), .stripe_paths = {shm_dir.string()}, .capacity = 2 * share});
    FAIL() << "no error";
  } catch (const OutOfMemory& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(short_dir + " has only"), std::string::npos) << m;
    EXPECT_EQ(m.find(roomy_dir + " has only"), std::string::npos) << m;
  }
}

TEST(StripedStore, ADirectoryListedTwiceIsRefusedNamingIt) {
  ThreeDirs dirs;
  AioEngine engine;
  for (const std::string& again : {dirs.a.path(), dirs.a.path() + "/."}) {
    try {
      SwapStore store(engine, {.nvme_path = dirs.a.path(), .stripe_paths = {dirs.b.path(), again}});
      FAIL() << "no error for " << again;
    } catch (const ConfigError& e) {
      std::string m = e.what();
      EXPECT_NE(m.find(again), std::string::npos) << m;
      EXPECT_NE(m.find("twice"), std::string::npos) << m;
    }
  }
  for (const std::string& d : dirs.paths()) EXPECT_TRUE(fs::is_empty(d)) << "nothing may be left in " << d;
}

TEST(StripedStore, AMissingStripeDirectoryIsRefusedNamingIt) {
  ThreeDirs dirs;
  AioEngine engine;
  const std::string missing = dirs.c.file("no/such/dir");
  try {
    SwapStore store(engine, {.nvme_path = dirs.a.path(), .stripe_paths = {dirs.b.path(), missing}});
    FAIL() << "no error";
  } catch (const IoError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(missing), std::string::npos) << m;
    EXPECT_NE(m.find("nvme_path"), std::string::npos) << m;
  }
  for (const std::string& d : dirs.paths()) EXPECT_TRUE(fs::is_empty(d)) << "nothing may be left in " << d;
}

TEST(StripedStore, EveryRunDirectoryIsRemovedWithTheStore) {
  ThreeDirs dirs;
  AioEngine engine;
  std::vector<std::string> files;
  const auto d = test::random_bytes(100'000, 5);
  {
    SwapStore store(engine, dirs.options());
    files = store.file_paths();
    for (std::size_t k = 0; k < files.size(); ++k)
      EXPECT_EQ(fs::path(files[k]).parent_path().parent_path(), fs::path(dirs.paths()[k]));
    store.write(store.allocate(d.size()), d.data());  // left pending: the destructor waits for it
  }
  for (const std::string& f : files) EXPECT_FALSE(fs::exists(fs::path(f).parent_path())) << f;
  engine.wait_all();
}

TEST(StripedStore, LeftoversOfACrashedRunAreRemovedFromEveryDirectory) {
  ThreeDirs dirs;
  const SwapOptions so = dirs.options();
  test::ChildResult crashed = test::run_in_child([&] {
    AioEngine engine;
    auto* store = new SwapStore(engine, so);
    SwapExtent e = store->allocate(100'000);
    auto d = test::random_bytes(100'000, 6);
    store->wait(store->write(e, d.data()));
    for (const std::string& f : store->file_paths())
      std::fprintf(stderr, "run_dir=%s\n", fs::path(f).parent_path().c_str());
    std::fflush(stderr);
    ::_exit(0);  // no destructors: as after kill -9
    return 0;
  });
  ASSERT_EQ(crashed.code, 0) << crashed.output;
  std::vector<std::string> leftovers;
  for (std::size_t at = crashed.output.find("run_dir="); at != std::string::npos;
       at = crashed.output.find("run_dir=", at + 1))
    leftovers.push_back(crashed.output.substr(at + 8, crashed.output.find('\n', at) - at - 8));
  ASSERT_EQ(leftovers.size(), kStripes) << crashed.output;
  for (const std::string& l : leftovers) ASSERT_TRUE(fs::is_directory(l)) << l;

  AioEngine engine;
  ::testing::internal::CaptureStderr();
  SwapStore live(engine, so);
  std::string log = ::testing::internal::GetCapturedStderr();
  for (const std::string& l : leftovers) {
    EXPECT_FALSE(fs::exists(l)) << l;
    EXPECT_NE(log.find(l), std::string::npos) << "not reported: " << l << "\n" << log;
  }
  for (const std::string& f : live.file_paths()) EXPECT_TRUE(fs::exists(f)) << f;
}

}  // namespace
}  // namespace strata::nvme
