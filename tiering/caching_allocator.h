// strata/tiering/caching_allocator.h: a PyTorch-style caching allocator over a source of big segments
// (Device::allocate for the device tier, Device::allocate_pinned for the pinned slabs).
//
// Example:
//   auto alloc = strata::tiering::make_device_allocator(dev, {.capacity = 8ull << 30});
//   void* a = alloc->allocate(bytes, "layers.3.params");   // OutOfMemory with the stats when it cannot fit
//   compute->copy_async(a, ...);
//   alloc->free(a, *compute);    // reused only after the work enqueued on `compute` so far completes
//   alloc->stats().reserved_bytes[0].peak;
//   alloc->empty_cache();        // give cached segments back to the device
//
// How it works: requests are rounded up to `min_block`; requests up to `small_size` come from
// `small_segment`-sized segments (the small pool), others from the large pool, whose segments are
// `large_segment` bytes for requests below `min_large_alloc` and the request rounded to `round_large`
// above it. A free block that is bigger than needed is split (small pool: when the rest is at least
// min_block; large pool: when it is more than small_size), and a freed block merges with free neighbours
// in its segment. Reserved bytes (the segments) never exceed `capacity`: when a request does not fit,
// the allocator waits for blocks whose last use is still running, then gives cached free segments back
// to the source (each such retry counts in num_alloc_retries), and only then fails.
//
// Note [exact segments]: splitting makes reserved bytes depend on the order of requests: a segment with
// one small block still in use cannot be given back, and its free rest may be too small for the next
// request, so a budget can refuse a request although the bytes in use plus the request fit (it is
// fragmentation: PyTorch reports it as "reserved but unallocated"). With `exact_segments` every block is
// a segment of its own, of exactly block_bytes(request); a cached free segment is handed out again only
// for a request of the same size, and cached segments are given back (as few as needed) before a request
// is refused. So a request fails only when the blocks in use plus block_bytes(request) exceed the
// capacity: a caller that sums block_bytes() over what it will hold at once knows exactly what fits.
// The price is a call to the source whenever the size in demand changes under a tight budget.
//
// Locking contract: public methods take the allocator's mutex and never call one another; private
// methods assume it is held. The only blocking under the mutex is waiting on fences (tiering/fence.h),
// which never need this lock to complete.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/device.h"
#include "tiering/fence.h"
#include "tiering/types.h"

namespace strata::tiering {

struct AllocatorOptions {
  std::string name = "device";  // names the pool in messages ("device", "pinned")
  // Budget for reserved bytes (the segments taken from the source). 0: the source's own limit (the
  // device's capacity for make_device_allocator; required for pinned).
  std::uint64_t capacity = 0;
  std::size_t min_block = 512;                       // every block is a multiple of this and aligned to it
  std::size_t small_size = 1 << 20;                  // requests up to this come from the small pool
  std::size_t small_segment = 2 << 20;               // segment size of the small pool
  std::size_t large_segment = 20 << 20;              // segment for large requests below min_large_alloc
  std::size_t min_large_alloc = 10 << 20;            // requests at least this big get their own segment
  std::size_t round_large = 2 << 20;                 // ... rounded up to a multiple of this
  std::string setting = "strata.device_memory_cap";  // the setting that sets `capacity` (OOM message)
  bool exact_segments = false;                       // one segment per block (Note [exact segments])
};

// Where segments come from. allocate() may throw OutOfMemory (treated as "no room"); release() gets back
// exactly what allocate() returned.
struct SegmentSource {
  std::function<void*(std::size_t bytes)> allocate;
  std::function<void(void* p, std::size_t bytes)> release;
};

// Stat types, as in PyTorch: every stat exists for all blocks and for each pool.
enum class StatType { aggregate = 0, small_pool = 1, large_pool = 2 };
inline constexpr int kStatTypes = 3;
using StatArray = std::array<Stat, kStatTypes>;

struct AllocatorStats {
  StatArray allocation;       // COUNT of blocks handed out and not yet freed
  StatArray segment;          // COUNT of segments taken from the source
  StatArray active;           // COUNT of blocks allocated or freed but awaiting their last-use fence
  StatArray allocated_bytes;  // SUM of the (rounded) sizes of blocks handed out
  StatArray requested_bytes;  // SUM of the sizes asked for
  StatArray reserved_bytes;   // SUM of segment sizes
  StatArray pending_bytes;    // SUM of freed blocks still waiting for their last-use fence
  std::uint64_t num_alloc_retries = 0;  // COUNT of requests that had to wait for fences or release cache
  std::uint64_t num_ooms = 0;           // COUNT of requests that failed
  std::uint64_t capacity = 0;           // the budget for reserved bytes
  friend bool operator==(const AllocatorStats&, const AllocatorStats&) = default;
};

class CachingAllocator {
 public:
  // `events` (optional) creates the events free(p, stream) records; without it that overload is refused.
  CachingAllocator(AllocatorOptions opts, SegmentSource source, Device* events = nullptr);
  // Waits for pending fences and gives every segment back. Blocks still allocated are reported (warning)
  // and their memory is released with their segments.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes`, aligned to min_block, or nullptr when the budget cannot hold it even
  // after waiting for pending frees and releasing the cache (counted in num_ooms).
  void* try_allocate(std::size_t bytes);
  // As try_allocate, but failure raises OutOfMemory naming the request, the stats and `setting`.
  void* allocate(std::size_t bytes, const char* what = nullptr);
  // Returns a block. It is handed out again only once `last_use` is ready (null: at once).
  void free(void* p, std::shared_ptr<const Fence> last_use = nullptr);
  // Returns a block whose last use is the work enqueued on `stream` so far (records an event).
  void free(void* p, Stream& last_use);

  // Gives back to the source every segment with no block in use or pending. Returns the bytes released.
  std::size_t empty_cache();
  AllocatorStats stats() const;
  void reset_peak_stats();
  const AllocatorOptions& options() const { return opts_; }
  // Size of the block at `p` as handed out (rounded), 0 if `p` is not a live block.
  std::size_t block_size(const void* p) const;
  // Bytes of the budget a request of `bytes` takes: exact with exact_segments, a lower bound otherwise
  // (the rounding to min_block, without the rest of a segment it may leave unusable).
  std::size_t block_bytes(std::size_t bytes) const { return block_bytes(opts_, bytes); }
  static std::size_t block_bytes(const AllocatorOptions& opts, std::size_t bytes);

  struct Impl;

 private:
  AllocatorOptions opts_;
  std::unique_ptr<Impl> impl_;
};

// The device tier's allocator: segments from dev.allocate(); capacity 0 means dev.caps().capacity.
std::unique_ptr<CachingAllocator> make_device_allocator(Device& dev, AllocatorOptions opts);

// Pinned host slabs: segments from dev.allocate_pinned(), so that no transfer ever pins memory of its
// own. Slabs are `slab_bytes` (requests below it share slabs; larger ones get a slab of their own) and
// blocks are page-aligned (O_DIRECT reads and writes go straight into them). on_slab / on_release, when
// set, are told about each slab (e.g. to register it as io_uring fixed buffers).
struct PinnedSlabOptions {
  std::uint64_t capacity = 0;  // required: the pinned budget
  std::size_t slab_bytes = 64 << 20;
  std::string setting = "zero_optimization.offload_param.max_in_cpu";
  std::function<void(void* p, std::size_t bytes)> on_slab;
  std::function<void(void* p, std::size_t bytes)> on_release;
};
std::unique_ptr<CachingAllocator> make_pinned_allocator(Device& dev, PinnedSlabOptions opts);

}  // namespace strata::tiering
