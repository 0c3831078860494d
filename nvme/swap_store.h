// strata/nvme/swap_store.h: the swap space under nvme_path, where NVMe-resident tensors live by handle.
//
// Example (ZeRO-Infinity optimizer swap: the same shards written and read back every step):
//   strata::nvme::AioEngine engine(aio_options);
//   strata::nvme::SwapStore store(engine, {.nvme_path = "/local_nvme", .capacity = need_bytes});
//   // or striped over two more drives: {.nvme_path = "/nvme0", .stripe_paths = {"/nvme1", "/nvme2"}, ...}
//   strata::nvme::SwapExtent m = store.allocate(shard_bytes);   // OutOfMemory when the store is full
//   store.wait(store.write(m, exp_avg));                          // async; wait raises IoError
//   strata::nvme::IoHandle h = store.read(m, exp_avg);            // whole extent back
//   ... overlap with other work ...
//   store.wait(h);
//   store.free(m);                                                // the hole is reused by the next shard
//   store.stats().fragmentation;
//
// Files: each store creates its own run directory, nvme_path/strata-swap-<host>-<pid>-<n>/, holding the
// swap file and a lock file that the store keeps flock()ed while it lives. The destructor removes the
// directory. A directory whose lock nobody holds belongs to a run that died without cleaning up; the
// next store created under the same nvme_path reports it and removes it (remove_leftovers).
//
// Note [striping]: with stripe_paths, the store has N = 1 + stripe_paths.size() swap files, one run
// directory (with its lock) under each directory, and every extent is cut over all of them so that one
// transfer keeps every drive busy (what DeepSpeed users get from building a RAID 0 first). The
// allocator works in one offset space shared by the files: an extent of `bytes` takes
// share = round_up(ceil(bytes / N), alignment()) bytes at the same offset of every file, and stripe k
// (file k) holds the extent's bytes [k * share, min(bytes, (k + 1) * share)); a small extent leaves the
// later files' room for it unused. A read or write of any sub-range is one engine request over the
// stripes it touches. With N = 1 the store is exactly the unstriped one: share is the extent's aligned
// size, and offsets, file and messages are those of a single swap file.
//
// Locking: every public method may be called from any thread (allocation state is under one mutex,
// taken by public methods only). A buffer passed to read or write belongs to the I/O until its handle is
// waited for; an extent must not be freed while I/O on it is pending.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "nvme/engine.h"
#include "nvme/extent_allocator.h"

namespace strata::nvme {

struct SwapOptions {
  // zero_optimization.offload_param.nvme_path / offload_optimizer.nvme_path: an existing, writable
  // directory on the NVMe drive (the first one, when the config lists several).
  std::string nvme_path;
  // Further directories, one per additional drive: when not empty, every extent is striped over
  // nvme_path and these, one swap file (and run directory, lock) in each (Note [striping]). Each must
  // be an existing, writable directory; the same directory twice is refused (ConfigError). Default
  // empty: one swap file under nvme_path.
  std::vector<std::string> stripe_paths = {};
  // Bytes this store will hold at most (what the offload config needs here), over all its files
  // together: with N files each gets ceil(capacity / N) plus one alignment unit (N = 1: capacity). Each
  // directory's share is checked against its file system's free space when the store is created (the
  // shares of directories on one file system add up there), and allocate() enforces it. 0: no up-front
  // check; the store grows until a file system is full.
  std::uint64_t capacity = 0;
  // What the capacity is made of, for the message when the file system lacks it ("144 MiB of state,
  // plus ..."); empty: not explained.
  std::string capacity_why = {};
  // Each swap file is preallocated (fallocate) in steps of at least this many bytes, so that a full disk
  // shows up in allocate() and writes never extend the file. 0: no preallocation; writes extend it.
  std::uint64_t grow_bytes = std::uint64_t(256) << 20;
  // Stem of the swap file's name inside the run directory ("optimizer", "params"), for people reading
  // the directory.
  std::string name = "swap";
};

// A tensor's place in the store. Copyable; valid until free(). `bytes` is the size asked for;
// read(e, dst) and write(e, src) move exactly that many bytes.
struct SwapExtent {
  std::uint64_t id = 0;
  std::uint64_t offset = 0;  // in the swap file (striped: in each swap file); a multiple of alignment()
  std::uint64_t bytes = 0;
  explicit operator bool() const { return id != 0; }
};

// Sizes of room (reserved, capacity, free, holes) count all the swap files together: with N files, N
// times what each file has (every file has the same layout). file_bytes is per file.
struct SwapStats {
  Stat bytes;                        // SUM of requested sizes of live extents (current, peak, totals)
  Stat extents;                      // COUNT of live extents
  std::uint64_t reserved_bytes = 0;  // CURRENT aligned sizes of live extents (striped: N * share each)
  std::uint64_t capacity_bytes = 0;  // what allocate() enforces (N times each file's room); 0: unlimited
  std::uint64_t file_bytes = 0;      // CURRENT size of each swap file (preallocated); N files this long
  // CURRENT capacity - reserved (unlimited: the file systems' free space, as much as every file can
  // still grow by alike, plus holes)
  std::uint64_t free_bytes = 0;
  std::uint64_t hole_bytes = 0;          // CURRENT free space below the high-water mark
  std::uint64_t largest_hole_bytes = 0;  // times N: the largest extent that fits a hole is about this
  double fragmentation = 0;              // 1 - largest_hole / hole_bytes (see ExtentAllocator)
  std::uint64_t reused = 0;              // SUM of allocations placed in holes
};

// What remove_leftovers found and removed.
struct LeftoverReport {
  std::vector<std::string> dirs;
  std::uint64_t bytes = 0;
};

class SwapStore {
 public:
  // Removes leftovers of crashed runs under opts.nvme_path and every stripe path (logging each), checks
  // opts.capacity against the free space (OutOfMemory naming the directories short of it, the need and
  // what is free), creates the run directories and opens the swap files with
  // engine.options().use_direct. IoError naming the directory when one is missing, not a directory or
  // not writable; ConfigError when a directory is listed twice. `engine` must outlive the store.
  SwapStore(AioEngine& engine, SwapOptions opts);
  // Waits for any I/O still running on the swap files, then removes the run directories.
  ~SwapStore();
  SwapStore(const SwapStore&) = delete;
  SwapStore& operator=(const SwapStore&) = delete;

