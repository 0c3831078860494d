// Failures a user can cause: reading past the end, writing through a read-only file, paths that cannot
// be written, handles that are not pending, and kernels that refuse an I/O interface.
#include <gtest/gtest.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include <cerrno>
#include <cstddef>
#include <fstream>

#include "nvme/engine.h"
#include "nvme/file.h"
#include "nvme/swap_store.h"
#include "tests/nvme/test_util.h"

namespace strata::nvme {
namespace {

using test::ScratchDir;

class Errors : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override { STRATA_SKIP_IF_UNAVAILABLE(GetParam()); }
  AioOptions opts() const {
    AioOptions o;
    o.backend = GetParam();
    o.block_size = 16 << 10;
    return o;
  }
};

TEST_P(Errors, ReadPastTheEndRaisesIoErrorNamingFileOffsetAndLength) {
  ScratchDir dir("nvme");
  auto content = test::random_bytes(10'000, 1);
  test::oracle_write(dir.file("short.bin"), content.data(), content.size(), 0);
  AioEngine engine(opts());
  File f = File::open(dir.file("short.bin"), OpenMode::read_only);
  std::vector<std::uint8_t> buf(50'000);
  try {
    engine.read(f, buf.data(), buf.size(), 4096);
    FAIL() << "reading past the end did not fail";
  } catch (const IoError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(dir.file("short.bin")), std::string::npos) << m;
    EXPECT_NE(m.find("end of the file"), std::string::npos) << m;
    EXPECT_NE(m.find("offset"), std::string::npos) << m;
    EXPECT_NE(m.find("50000-byte read"), std::string::npos) << m;
  }
}

TEST_P(Errors, WriteThroughReadOnlyFileRaisesIoErrorWithErrnoTextAndEngineKeepsWorking) {
  ScratchDir dir("nvme");
  auto content = test::random_bytes(100'000, 2);
  test::oracle_write(dir.file("ro.bin"), content.data(), content.size(), 0);
  AioEngine engine(opts());
  File ro = File::open(dir.file("ro.bin"), OpenMode::read_only);
  try {
    engine.write(ro, content.data(), 70'000, 12'288);
    FAIL() << "writing through a read-only descriptor did not fail";
  } catch (const IoError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(dir.file("ro.bin")), std::string::npos) << m;
    EXPECT_NE(m.find("Bad file descriptor"), std::string::npos) << m;
    EXPECT_NE(m.find("at offset 12288"), std::string::npos) << m;
  }
  EXPECT_EQ(engine.stats().failed_requests, 1u);
  File rw = File::open(dir.file("ro.bin"), OpenMode::read_write);
  auto patch = test::random_bytes(5000, 3);
  engine.write(rw, patch.data(), patch.size(), 100);
  auto back = test::oracle_read(rw.path(), 100, patch.size());
  EXPECT_EQ(back, patch);
}

INSTANTIATE_TEST_SUITE_P(Backends, Errors, ::testing::ValuesIn(test::all_backends()),
                         test::backend_param_name);

TEST(UnwritablePath, OpeningUnderARegularFileRaisesIoErrorNamingThePath) {
  ScratchDir dir("nvme");
  std::ofstream(dir.file("plain")) << "x";
  const std::string path = dir.file("plain") + "/swap.bin";
  try {
    File::open(path, OpenMode::create);
    FAIL() << "no error";
  } catch (const IoError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find("Not a directory"), std::string::npos) << m;
  }
}

TEST(UnwritablePath, SwapStoreOnAMissingDirectoryRaisesIoErrorNamingIt) {
  ScratchDir dir("nvme");
  AioEngine engine;
  const std::string missing = dir.file("no/such/dir");
  try {
    SwapStore store(engine, {.nvme_path = missing});
    FAIL() << "no error";
  } catch (const IoError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(missing), std::string::npos) << m;
    EXPECT_NE(m.find("nvme_path"), std::string::npos) << m;
  }
}

