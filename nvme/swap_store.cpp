#include "nvme/swap_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <limits>
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

using strata::detail::join;

// The room of each of n files holding `capacity` together (Note [striping]): ceil(capacity / n) plus
// one alignment unit, so that an extent of the whole capacity fits; n = 1: the capacity itself.
std::uint64_t file_capacity(std::uint64_t capacity, std::uint64_t n, std::uint64_t align) {
  if (n == 1 || capacity == 0) return capacity;
  return capacity / n + (capacity % n != 0) + align;
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
  std::vector<std::string> dirs{opts_.nvme_path};
  dirs.insert(dirs.end(), opts_.stripe_paths.begin(), opts_.stripe_paths.end());
  std::vector<ino_t> inodes;
  stripes_.resize(dirs.size());
  for (std::size_t k = 0; k < dirs.size(); ++k) {
    const std::string& dir = dirs[k];
    if (dir.empty())
      throw ConfigError(cat(nvme_path_hint(), " lists an empty directory name (entry ", k + 1, " of ",
                            dirs.size(), "): give one directory per NVMe drive"));
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) {
      int err = errno;
      throw IoError(cat("nvme_path ", dir, ": ", errno_text(err), ". Create the directory, or set ",
                        nvme_path_hint(), " to an existing one."));
    }
    if (!S_ISDIR(st.st_mode))
      throw IoError(cat("nvme_path ", dir, " is not a directory; set ", nvme_path_hint(),
                        " to a directory on the NVMe drive"));
    for (std::size_t j = 0; j < k; ++j)
      if (stripes_[j].dev == std::uint64_t(st.st_dev) && inodes[j] == st.st_ino)
        throw ConfigError(cat(nvme_path_hint(), " lists the directory ", dir, " twice",
                              dir == dirs[j] ? std::string() : cat(" (as ", dirs[j], " and ", dir, ")"),
                              ": each entry must be a directory of its own, one per NVMe drive. Remove the "
                              "repeated entry."));
    stripes_[k].dir = dir;
    stripes_[k].dev = std::uint64_t(st.st_dev);
    inodes.push_back(st.st_ino);
  }

  for (const Stripe& s : stripes_) remove_leftovers(s.dir);
  check_free_space();

  try {
    for (Stripe& s : stripes_) open_stripe(s);
    std::uint64_t align = 4096;
    for (const Stripe& s : stripes_) align = std::max<std::uint64_t>(align, s.file.page_align());
    alloc_ = ExtentAllocator(align, file_capacity(opts_.capacity, stripes_.size(), align));
  } catch (...) {
    close_stripes();
    throw;
  }
  std::vector<std::string> runs;
  for (const Stripe& s : stripes_) {
    file_paths_.push_back(s.file.path());
    runs.push_back(s.run_dir);
  }
  STRATA_LOG_DEBUG("swap store ", join(runs, ", "), ": capacity ",
                   opts_.capacity ? format_bytes(opts_.capacity) : "unlimited", ", alignment ",
                   alloc_.alignment(), stripes_.front().file.direct() ? ", O_DIRECT" : ", buffered");
}

// The up-front check (Note [striping]): each directory must hold its file's share of the capacity, and
// directories on one file system (one st_dev) need their shares there together. The alignment is not
// known before the files are open; the check takes the usual 4 KiB.
void SwapStore::check_free_space() const {
  const std::size_t n = stripes_.size();
  if (n == 1) {
    const std::uint64_t avail = free_disk_bytes(opts_.nvme_path).value_or(0);
    if (opts_.capacity > avail)
      throw OutOfMemory(
          cat("NVMe swap at ", opts_.nvme_path, ": the offload config needs ", format_bytes(opts_.capacity),
              why(), " here but the file system has only ", format_bytes(avail),
              " free. Free space on it, point ", nvme_path_hint(),
              " at a larger drive, or keep more state in host memory (offload device \"cpu\")."));
    return;
  }
  const std::uint64_t share = file_capacity(opts_.capacity, n, 4096);
  std::vector<std::string> short_of;
  std::vector<bool> seen(n, false);
  for (std::size_t k = 0; k < n; ++k) {
    if (seen[k]) continue;
    std::vector<std::string> group;
    for (std::size_t j = k; j < n; ++j)
      if (stripes_[j].dev == stripes_[k].dev) {
        seen[j] = true;
        group.push_back(stripes_[j].dir);
      }
    const std::uint64_t need = share * group.size();
    const std::uint64_t avail = free_disk_bytes(stripes_[k].dir).value_or(0);
    if (need <= avail) continue;
    if (group.size() == 1)
      short_of.push_back(cat(group[0], " has only ", format_bytes(avail), " free"));
    else
      short_of.push_back(cat(join(group, " and "), " are on one file system, which needs ",
                             format_bytes(need), " for their ", group.size(), " shares but has only ",
                             format_bytes(avail), " free"));
  }
  if (short_of.empty()) return;
  throw OutOfMemory(cat("NVMe swap striped over ", n, " directories (", join(dirs(), ", "),
                        "): the offload config needs ", format_bytes(opts_.capacity), why(), " in all, ",
                        format_bytes(share), " on each drive, but ", join(short_of, "; "),
                        ". Free space there, point ", nvme_path_hint(),
                        " at larger drives (or list more of them), or keep more state in host memory "
                        "(offload device \"cpu\")."));
}

