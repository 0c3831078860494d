// strata/nvme/swap_store.h: the swap space under nvme_path, where NVMe-resident tensors live by handle.
//
// Example (ZeRO-Infinity optimizer swap: the same shards written and read back every step):
//   strata::nvme::AioEngine engine(aio_options);
//   strata::nvme::SwapStore store(engine, {.nvme_path = "/local_nvme", .capacity = need_bytes});
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
  // directory on the NVMe drive.
  std::string nvme_path;
  // Bytes this store will hold at most (what the offload config needs here). Checked against the file
  // system's free space when the store is created, and enforced by allocate(). 0: no up-front check;
  // the store grows until the file system is full.
  std::uint64_t capacity = 0;
  // What the capacity is made of, for the message when the file system lacks it ("144 MiB of state,
  // plus ..."); empty: not explained.
  std::string capacity_why = {};
  // The swap file is preallocated (fallocate) in steps of at least this many bytes, so that a full disk
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
  std::uint64_t offset = 0;  // in the swap file; a multiple of alignment()
  std::uint64_t bytes = 0;
  explicit operator bool() const { return id != 0; }
};

struct SwapStats {
  Stat bytes;                        // SUM of requested sizes of live extents (current, peak, totals)
  Stat extents;                      // COUNT of live extents
  std::uint64_t reserved_bytes = 0;  // CURRENT aligned sizes of live extents
  std::uint64_t capacity_bytes = 0;  // 0: unlimited
  std::uint64_t file_bytes = 0;      // CURRENT size of the swap file (preallocated)
  std::uint64_t free_bytes =
      0;  // CURRENT capacity - reserved (unlimited: the file system's free space + holes)
  std::uint64_t hole_bytes = 0;  // CURRENT free space below the high-water mark
  std::uint64_t largest_hole_bytes = 0;
  double fragmentation = 0;  // 1 - largest_hole / hole_bytes (see ExtentAllocator)
  std::uint64_t reused = 0;  // SUM of allocations placed in holes
};

// What remove_leftovers found and removed.
struct LeftoverReport {
  std::vector<std::string> dirs;
  std::uint64_t bytes = 0;
};

class SwapStore {
 public:
  // Removes leftovers of crashed runs under opts.nvme_path (logging each), checks opts.capacity against
  // the free space (OutOfMemory naming the path, the need and what is free), creates the run directory
  // and opens the swap file with engine.options().use_direct. IoError when nvme_path is missing or not
  // writable. `engine` must outlive the store.
  SwapStore(AioEngine& engine, SwapOptions opts);
  // Waits for any I/O still running on the swap file, then removes the run directory.
  ~SwapStore();
  SwapStore(const SwapStore&) = delete;
  SwapStore& operator=(const SwapStore&) = delete;

  // Reserves room for `bytes` (any size). OutOfMemory when the capacity or the file system is exhausted,
  // with the store's stats and the setting to change.
  SwapExtent allocate(std::uint64_t bytes);
  // Returns the extent's room to the store. strata::Error for an unknown or already freed extent.
  void free(const SwapExtent& e);

  // Asynchronous transfers between memory and [e.offset + offset, + bytes) of the extent; the range
  // must lie inside the extent (strata::Error otherwise). Collect with wait() (or the engine's).
  IoHandle write(const SwapExtent& e, const void* src, std::uint64_t bytes, std::uint64_t offset = 0);
  IoHandle read(const SwapExtent& e, void* dst, std::uint64_t bytes, std::uint64_t offset = 0);
  IoHandle write(const SwapExtent& e, const void* src) { return write(e, src, e.bytes, 0); }
  IoHandle read(const SwapExtent& e, void* dst) { return read(e, dst, e.bytes, 0); }
  void wait(IoHandle h) { engine_.wait(h); }

  SwapStats stats() const;
  std::uint64_t alignment() const { return alloc_.alignment(); }
  const std::string& run_dir() const { return run_dir_; }
  const std::string& file_path() const { return file_.path(); }
  AioEngine& engine() { return engine_; }

  // Removes every strata-swap-* directory under `nvme_path` whose lock no live process holds. Called by
  // the constructor; safe to call while other runs use the same nvme_path.
  static LeftoverReport remove_leftovers(const std::string& nvme_path);

 private:
  void check(const SwapExtent& e, std::uint64_t bytes, std::uint64_t offset, const char* what) const;
  void grow_to(std::uint64_t end);

  AioEngine& engine_;
  SwapOptions opts_;
  std::string run_dir_, lock_path_;
  int lock_fd_ = -1;
  File file_;

  mutable std::mutex mu_;  // guards everything below
  ExtentAllocator alloc_;
  std::unordered_map<std::uint64_t, SwapExtent> live_;  // by id
  std::uint64_t next_id_ = 1;
  std::uint64_t file_bytes_ = 0;
  Stat bytes_;
};

}  // namespace strata::nvme