  // Reserves room for `bytes` (any size). OutOfMemory when the capacity or the file system is exhausted,
  // with the store's stats and the setting to change.
  SwapExtent allocate(std::uint64_t bytes);
  // Returns the extent's room to the store. strata::Error for an unknown or already freed extent.
  void free(const SwapExtent& e);

  // Asynchronous transfers between memory and bytes [offset, offset + bytes) of the extent (one engine
  // request over the stripes the range touches); the range must lie inside the extent (strata::Error
  // otherwise). Collect with wait() (or the engine's).
  IoHandle write(const SwapExtent& e, const void* src, std::uint64_t bytes, std::uint64_t offset = 0);
  IoHandle read(const SwapExtent& e, void* dst, std::uint64_t bytes, std::uint64_t offset = 0);
  IoHandle write(const SwapExtent& e, const void* src) { return write(e, src, e.bytes, 0); }
  IoHandle read(const SwapExtent& e, void* dst) { return read(e, dst, e.bytes, 0); }
  void wait(IoHandle h) { engine_.wait(h); }

  SwapStats stats() const;
  std::uint64_t alignment() const { return alloc_.alignment(); }
  // The first stripe's run directory and swap file (the only ones unless striped).
  const std::string& run_dir() const { return stripes_.front().run_dir; }
  const std::string& file_path() const { return file_paths_.front(); }
  // Every swap file, in stripe order (nvme_path's first, then stripe_paths').
  const std::vector<std::string>& file_paths() const { return file_paths_; }
  AioEngine& engine() { return engine_; }

  // Removes every strata-swap-* directory under `nvme_path` whose lock no live process holds. Called by
  // the constructor; safe to call while other runs use the same nvme_path.
  static LeftoverReport remove_leftovers(const std::string& nvme_path);

 private:
  // One swap file and where it lives.
  struct Stripe {
    std::string dir;      // nvme_path or a stripe path, as given
    std::uint64_t dev{};  // st_dev of dir: stripes on one file system share its free space
    std::string run_dir, lock_path;
    int lock_fd = -1;
    File file;
  };

  void check_free_space() const;
  void open_stripe(Stripe& s);
  void close_stripes();
  std::string where() const;              // "NVMe swap at <run dir>" or "... striped over N drives (...)"
  std::string why() const;                // " (capacity_why)" or ""
  std::vector<std::string> dirs() const;  // every stripe's directory, as given
  std::uint64_t share(std::uint64_t bytes) const;  // each file's room for an extent of `bytes`
  // The extent's size asked for, after checking that [offset, offset + bytes) lies inside it.
  std::uint64_t check(const SwapExtent& e, std::uint64_t bytes, std::uint64_t offset, const char* what) const;
  IoHandle transfer(bool write, const SwapExtent& e, char* buf, std::uint64_t bytes, std::uint64_t offset);
  void grow_to(std::uint64_t end);

  AioEngine& engine_;
  SwapOptions opts_;
  std::vector<Stripe> stripes_;  // fixed after construction
  std::vector<std::string> file_paths_;

  mutable std::mutex mu_;                               // guards everything below
  ExtentAllocator alloc_;                               // offsets and sizes within each file
  std::unordered_map<std::uint64_t, SwapExtent> live_;  // by id
  std::uint64_t next_id_ = 1;
  std::uint64_t file_bytes_ = 0;  // of each file
  Stat bytes_;
};

}  // namespace strata::nvme
