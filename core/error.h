// strata/core/error.h: the error types and check macros every module uses.
//
// Example:
//   STRATA_CHECK(bytes % align == 0, "chunk size ", bytes, " is not a multiple of ", align);
//   int fd = ::open(path, O_RDONLY);
//   STRATA_SYS_CHECK(fd >= 0, "open ", path);           // appends strerror(errno), raises IoError
//   STRATA_CUDA_CHECK(cudaMemcpyAsync(...));            // raises BackendError with cudaGetErrorString
//   throw strata::ConfigError("zero_optimization.stage: 4 is not one of 0, 1, 2, 3");
//
// Everything a user can cause or fix is a strata::Error subclass whose message says what happened, where,
// and what to change. Library code never calls exit(); executables catch at main and exit non-zero.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A malformed or inconsistent configuration, or a bad command-line value.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A tier (device, pinned host, NVMe) cannot hold what was asked of it. The message lists capacity, in
// use and requested bytes and names the setting to change.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

// A file or block-device operation failed (names file, offset, length and the errno text).
class IoError : public Error {
 public:
  using Error::Error;
};

// The device runtime (CUDA, NCCL, or the host backend) reported a failure.
class BackendError : public Error {
 public:
  using Error::Error;
};

namespace detail {

template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// The strings of `parts` with `sep` between them, for lists in messages ("a, b, c").
std::string join(const std::vector<std::string>& parts, std::string_view sep = ", ");

// "file.cpp:42: `stmt` failed: detail" — the shape of every check failure.
std::string check_message(const char* file, int line, const char* stmt, std::string_view detail);
std::string errno_text(int err);

[[noreturn]] void throw_check(const char* file, int line, const char* stmt, const std::string& detail);
[[noreturn]] void throw_sys(const char* file, int line, const char* stmt, int err, const std::string& detail);

}  // namespace detail

// The one byte formatter. Binary units with `decimals` places ("1.50 GiB", "512 B") for logs, tables and
// progress lines; format_bytes adds the exact count ("1.50 GiB (1610612736 bytes)") for messages whose
// figure a user may copy into a setting.
std::string format_size(std::uint64_t bytes, int decimals = 2);
std::string format_bytes(std::size_t bytes);

}  // namespace strata

// An internal invariant or a precondition on arguments; raises strata::Error.
#define STRATA_CHECK(cond, ...)                                                            \
  do {                                                                                     \
    if (!(cond))                                                                           \
      ::strata::detail::throw_check(__FILE__, __LINE__, #cond,                             \
                                    ::strata::detail::cat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)

// A system call that sets errno; raises strata::IoError with strerror(errno).
#define STRATA_SYS_CHECK(cond, ...)                                                      \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      int strata_err_ = errno;                                                           \
      ::strata::detail::throw_sys(__FILE__, __LINE__, #cond, strata_err_,                \
                                  ::strata::detail::cat("" __VA_OPT__(, ) __VA_ARGS__)); \
    }                                                                                    \
  } while (0)

// CUDA and NCCL checks live in core/cuda_check.h so that CPU-only code need not include CUDA headers.
