// A full file system in the middle of a stream of writes: the failing write raises IoError naming the
// file, offset, length and errno text, and every extent written before it reads back intact. "Full" is
// RLIMIT_FSIZE in a forked child (EFBIG past the limit): no loop device, no root.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <cstdio>

#include "nvme/engine.h"
#include "nvme/file.h"
#include "nvme/swap_store.h"
#include "tests/nvme/test_util.h"

namespace strata::nvme {
namespace {

using test::ScratchDir;

constexpr std::uint64_t kLimit = (2 << 20) + 8192;  // page-aligned, so O_DIRECT writes stop short, not EINVAL
constexpr std::size_t kExtent = 300'001;            // odd: every extent has unaligned ends

bool limit_file_size() {
  std::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of death
  rlimit rl{kLimit, kLimit};
  return ::setrlimit(RLIMIT_FSIZE, &rl) == 0;
}

// Checks the failure message and the extents written before it; 0 when all is well.
int verify(const std::string& path, const std::string& error,
           const std::vector<std::vector<std::uint8_t>>& written, const std::vector<std::uint64_t>& offs,
           AioEngine& engine, const File& f) {
  if (error.empty()) {
    std::fprintf(stderr, "no write failed although the file went past the %llu-byte limit\n",
                 (unsigned long long)kLimit);
    return 1;
  }
  for (const char* must : {path.c_str(), "offset", "File too large"})
    if (error.find(must) == std::string::npos) {
      std::fprintf(stderr, "the error does not name '%s': %s\n", must, error.c_str());
      return 1;
    }
  if (written.size() < 3) {
    std::fprintf(stderr, "only %zu extents fit before the failure\n", written.size());
    return 1;
  }
  for (std::size_t i = 0; i < written.size(); ++i) {
    auto oracle = test::oracle_read(path, offs[i], written[i].size());
    std::vector<std::uint8_t> via_engine(written[i].size());
    engine.read(f, via_engine.data(), via_engine.size(), offs[i]);
    if (oracle != written[i] || via_engine != written[i]) {
      std::fprintf(stderr, "extent %zu at %llu was corrupted\n", i, (unsigned long long)offs[i]);
      return 1;
    }
  }
  std::fprintf(stderr, "%zu earlier extents intact; error: %s\n", written.size(), error.c_str());
  return 0;
}

class FullDisk : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override { STRATA_SKIP_IF_UNAVAILABLE(GetParam()); }
  AioOptions opts() const {
    AioOptions o;
    o.backend = GetParam();
    o.block_size = 64 << 10;
    o.queue_depth = 8;
    return o;
  }
};

TEST_P(FullDisk, WriteRaisesIoErrorAndEarlierExtentsReadBackIntact) {
  ScratchDir dir("nvme");
  const std::string path = dir.file("full.bin");
  AioOptions o = opts();
  test::ChildResult r = test::run_in_child([&] {
    if (!limit_file_size()) return test::kChildSkip;
    AioEngine engine(o);
    File f = File::open(path, OpenMode::create);
    std::vector<std::vector<std::uint8_t>> written;
    std::vector<std::uint64_t> offs;
    std::string error;
    for (std::uint64_t i = 0, off = 3; i < 64; ++i, off += kExtent) {
      auto data = test::random_bytes(kExtent, 300 + i);
      try {
        engine.write(f, data.data(), data.size(), off);
      } catch (const IoError& e) {
        error = e.what();
        break;
      }
      written.push_back(std::move(data));
      offs.push_back(off);
    }
    return verify(path, error, written, offs, engine, f);
  });
  if (r.code == test::kChildSkip) GTEST_SKIP() << "setrlimit(RLIMIT_FSIZE) refused: " << r.output;
  EXPECT_EQ(r.code, 0) << r.output;
}

TEST_P(FullDisk, SwapStoreWriteFailsAndEarlierTensorsReadBackIntact) {
  ScratchDir dir("nvme");
  AioOptions o = opts();
  const std::string nvme_path = dir.path();
  test::ChildResult r = test::run_in_child([&] {
    if (!limit_file_size()) return test::kChildSkip;
    AioEngine engine(o);
    SwapStore store(engine, {.nvme_path = nvme_path, .capacity = 0, .grow_bytes = 0, .name = "full"});
    std::vector<std::vector<std::uint8_t>> written;
    std::vector<SwapExtent> extents;
    std::string error;
    for (int i = 0; i < 64; ++i) {
      auto data = test::random_bytes(kExtent, 900 + i);
      SwapExtent e = store.allocate(data.size());
      try {
        store.wait(store.write(e, data.data()));
      } catch (const IoError& err) {
        error = err.what();
        break;
      }
      written.push_back(std::move(data));
      extents.push_back(e);
    }
    if (error.find(store.file_path()) == std::string::npos ||
        error.find("File too large") == std::string::npos) {
      std::fprintf(stderr, "expected an IoError naming %s and EFBIG, got: '%s'\n", store.file_path().c_str(),
                   error.c_str());
      return 1;
    }
    for (std::size_t i = 0; i < extents.size(); ++i) {
      std::vector<std::uint8_t> back(written[i].size());
      store.wait(store.read(extents[i], back.data()));
      if (back != written[i]) {
        std::fprintf(stderr, "tensor %zu was corrupted\n", i);
        return 1;
      }
    }
    std::fprintf(stderr, "%zu earlier tensors intact\n", extents.size());
    return extents.size() >= 3 ? 0 : 1;
  });
  if (r.code == test::kChildSkip) GTEST_SKIP() << "setrlimit(RLIMIT_FSIZE) refused: " << r.output;
  EXPECT_EQ(r.code, 0) << r.output;
}

TEST_P(FullDisk, PreallocatingSwapStoreReportsFullAtAllocateAsOutOfMemory) {
  ScratchDir dir("nvme");
  AioOptions o = opts();
  const std::string nvme_path = dir.path();
  test::ChildResult r = test::run_in_child([&] {
    if (!limit_file_size()) return test::kChildSkip;
    AioEngine engine(o);
    SwapStore store(engine,
                    {.nvme_path = nvme_path, .capacity = 0, .grow_bytes = 1 << 20, .name = "prealloc"});
    std::vector<std::vector<std::uint8_t>> written;
    std::vector<SwapExtent> extents;
    std::string error;
    for (int i = 0; i < 64; ++i) {
      auto data = test::random_bytes(kExtent, 500 + i);
      SwapExtent e;
      try {
        e = store.allocate(data.size());
      } catch (const OutOfMemory& err) {
        error = err.what();
        break;
      }
      store.wait(store.write(e, data.data()));  // preallocated: never fails for want of space
      written.push_back(std::move(data));
      extents.push_back(e);
    }
    if (error.find("File too large") == std::string::npos || error.find(nvme_path) == std::string::npos) {
      std::fprintf(stderr, "expected OutOfMemory naming the path and EFBIG, got: '%s'\n", error.c_str());
      return 1;
    }
    for (std::size_t i = 0; i < extents.size(); ++i) {
      std::vector<std::uint8_t> back(written[i].size());
      store.wait(store.read(extents[i], back.data()));
      if (back != written[i]) return 1;
    }
    return extents.size() >= 3 ? 0 : 1;
  });
  if (r.code == test::kChildSkip) GTEST_SKIP() << "setrlimit(RLIMIT_FSIZE) refused: " << r.output;
  EXPECT_EQ(r.code, 0) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Backends, FullDisk, ::testing::ValuesIn(test::all_backends()),
                         test::backend_param_name);

}  // namespace
}  // namespace strata::nvme
