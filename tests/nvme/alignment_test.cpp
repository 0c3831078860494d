// O_DIRECT alignment: queried from the file system, unaligned ranges never disturb neighbouring bytes,
// misaligned memory goes through bounce buffers, refused O_DIRECT falls back with one warning.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>

#include "nvme/engine.h"
#include "nvme/file.h"
#include "nvme/file_impl.h"
#include "tests/nvme/test_util.h"

namespace strata::nvme {
namespace {

using test::ScratchDir;

class Alignment : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override { STRATA_SKIP_IF_UNAVAILABLE(GetParam()); }
  AioOptions opts() const {
    AioOptions o;
    o.backend = GetParam();
    o.block_size = 8192;
    o.queue_depth = 4;
    return o;
  }
};

TEST_P(Alignment, UnalignedWritesLeaveNeighbouringBytesUntouched) {
  ScratchDir dir("nvme");
  const std::string path = dir.file("n.bin");
  const std::size_t n = 64 << 10;
  auto before = test::random_bytes(n, 21);
  test::oracle_write(path, before.data(), n, 0);
  AioEngine engine(opts());
  File f = File::open(path, OpenMode::read_write);
  // Within one page, across a page boundary, and page-aligned start with an odd length.
  struct {
    std::uint64_t off;
    std::size_t len;
  } cases[] = {{1, 7}, {4000, 200}, {8192, 12289}, {511, 513}, {40000, 20000}};
  std::vector<std::uint8_t> expect = before;
  std::uint64_t seed = 50;
  for (auto c : cases) {
    auto patch = test::random_bytes(c.len, seed++);
    engine.write(f, patch.data(), c.len, c.off);
    std::copy(patch.begin(), patch.end(), expect.begin() + long(c.off));
  }
  auto after = test::oracle_read(path, 0, n);
  EXPECT_EQ(test::first_difference(after.data(), expect.data(), n), -1);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(std::size_t(st.st_size), n) << "an unaligned write must not grow the file";
}

TEST_P(Alignment, MisalignedMemoryRoundTripsThroughBounceBuffers) {
  ScratchDir dir("nvme");
  AioEngine engine(opts());
  File f = File::open(dir.file("b.bin"), OpenMode::create);
  if (!f.direct())
    GTEST_SKIP() << "O_DIRECT is not in effect on " << dir.path() << ": no alignment to violate";
  const std::size_t n = 100'000;
  std::vector<std::uint8_t> src_store(n + 64), dst_store(n + 64);
  std::uint8_t* src = src_store.data() + 1;  // deliberately off any dio_mem_align
  std::uint8_t* dst = dst_store.data() + 3;
  auto content = test::random_bytes(n, 31);
  std::copy(content.begin(), content.end(), src);
  engine.write(f, src, n, 0);
  engine.read(f, dst, n, 0);
  EXPECT_EQ(test::first_difference(dst, content.data(), n), -1);
  EXPECT_GT(engine.stats().bounce_pieces, 0u);
}

TEST_P(Alignment, AlignedMemoryGoesDirectWithoutBounceBuffers) {
  ScratchDir dir("nvme");
  AioEngine engine(opts());
  File f = File::open(dir.file("a.bin"), OpenMode::create);
  if (!f.direct()) GTEST_SKIP() << "O_DIRECT is not in effect on " << dir.path();
  const std::size_t n = 256 << 10;
  void* p = nullptr;
  ASSERT_EQ(posix_memalign(&p, 4096, n), 0);
  auto content = test::random_bytes(n, 41);
  std::memcpy(p, content.data(), n);
  engine.write(f, p, n, 0);
  std::memset(p, 0, n);
  engine.read(f, p, n, 0);
  EXPECT_EQ(test::first_difference(static_cast<std::uint8_t*>(p), content.data(), n), -1);
  IoStats s = engine.stats();
  EXPECT_EQ(s.bounce_pieces, 0u);
  EXPECT_EQ(s.direct_pieces, s.pieces);
  std::free(p);
}

TEST_P(Alignment, FixedBuffersCarryTheDataWhereTheBackendHasThem) {
  ScratchDir dir("nvme");
  AioEngine engine(opts());
  if (!engine.caps().fixed_buffers) GTEST_SKIP() << to_string(GetParam()) << " has no fixed buffers";
  File f = File::open(dir.file("fx.bin"), OpenMode::create);
  const std::size_t n = 512 << 10;
  void* pool = nullptr;
  ASSERT_EQ(posix_memalign(&pool, 4096, n), 0);
  if (!engine.register_buffers(pool, n)) {
    std::free(pool);
    GTEST_SKIP() << "the kernel refused to pin " << n << " bytes (RLIMIT_MEMLOCK)";
  }
  auto content = test::random_bytes(n, 51);
  std::memcpy(pool, content.data(), n);
  engine.write(f, pool, n, 0);
  std::memset(pool, 0, n);
  engine.read(f, pool, n, 0);
  EXPECT_EQ(test::first_difference(static_cast<std::uint8_t*>(pool), content.data(), n), -1);
  EXPECT_GT(engine.stats().fixed_pieces, 0u);
  engine.unregister_buffers(pool);
  std::free(pool);
}

INSTANTIATE_TEST_SUITE_P(Backends, Alignment, ::testing::ValuesIn(test::all_backends()),
                         test::backend_param_name);

TEST(DirectIo, AlignmentIsWhatStatxReports) {
  ScratchDir dir("nvme");
  File f = File::open(dir.file("q.bin"), OpenMode::create);
  if (!f.direct()) GTEST_SKIP() << "O_DIRECT is not in effect on " << dir.path();
  struct statx sx {};
  ASSERT_EQ(::statx(AT_FDCWD, f.path().c_str(), 0, STATX_DIOALIGN, &sx), 0);
  if (!(sx.stx_mask & STATX_DIOALIGN))
    GTEST_SKIP() << "this kernel or file system does not report STATX_DIOALIGN";
  EXPECT_EQ(f.offset_align(), sx.stx_dio_offset_align);
  EXPECT_EQ(f.mem_align(), sx.stx_dio_mem_align);
  EXPECT_EQ(f.page_align() % f.offset_align(), 0u);
}

int refuse_direct(const char*, int, mode_t) {
  errno = EINVAL;
  return -1;
}

TEST(DirectIo, RefusedDirectFallsBackToBufferedWithOneWarningNamingThePath) {
  ScratchDir dir("nvme");
  detail::OpenFn previous = detail::exchange_direct_open(&refuse_direct);
  ::testing::internal::CaptureStderr();
  File a = File::open(dir.file("one.bin"), OpenMode::create);
  File b = File::open(dir.file("two.bin"), OpenMode::create);
  std::string err = ::testing::internal::GetCapturedStderr();
  detail::exchange_direct_open(previous);

  EXPECT_FALSE(a.direct());
  EXPECT_FALSE(b.direct());
  std::size_t first = err.find("O_DIRECT refused");
  ASSERT_NE(first, std::string::npos) << err;
  EXPECT_EQ(err.find("O_DIRECT refused", first + 1), std::string::npos) << "warned more than once: " << err;
  EXPECT_NE(err.find(dir.file("one.bin")), std::string::npos) << err;

  AioEngine engine;
  auto content = test::random_bytes(70'001, 61);
  engine.write(a, content.data(), content.size(), 3);
  auto back = test::oracle_read(a.path(), 3, content.size());
  EXPECT_EQ(test::first_difference(back.data(), content.data(), content.size()), -1);
  EXPECT_EQ(engine.stats().direct_pieces, 0u);
}

TEST(DirectIo, TmpfsThatRefusesDirectFallsBackToBuffered) {
  const char* shm = "/dev/shm";
  std::string probe = std::string(shm) + "/strata-odirect-probe-" + std::to_string(::getpid());
  int fd = ::open(probe.c_str(), O_CREAT | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  int err = errno;
  if (fd >= 0) {
    ::close(fd);
    ::unlink(probe.c_str());
    GTEST_SKIP() << shm
                 << " accepts O_DIRECT on this kernel (tmpfs does since Linux 6.6); the injected refusal "
                 << "test covers the fallback";
  }
  if (err != EINVAL) GTEST_SKIP() << shm << " is not usable here: " << std::strerror(err);
  ::unlink(probe.c_str());
  File f = File::open(probe, OpenMode::create);
  EXPECT_FALSE(f.direct());
  AioEngine engine;
  auto content = test::random_bytes(10'000, 71);
  engine.write(f, content.data(), content.size(), 0);
  std::vector<std::uint8_t> back(content.size());
  engine.read(f, back.data(), back.size(), 0);
  EXPECT_EQ(back, content);
  f.close();
  ::unlink(probe.c_str());
}

}  // namespace
}  // namespace strata::nvme