TEST(UnwritablePath, SwapStoreOnAReadOnlyDirectoryRaisesIoError) {
  if (::geteuid() == 0) GTEST_SKIP() << "running as root, which ignores directory permission bits";
  ScratchDir dir("nvme");
  const std::string ro = dir.file("ro");
  ASSERT_EQ(::mkdir(ro.c_str(), 0500), 0);
  AioEngine engine;
  try {
    SwapStore store(engine, {.nvme_path = ro});
    FAIL() << "no error";
  } catch (const IoError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(ro), std::string::npos) << m;
    EXPECT_NE(m.find("Permission denied"), std::string::npos) << m;
  }
  ::chmod(ro.c_str(), 0700);
}

TEST(Handles, WaitAndPollOnAHandleThatIsNotPendingRaise) {
  AioEngine engine;
  EXPECT_THROW(engine.wait(IoHandle{12345}), Error);
  EXPECT_THROW(engine.poll(IoHandle{12345}), Error);
}

// ---- a kernel that refuses io_uring (and libaio): a seccomp filter in a forked child ----------------

// Returns false when the filter cannot be installed (then the child reports a skip).
bool block_syscalls(bool io_uring, bool libaio) {
#if defined(__x86_64__)
  std::vector<sock_filter> f = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
  };
  auto deny = [&](unsigned nr) {
    f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, nr, 0, 1));
    f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)));
  };
  if (io_uring) deny(__NR_io_uring_setup);
  if (libaio) deny(__NR_io_setup);
  f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  sock_fprog prog{static_cast<unsigned short>(f.size()), f.data()};
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
#else
  (void)io_uring;
  (void)libaio;
  return false;
#endif
}

TEST(BackendChoice, AutoFallsBackToLibaioWhenIoUringIsRefusedAndNamedIoUringRaises) {
  if (!backend_available(Backend::libaio)) GTEST_SKIP() << "libaio is unavailable here";
  ScratchDir dir("nvme");
  const std::string path = dir.file("fallback.bin");
  test::ChildResult r = test::run_in_child([&] {
    if (!block_syscalls(true, false)) {
      std::fprintf(stderr, "cannot install a seccomp filter here\n");
      return test::kChildSkip;
    }
    std::string why;
    if (backend_available(Backend::io_uring, &why)) return 10;
    if (why.find("strata.aio.backend") == std::string::npos) return 11;
    AioEngine engine;  // auto
    if (engine.backend() != Backend::libaio) return 12;
    File f = File::open(path, OpenMode::create);
    auto content = test::random_bytes(123'457, 9);
    engine.write(f, content.data(), content.size(), 11);
    if (test::oracle_read(path, 11, content.size()) != content) return 13;
    AioOptions named;
    named.backend = Backend::io_uring;
    try {
      AioEngine e2(named);
      return 14;
    } catch (const BackendError& e) {
      std::string m = e.what();
      if (m.find("io_uring") == std::string::npos || m.find("Operation not permitted") == std::string::npos)
        return 15;
    }
    return 0;
  });
  if (r.code == test::kChildSkip) GTEST_SKIP() << r.output;
  EXPECT_EQ(r.code, 0) << r.output;
}

TEST(BackendChoice, AutoFallsBackToPsyncWhenBothAsyncInterfacesAreRefused) {
  ScratchDir dir("nvme");
  const std::string path = dir.file("psync.bin");
  test::ChildResult r = test::run_in_child([&] {
    if (!block_syscalls(true, true)) {
      std::fprintf(stderr, "cannot install a seccomp filter here\n");
      return test::kChildSkip;
    }
    AioEngine engine;
    if (engine.backend() != Backend::psync) return 10;
    File f = File::open(path, OpenMode::create);
    auto content = test::random_bytes(99'999, 10);
    engine.write(f, content.data(), content.size(), 0);
    std::vector<std::uint8_t> back(content.size());
    engine.read(f, back.data(), back.size(), 0);
    return back == content ? 0 : 11;
  });
  if (r.code == test::kChildSkip) GTEST_SKIP() << r.output;
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("aio backend: psync"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace strata::nvme
