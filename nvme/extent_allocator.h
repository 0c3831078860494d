// strata/nvme/extent_allocator.h: which ranges of a swap file hold extents and which are free.
//
// Example:
//   strata::nvme::ExtentAllocator a(/*alignment=*/4096, /*capacity=*/64ull << 30);
//   std::optional<std::uint64_t> off = a.allocate(10'000);   // reserves 12288 bytes at an aligned offset
//   a.free(*off);                                            // the hole is reused by the next fit
//   a.stats().fragmentation();                               // 0 when the free space is one hole
//
// Best fit over the holes below the high-water mark, then growth at the end. Optimizer swap allocates
// many shards of the same few sizes, so a freed shard's hole is reused exactly by the next shard of
// that size and the file stops growing after the first step. Neighbouring holes are merged on free; a
// hole that reaches the end lowers the high-water mark.
//
// Locking: none; the owner (SwapStore) serialises calls.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace strata::nvme {

// A typed statistic (after PyTorch's allocator stats): current and peak values, and the running SUMs
// of what was added and removed.
struct Stat {
  std::uint64_t current = 0;
  std::uint64_t peak = 0;
  std::uint64_t allocated = 0;  // SUM of additions
  std::uint64_t freed = 0;      // SUM of removals

  void add(std::uint64_t n);
  void sub(std::uint64_t n);
};

struct AllocatorStats {
  std::uint64_t alignment = 0;
  std::uint64_t capacity = 0;    // 0: unlimited
  Stat extents;                  // COUNT of live extents
  Stat reserved_bytes;           // SUM of live extents' aligned sizes
  std::uint64_t end = 0;         // CURRENT high-water mark: the file must be at least this long
  std::uint64_t holes = 0;       // CURRENT free ranges below the high-water mark
  std::uint64_t hole_bytes = 0;  // CURRENT bytes in them
  std::uint64_t largest_hole = 0;
  std::uint64_t reused = 0;  // SUM of allocations placed in a hole rather than at the end

  // 1 - largest_hole / hole_bytes: 0 when the free space below the high-water mark is one range (or
  // none), approaching 1 as it splinters into many small ranges.
  double fragmentation() const;
};

class ExtentAllocator {
 public:
  // `alignment` must be a power of two; extents start at multiples of it and reserve whole multiples.
  ExtentAllocator(std::uint64_t alignment, std::uint64_t capacity);

  // Offset of a new extent reserving round_up(bytes, alignment) bytes (at least one alignment unit), or
  // nullopt when it would take the high-water mark past the capacity.
  std::optional<std::uint64_t> allocate(std::uint64_t bytes);
  // Releases the extent at `offset`; raises strata::Error for an offset that is not a live extent.
  void free(std::uint64_t offset);
  // Reserved size of the live extent at `offset`, or 0.
  std::uint64_t reserved(std::uint64_t offset) const;

  std::uint64_t alignment() const { return align_; }
  std::uint64_t capacity() const { return capacity_; }
  std::uint64_t end() const { return end_; }
  AllocatorStats stats() const;

 private:
  void add_hole(std::uint64_t off, std::uint64_t bytes);
  void remove_hole(std::map<std::uint64_t, std::uint64_t>::iterator it);

  std::uint64_t align_, capacity_;
  std::uint64_t end_ = 0;
  std::map<std::uint64_t, std::uint64_t> used_;                // offset -> reserved bytes
  std::map<std::uint64_t, std::uint64_t> holes_;               // offset -> bytes, all below end_
  std::set<std::pair<std::uint64_t, std::uint64_t>> by_size_;  // (bytes, offset) of every hole
  Stat extents_, reserved_;
  std::uint64_t hole_bytes_ = 0, reused_ = 0;
};

}  // namespace strata::nvme
