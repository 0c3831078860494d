#include "core/files.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"

namespace strata {

std::optional<std::uint64_t> free_disk_bytes(const std::string& path) {
  struct statvfs v {};
  if (::statvfs(path.c_str(), &v) != 0) return std::nullopt;
  return std::uint64_t(v.f_bavail) * v.f_frsize;
}

int probe_writable(const std::string& dir) {
  std::string probe = dir + "/.strata-write-probe-XXXXXX";
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) return errno;
  ::close(fd);
  ::unlink(probe.c_str());
  return 0;
}

void check_output_dir(const std::string& dir, std::string_view what) {
  std::error_code ec;
  namespace fs = std::filesystem;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw ConfigError(detail::cat(what, " ", dir, " is a file; give a directory to write into"));
  fs::create_directories(dir, ec);
  if (ec)
    throw ConfigError(detail::cat(what, " ", dir, ": cannot create the directory (", ec.message(),
                                  "); choose a writable location"));
  if (const int err = probe_writable(dir); err != 0)
    throw ConfigError(detail::cat(what, " ", dir, ": not writable (", detail::errno_text(err),
                                  "); choose a writable location"));
}

}  // namespace strata
