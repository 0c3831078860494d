// Helpers shared by the nvme tests: scratch directories, random data, the backend list, and the
// oracle (plain pread/pwrite on the path, independent of the engine).
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "nvme/engine.h"
#include "nvme/options.h"
#include "tests/common/scratch_dir.h"

namespace strata::nvme::test {

using strata::test::ScratchDir;  // tests/common/scratch_dir.h; the nvme tests' area is "nvme"

inline std::vector<std::uint8_t> random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint8_t> v(n);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t x = rng();
    std::memcpy(v.data() + i, &x, 8);
  }
  for (; i < n; ++i) v[i] = std::uint8_t(rng());
  return v;
}

// The oracle: what the file holds, read with one plain pread loop.
inline std::vector<std::uint8_t> oracle_read(const std::string& path, std::uint64_t off, std::size_t n) {
  std::vector<std::uint8_t> v(n);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << path;
  std::size_t got = 0;
  while (fd >= 0 && got < n) {
    ssize_t r = ::pread(fd, v.data() + got, n - got, off_t(off + got));
    if (r <= 0) break;
    got += std::size_t(r);
  }
  if (fd >= 0) ::close(fd);
  EXPECT_EQ(got, n) << "oracle read of " << path << " at " << off;
  return v;
}

inline void oracle_write(const std::string& path, const void* src, std::size_t n, std::uint64_t off) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0) << path;
  std::size_t done = 0;
  while (done < n) {
    ssize_t r = ::pwrite(fd, static_cast<const char*>(src) + done, n - done, off_t(off + done));
    ASSERT_GT(r, 0) << path;
    done += std::size_t(r);
  }
  ::close(fd);
}

inline const std::vector<Backend>& all_backends() {
  static const std::vector<Backend> b = {Backend::io_uring, Backend::libaio, Backend::psync};
  return b;
}

inline std::string backend_param_name(const ::testing::TestParamInfo<Backend>& info) {
  return to_string(info.param);
}

// First byte index where a and b differ, or -1.
inline long first_difference(const std::uint8_t* a, const std::uint8_t* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return long(i);
  return -1;
}

// Runs `body` in a forked child (for process-wide state such as RLIMIT_FSIZE or a seccomp filter) and
// returns its exit code and what it wrote to stderr. Call only while the test process has no other
// threads (no engine alive).
struct ChildResult {
  int code = -1;  // exit code, or -signal when killed
  std::string output;
};
constexpr int kChildSkip = 77;  // the child found the feature it needs unavailable; output says why

inline ChildResult run_in_child(const std::function<int()>& body) {
  int fds[2];
  if (::pipe(fds) != 0) return {-1, "pipe failed"};
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    ::dup2(fds[1], STDERR_FILENO);
    int code = 1;
    try {
      code = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: uncaught exception: %s\n", e.what());
    }
    std::fflush(stderr);
    ::_exit(code);
  }
  ::close(fds[1]);
  ChildResult r;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    r.output.append(buf, std::size_t(n));
  }
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  return r;
}

}  // namespace strata::nvme::test

// Skips the test, with the kernel's reason, when backend `b` cannot be used in this process.
#define STRATA_SKIP_IF_UNAVAILABLE(b)                                                          \
  do {                                                                                         \
    std::string strata_why_;                                                                   \
    if (!::strata::nvme::backend_available((b), &strata_why_))                                 \
      GTEST_SKIP() << ::strata::nvme::to_string(b) << " is unavailable here: " << strata_why_; \
  } while (0)
