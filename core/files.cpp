#include "core/files.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

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

}  // namespace strata
