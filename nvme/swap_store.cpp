#include "nvme/swap_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <system_error>

#include "core/error.h"
#include "core/files.h"
#include "core/log.h"

namespace strata::nvme {

namespace fs = std::filesystem;
using strata::detail::cat;
using strata::detail::errno_text;

namespace {

constexpr const char* kRunDirPrefix = "strata-swap-";
constexpr const char* kLockName = ".lock";

std::uint64_t dir_bytes(const fs::path& dir) {
  std::uint64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code ec2;
    if (it->is_regular_file(ec2)) total += it->file_size(ec2);
  }
  return total;
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || !buf[0]) return "host";
  std::string h(buf);
  std::replace(h.begin(), h.end(), '/', '_');
  return h;
}

std::string nvme_path_hint() {
  return "zero_optimization.offload_optimizer.nvme_path (or offload_param.nvme_path)";
}

}  // namespace

LeftoverReport SwapStore::remove_leftovers(const std::string& nvme_path) {
  LeftoverReport report;
  std::error_code ec;
  for (auto it = fs::directory_iterator(nvme_path, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const fs::path dir = it->path();
    std::error_code ec2;
    if (dir.filename().string().rfind(kRunDirPrefix, 0) != 0 || !it->is_directory(ec2)) continue;
    // A store holds its lock from before the lock file gets its final name until it has removed its
    // directory, so a lock that can be taken means the run that made the directory is gone.
    int fd = ::open((dir / kLockName).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;  // not ours, or still being created
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      std::uint64_t bytes = dir_bytes(dir);
      fs::remove_all(dir, ec2);
      if (ec2) {
        STRATA_LOG_WARN(
            "found swap directory ", dir.string(), " left by a run that did not exit cleanly, but could not ",
            "remove it: ", ec2.message(), ". Remove it by hand to recover ", format_bytes(bytes), ".");
      } else {
        STRATA_LOG_WARN("removed swap directory ", dir.string(), " (", format_bytes(bytes),
                        ") left by a run that did not exit cleanly");
        report.dirs.push_back(dir.string());
        report.bytes += bytes;
      }
    }
    ::close(fd);
  }
  return report;
}

SwapStore::SwapStore(AioEngine& engine, SwapOptions opts)
    : engine_(engine), opts_(std::move(opts)), alloc_(4096, 0) {
  if (opts_.nvme_path.empty())
    throw ConfigError(cat(nvme_path_hint(), " is empty: set it to a directory on the NVMe drive"));
  struct stat st {};
  if (::stat(opts_.nvme_path.c_str(), &st) != 0) {
    int err = errno;
    throw IoError(cat("nvme_path ", opts_.nvme_path, ": ", errno_text(err), ". Create the directory, or set ",
                      nvme_path_hint(), " to an existing one."));
  }
  if (!S_ISDIR(st.st_mode))
    throw IoError(cat("nvme_path ", opts_.nvme_path, " is not a directory; set ", nvme_path_hint(),
                      " to a directory on the NVMe drive"));

  remove_leftovers(opts_.nvme_path);

  const std::uint64_t avail = free_disk_bytes(opts_.nvme_path).value_or(0);
  if (opts_.capacity > avail)
    throw OutOfMemory(cat(
        "NVMe swap at ", opts_.nvme_path, ": the offload config needs ", format_bytes(opts_.capacity),
        opts_.capacity_why.empty() ? std::string() : cat(" (", opts_.capacity_why, ")"),
        " here but the file system has only ", format_bytes(avail), " free. Free space on it, point ",
        nvme_path_hint(), " at a larger drive, or keep more state in host memory (offload device \"cpu\")."));

  // The run directory: a fresh name per store, then the lock, taken before it gets the name that
  // remove_leftovers looks for.
  static std::atomic<unsigned> counter{0};
  const std::string stem = cat(kRunDirPrefix, host_name(), "-", ::getpid(), "-");
  for (;;) {
    run_dir_ = (fs::path(opts_.nvme_path) / cat(stem, counter.fetch_add(1))).string();
    if (::mkdir(run_dir_.c_str(), 0700) == 0) break;
    int err = errno;
    if (err != EEXIST)
      throw IoError(cat("cannot create the swap directory ", run_dir_, ": ", errno_text(err),
                        ". Make nvme_path writable by this user, or set ", nvme_path_hint(), " elsewhere."));
  }
  try {
    const std::string tmp = (fs::path(run_dir_) / ".lock.tmp").string();
    lock_path_ = (fs::path(run_dir_) / kLockName).string();
    lock_fd_ = ::open(tmp.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    STRATA_SYS_CHECK(lock_fd_ >= 0, "create ", tmp);
    STRATA_SYS_CHECK(::flock(lock_fd_, LOCK_EX | LOCK_NB) == 0, "lock ", tmp);
    STRATA_SYS_CHECK(::rename(tmp.c_str(), lock_path_.c_str()) == 0, "rename ", tmp, " to ", lock_path_);
    file_ = File::open((fs::path(run_dir_) / (opts_.name + ".bin")).string(), OpenMode::create,
                       engine_.options().use_direct);
    alloc_ = ExtentAllocator(std::max<std::uint64_t>(file_.page_align(), 4096), opts_.capacity);
  } catch (...) {
    file_.close();
    std::error_code ec;
    fs::remove_all(run_dir_, ec);
    if (lock_fd_ >= 0) ::close(lock_fd_);
    throw;
  }
  STRATA_LOG_DEBUG("swap store ", run_dir_, ": capacity ",
                   opts_.capacity ? format_bytes(opts_.capacity) : "unlimited", ", alignment ",
                   alloc_.alignment(), file_.direct() ? ", O_DIRECT" : ", buffered");
}

SwapStore::~SwapStore() {
  engine_.drain(file_);
  file_.close();
  std::error_code ec;
  fs::remove_all(run_dir_, ec);
  if (ec)
    STRATA_LOG_WARN("could not remove the swap directory ", run_dir_, ": ", ec.message(),
                    "; the next run under this nvme_path will remove it");
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

SwapExtent SwapStore::allocate(std::uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<std::uint64_t> off = alloc_.allocate(bytes);
  if (!off) {
    AllocatorStats s = alloc_.stats();
    throw OutOfMemory(cat("NVMe swap at ", run_dir_, " cannot hold ", format_bytes(bytes), " more: capacity ",
                          format_bytes(s.capacity), ", in use ", format_bytes(s.reserved_bytes.current),
                          " in ", s.extents.current, " extents, free below the high-water mark ",
                          format_bytes(s.hole_bytes), " (largest piece ", format_bytes(s.largest_hole),
                          ", fragmentation ", int(s.fragmentation() * 100),
                          "%). Raise the NVMe capacity the offload config reserves, or "
                          "keep more state in host memory."));
  }
  try {
    grow_to(alloc_.end());
  } catch (...) {
    alloc_.free(*off);
    throw;
  }
  SwapExtent e{next_id_++, *off, bytes};
  live_.emplace(e.id, e);
  bytes_.add(bytes);
  return e;
}

void SwapStore::grow_to(std::uint64_t end) {
  if (end <= file_bytes_) return;
  if (opts_.grow_bytes == 0) {  // writes extend the file
    file_bytes_ = end;
    return;
  }
  const std::uint64_t a = alloc_.alignment();
  std::uint64_t target = std::max(end, file_bytes_ + opts_.grow_bytes);
  if (opts_.capacity) target = std::min(target, std::max(opts_.capacity, end));
  target = (target + a - 1) / a * a;
  int err = file_.preallocate(file_bytes_, target - file_bytes_);
  if (err != 0 && target > end && (err == ENOSPC || err == EDQUOT || err == EFBIG)) {
    target = end;  // the step did not fit: take exactly what this extent needs
    err = file_.preallocate(file_bytes_, target - file_bytes_);
  }
  if (err == 0) {
    file_bytes_ = target;
    return;
  }
  if (err == EOPNOTSUPP) {
    STRATA_LOG_INFO("swap file ", file_.path(),
                    ": the file system cannot preallocate; writes will extend it");
    opts_.grow_bytes = 0;
    file_bytes_ = end;
    return;
  }
  std::string what = cat("could not extend the swap file ", file_.path(), " from ", file_bytes_, " to ",
                         target, " bytes: ", errno_text(err));
  if (err == ENOSPC || err == EDQUOT || err == EFBIG)
    throw OutOfMemory(cat("NVMe swap is full: ", what, ". Free space under ", opts_.nvme_path, ", point ",
                          nvme_path_hint(), " at a larger drive, or keep more state in host memory."));
  throw IoError(what);
}

void SwapStore::free(const SwapExtent& e) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(e.id);
  STRATA_CHECK(it != live_.end() && it->second.offset == e.offset, "free of swap extent ", e.id, " (offset ",
               e.offset, ") in ", run_dir_, ": not a live extent of this store (freed twice?)");
  alloc_.free(e.offset);
  bytes_.sub(it->second.bytes);
  live_.erase(it);
}

void SwapStore::check(const SwapExtent& e, std::uint64_t bytes, std::uint64_t offset,
                      const char* what) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(e.id);
  STRATA_CHECK(it != live_.end() && it->second.offset == e.offset, what, " on swap extent ", e.id, " in ",
               run_dir_, ": not a live extent of this store (freed, or from another store)");
  STRATA_CHECK(offset <= it->second.bytes && bytes <= it->second.bytes - offset, what, " of ", bytes,
               " bytes at offset ", offset, " runs past the end of swap extent ", e.id, " (",
               it->second.bytes, " bytes)");
}

IoHandle SwapStore::write(const SwapExtent& e, const void* src, std::uint64_t bytes, std::uint64_t offset) {
  check(e, bytes, offset, "write");
  return engine_.submit_write(file_, src, bytes, e.offset + offset);
}

IoHandle SwapStore::read(const SwapExtent& e, void* dst, std::uint64_t bytes, std::uint64_t offset) {
  check(e, bytes, offset, "read");
  return engine_.submit_read(file_, dst, bytes, e.offset + offset);
}

SwapStats SwapStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  AllocatorStats a = alloc_.stats();
  SwapStats s;
  s.bytes = bytes_;
  s.extents = a.extents;
  s.reserved_bytes = a.reserved_bytes.current;
  s.capacity_bytes = a.capacity;
  s.file_bytes = file_bytes_;
  s.free_bytes = a.capacity ? a.capacity - std::min(a.capacity, a.reserved_bytes.current)
                            : free_disk_bytes(run_dir_).value_or(0) + a.hole_bytes +
                                  (file_bytes_ - std::min(file_bytes_, a.end));
  s.hole_bytes = a.hole_bytes;
  s.largest_hole_bytes = a.largest_hole;
  s.fragmentation = a.fragmentation();
  s.reused = a.reused;
  return s;
}

}  // namespace strata::nvme