std::string SwapStore::why() const {
  return opts_.capacity_why.empty() ? std::string() : cat(" (", opts_.capacity_why, ")");
}

std::vector<std::string> SwapStore::dirs() const {
  std::vector<std::string> d;
  for (const Stripe& s : stripes_) d.push_back(s.dir);
  return d;
}

// The run directory: a fresh name per store, then the lock, taken before it gets the name that
// remove_leftovers looks for; then the swap file.
void SwapStore::open_stripe(Stripe& s) {
  static std::atomic<unsigned> counter{0};
  const std::string stem = cat(kRunDirPrefix, host_name(), "-", ::getpid(), "-");
  for (;;) {
    std::string run_dir = (fs::path(s.dir) / cat(stem, counter.fetch_add(1))).string();
    if (::mkdir(run_dir.c_str(), 0700) == 0) {
      s.run_dir = std::move(run_dir);
      break;
    }
    int err = errno;
    if (err != EEXIST)
      throw IoError(cat("cannot create the swap directory ", run_dir, ": ", errno_text(err),
                        ". Make nvme_path writable by this user, or set ", nvme_path_hint(), " elsewhere."));
  }
  const std::string tmp = (fs::path(s.run_dir) / ".lock.tmp").string();
  s.lock_path = (fs::path(s.run_dir) / kLockName).string();
  s.lock_fd = ::open(tmp.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  STRATA_SYS_CHECK(s.lock_fd >= 0, "create ", tmp);
  STRATA_SYS_CHECK(::flock(s.lock_fd, LOCK_EX | LOCK_NB) == 0, "lock ", tmp);
  STRATA_SYS_CHECK(::rename(tmp.c_str(), s.lock_path.c_str()) == 0, "rename ", tmp, " to ", s.lock_path);
  s.file = File::open((fs::path(s.run_dir) / (opts_.name + ".bin")).string(), OpenMode::create,
                      engine_.options().use_direct);
}

// Waits for I/O still running on each file, closes it and removes its run directory (the lock last).
void SwapStore::close_stripes() {
  for (Stripe& s : stripes_) {
    if (s.file.is_open()) engine_.drain(s.file);
    s.file.close();
    if (!s.run_dir.empty()) {
      std::error_code ec;
      fs::remove_all(s.run_dir, ec);
      if (ec)
        STRATA_LOG_WARN("could not remove the swap directory ", s.run_dir, ": ", ec.message(),
                        "; the next run under this nvme_path will remove it");
    }
    if (s.lock_fd >= 0) ::close(s.lock_fd);
    s.lock_fd = -1;
  }
}

SwapStore::~SwapStore() {
  close_stripes();
}

std::string SwapStore::where() const {
  if (stripes_.size() == 1) return cat("NVMe swap at ", stripes_.front().run_dir);
  std::vector<std::string> runs;
  for (const Stripe& s : stripes_) runs.push_back(s.run_dir);
  return cat("NVMe swap striped over ", stripes_.size(), " drives (", join(runs, ", "), ")");
}

SwapExtent SwapStore::allocate(std::uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::uint64_t n = stripes_.size();
  std::optional<std::uint64_t> off = alloc_.allocate(n == 1 ? bytes : share(bytes));
  if (!off) {
    AllocatorStats s = alloc_.stats();
    throw OutOfMemory(
        cat(where(), " cannot hold ", format_bytes(bytes), " more: capacity ", format_bytes(n * s.capacity),
            ", in use ", format_bytes(n * s.reserved_bytes.current), " in ", s.extents.current,
            " extents, free below the high-water mark ", format_bytes(n * s.hole_bytes), " (largest piece ",
            format_bytes(n * s.largest_hole), ", fragmentation ", int(s.fragmentation() * 100),
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

std::uint64_t SwapStore::share(std::uint64_t bytes) const {
  const std::uint64_t n = stripes_.size(), a = alloc_.alignment();
  return (bytes / n + (bytes % n != 0) + a - 1) / a * a;
}

// Every file grows alike, so that each holds [0, file_bytes_).
void SwapStore::grow_to(std::uint64_t end) {
  if (end <= file_bytes_) return;
  if (opts_.grow_bytes == 0) {  // writes extend the files
    file_bytes_ = end;
    return;
  }
  const std::uint64_t a = alloc_.alignment();
  std::uint64_t target = std::max(end, file_bytes_ + opts_.grow_bytes);
  if (alloc_.capacity()) target = std::min(target, std::max(alloc_.capacity(), end));
  target = (target + a - 1) / a * a;
  for (Stripe& s : stripes_) {
    int err = s.file.preallocate(file_bytes_, target - file_bytes_);
    if (err != 0 && target > end && (err == ENOSPC || err == EDQUOT || err == EFBIG)) {
      target = end;  // the step did not fit: take exactly what this extent needs (here and further on)
      err = s.file.preallocate(file_bytes_, target - file_bytes_);
    }
    if (err == 0) continue;
    if (err == EOPNOTSUPP) {
      STRATA_LOG_INFO("swap file ", s.file.path(),
                      ": the file system cannot preallocate; writes will extend ",
                      stripes_.size() == 1 ? "it" : "the swap files");
      opts_.grow_bytes = 0;
      file_bytes_ = end;
      return;
    }
    std::string what = cat("could not extend the swap file ", s.file.path(), " from ", file_bytes_, " to ",
                           target, " bytes: ", errno_text(err));
    if (err == ENOSPC || err == EDQUOT || err == EFBIG)
      throw OutOfMemory(cat("NVMe swap is full: ", what, ". Free space under ", s.dir, ", point ",
                            nvme_path_hint(), " at a larger drive, or keep more state in host memory."));
    throw IoError(what);
  }
  file_bytes_ = target;
}

void SwapStore::free(const SwapExtent& e) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(e.id);
  STRATA_CHECK(it != live_.end() && it->second.offset == e.offset, "free of swap extent ", e.id, " (offset ",
               e.offset, ") in ", run_dir(), ": not a live extent of this store (freed twice?)");
  alloc_.free(e.offset);
  bytes_.sub(it->second.bytes);
  live_.erase(it);
}

std::uint64_t SwapStore::check(const SwapExtent& e, std::uint64_t bytes, std::uint64_t offset,
                               const char* what) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(e.id);
  STRATA_CHECK(it != live_.end() && it->second.offset == e.offset, what, " on swap extent ", e.id, " in ",
               run_dir(), ": not a live extent of this store (freed, or from another store)");
  STRATA_CHECK(offset <= it->second.bytes && bytes <= it->second.bytes - offset, what, " of ", bytes,
               " bytes at offset ", offset, " runs past the end of swap extent ", e.id, " (",
               it->second.bytes, " bytes)");
  return it->second.bytes;
}

// One request over the stripes that [offset, offset + bytes) of the extent touches (Note [striping]).
IoHandle SwapStore::transfer(bool write, const SwapExtent& e, char* buf, std::uint64_t bytes,
                             std::uint64_t offset) {
  const std::uint64_t size = check(e, bytes, offset, write ? "write" : "read");
  std::vector<Segment> segs;
  if (bytes == 0) {
    segs.push_back({&stripes_.front().file, e.offset + offset, 0, buf});
  } else {
    const std::uint64_t n = stripes_.size(), sh = share(size);
    for (std::uint64_t k = offset / sh; k < n && k * sh < offset + bytes; ++k) {
      const std::uint64_t lo = std::max(offset, k * sh), hi = std::min(offset + bytes, (k + 1) * sh);
      segs.push_back(
          {&stripes_[k].file, e.offset + (lo - k * sh), std::size_t(hi - lo), buf + (lo - offset)});
    }
  }
  return write ? engine_.submit_write(segs) : engine_.submit_read(segs);
}

IoHandle SwapStore::write(const SwapExtent& e, const void* src, std::uint64_t bytes, std::uint64_t offset) {
  return transfer(true, e, static_cast<char*>(const_cast<void*>(src)), bytes, offset);
}

IoHandle SwapStore::read(const SwapExtent& e, void* dst, std::uint64_t bytes, std::uint64_t offset) {
  return transfer(false, e, static_cast<char*>(dst), bytes, offset);
}

SwapStats SwapStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  AllocatorStats a = alloc_.stats();
  const std::uint64_t n = stripes_.size();
  SwapStats s;
  s.bytes = bytes_;
  s.extents = a.extents;
  s.reserved_bytes = n * a.reserved_bytes.current;
  s.capacity_bytes = n * a.capacity;
  s.file_bytes = file_bytes_;
  if (a.capacity) {
    s.free_bytes = n * (a.capacity - std::min(a.capacity, a.reserved_bytes.current));
  } else {
    // Unlimited: what every file can still grow by alike (files on one file system share its space).
    std::uint64_t grow = std::numeric_limits<std::uint64_t>::max();
    for (const Stripe& k : stripes_) {
      const auto on_dev =
          std::count_if(stripes_.begin(), stripes_.end(), [&](const Stripe& o) { return o.dev == k.dev; });
      grow = std::min(grow, free_disk_bytes(k.run_dir).value_or(0) / std::uint64_t(on_dev));
    }
    s.free_bytes = n * (grow + a.hole_bytes + (file_bytes_ - std::min(file_bytes_, a.end)));
  }
  s.hole_bytes = n * a.hole_bytes;
  s.largest_hole_bytes = n * a.largest_hole;
  s.fragmentation = a.fragmentation();
  s.reused = a.reused;
  return s;
}

}  // namespace strata::nvme
