#include "nvme/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <mutex>
#include <set>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "nvme/file_impl.h"

namespace strata::nvme {
namespace detail {
namespace {

int default_open(const char* path, int flags, mode_t mode) {
  return ::open(path, flags, mode);
}
std::atomic<OpenFn> g_direct_open{&default_open};

}  // namespace

OpenFn exchange_direct_open(OpenFn fn) {
  return g_direct_open.exchange(fn ? fn : &default_open);
}

}  // namespace detail

namespace {

std::string parent_dir(const std::string& path) {
  std::filesystem::path p(path);
  std::string dir = p.parent_path().string();
  return dir.empty() ? std::string(".") : dir;
}

// One warning per directory: a swap directory holds many files and the reason is the same for all.
void warn_buffered_fallback(const std::string& path, const std::string& why) {
  static std::mutex mu;
  static std::set<std::string> warned;
  std::string dir = parent_dir(path);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!warned.insert(dir).second) return;
  }
  STRATA_LOG_WARN("O_DIRECT refused for ", path, " (", why, "); files under ", dir,
                  " use buffered I/O, which copies through the page cache and costs host memory and "
                  "bandwidth. Point nvme_path at a file system on the NVMe drive that supports O_DIRECT "
                  "(ext4, xfs), or set strata.aio.use_direct to false to choose buffered I/O explicitly.");
}

int mode_flags(OpenMode mode) {
  switch (mode) {
    case OpenMode::read_only:
      return O_RDONLY;
    case OpenMode::read_write:
      return O_RDWR;
    case OpenMode::create:
      return O_RDWR | O_CREAT;
  }
  return O_RDONLY;
}

const char* mode_name(OpenMode mode) {
  switch (mode) {
    case OpenMode::read_only:
      return "reading";
    case OpenMode::read_write:
      return "reading and writing";
    case OpenMode::create:
      return "creating";
  }
  return "?";
}

}  // namespace

File File::open(const std::string& path, OpenMode mode, bool direct) {
  File f;
  f.path_ = path;
  int flags = mode_flags(mode) | O_CLOEXEC;
  f.buffered_fd_ = ::open(path.c_str(), flags, 0600);
  if (f.buffered_fd_ < 0) {
    int err = errno;
    throw IoError(strata::detail::cat(
        "cannot open ", path, " for ", mode_name(mode), ": ", strata::detail::errno_text(err),
        ". Check that the directory exists and is writable by this user, or point "
        "nvme_path elsewhere."));
  }
  if (!direct) return f;

  int dfd = detail::g_direct_open.load()(path.c_str(), (flags & ~O_CREAT) | O_DIRECT, 0600);
  if (dfd < 0) {
    int err = errno;
    if (err != EINVAL && err != EOPNOTSUPP)
      throw IoError(strata::detail::cat("cannot open ", path, " with O_DIRECT for ", mode_name(mode), ": ",
                                        strata::detail::errno_text(err)));
    warn_buffered_fallback(path, strata::detail::errno_text(err));
    return f;
  }

  // Note [O_DIRECT alignment]: the file system says what it needs. STATX_DIOALIGN (Linux 6.1+) gives the
  // buffer and offset alignment; both 0 means this file cannot do direct I/O even though open accepted
  // the flag. Older kernels do not answer, and then st_blksize (the file system's preferred I/O size, a
  // multiple of the logical block size) is the safe choice.
  struct statx sx {};
  std::size_t off_align = 0, mem_align = 0;
  if (::statx(dfd, "", AT_EMPTY_PATH, STATX_DIOALIGN | STATX_BLOCKS, &sx) == 0) {
    if (sx.stx_mask & STATX_DIOALIGN) {
      off_align = sx.stx_dio_offset_align;
      mem_align = sx.stx_dio_mem_align;
      if (off_align == 0 || mem_align == 0) {
        ::close(dfd);
        warn_buffered_fallback(path, "statx reports no direct I/O support for this file");
        return f;
      }
    } else {
      off_align = mem_align = sx.stx_blksize ? sx.stx_blksize : 4096;
    }
  } else {
    struct stat st {};
    int r = ::fstat(dfd, &st);
    off_align = mem_align = (r == 0 && st.st_blksize > 0) ? std::size_t(st.st_blksize) : 4096;
  }
  std::size_t page = std::size_t(::sysconf(_SC_PAGESIZE));
  f.direct_fd_ = dfd;
  f.offset_align_ = off_align;
  f.mem_align_ = mem_align;
  f.page_align_ = off_align > page ? off_align : page;
  return f;
}

File::File(File&& o) noexcept {
  *this = std::move(o);
}

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    close();
    path_ = std::move(o.path_);
    buffered_fd_ = std::exchange(o.buffered_fd_, -1);
    direct_fd_ = std::exchange(o.direct_fd_, -1);
    offset_align_ = std::exchange(o.offset_align_, 1);
    mem_align_ = std::exchange(o.mem_align_, 1);
    page_align_ = std::exchange(o.page_align_, 1);
  }
  return *this;
}

File::~File() {
  close();
}

void File::close() {
  if (direct_fd_ >= 0) ::close(direct_fd_);
  if (buffered_fd_ >= 0) ::close(buffered_fd_);
  direct_fd_ = buffered_fd_ = -1;
  offset_align_ = mem_align_ = page_align_ = 1;
}

std::uint64_t File::size() const {
  struct stat st {};
  STRATA_SYS_CHECK(::fstat(buffered_fd_, &st) == 0, "fstat ", path_);
  return std::uint64_t(st.st_size);
}

void File::resize(std::uint64_t bytes) {
  if (::ftruncate(buffered_fd_, off_t(bytes)) != 0) {
    int err = errno;
    throw IoError(strata::detail::cat("cannot resize ", path_, " to ", bytes,
                                      " bytes: ", strata::detail::errno_text(err)));
  }
}

int File::preallocate(std::uint64_t offset, std::uint64_t bytes) {
  for (;;) {
    if (::fallocate(buffered_fd_, 0, off_t(offset), off_t(bytes)) == 0) return 0;
    if (errno != EINTR) return errno;
  }
}

}  // namespace strata::nvme
