// strata/tiering/pool.h: one interface for the memory of a tier — device (caching allocator over the
// Device), pinned host (slabs) and NVMe (extents of nvme's SwapStore).
//
// Example:
//   auto pinned = strata::tiering::make_caching_pool(Tier::pinned, make_pinned_allocator(dev, {...}));
//   PoolBlock b = pinned->try_allocate(bytes);      // empty when the budget cannot hold it
//   ... use b.ptr ...
//   pinned->free(b, fence);                         // handed out again once `fence` is ready
//
// What differs between tiers is stated in PoolCaps (STYLE.md item 5), not tested for by callers:
// `addressable` pools give a pointer, the NVMe pool an extent that only I/O reaches.
//
// Locking: every method may be called from any thread; each pool has its own mutex.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "nvme/swap_store.h"
#include "tiering/caching_allocator.h"
#include "tiering/fence.h"
#include "tiering/types.h"

namespace strata::tiering {

// A piece of a tier: a pointer (device, pinned) or an NVMe extent.
struct PoolBlock {
  void* ptr = nullptr;      // device or pinned address; null on NVMe
  nvme::SwapExtent extent;  // NVMe only
  std::uint64_t bytes = 0;  // bytes asked for
  explicit operator bool() const { return ptr != nullptr || bool(extent); }
};

struct PoolCaps {
  Tier tier = Tier::device;
  bool addressable = true;        // blocks have a pointer (false: NVMe, reached by I/O only)
  bool host_addressable = false;  // that pointer can be dereferenced on the CPU
  std::uint64_t alignment = 1;    // of block addresses (pointer pools) or file offsets (NVMe)
};

struct PoolStats {
  std::uint64_t capacity = 0;  // the budget; 0: unlimited (an NVMe store without a capacity)
  Stat used;                   // SUM of the bytes asked for by live blocks
  Stat reserved;               // SUM of the bytes taken from the tier (segments; extents' aligned sizes)
  Stat blocks;                 // COUNT of live blocks
  std::uint64_t pending = 0;   // CURRENT bytes freed but still waiting for their last use
  std::uint64_t free = 0;      // CURRENT capacity - reserved (unlimited NVMe: the file system's free space)
  std::uint64_t retries = 0;   // COUNT of allocations that waited for pending frees or released cache
  std::uint64_t ooms = 0;      // COUNT of allocations that failed
};

class TierPool {
 public:
  virtual ~TierPool() = default;
  virtual const PoolCaps& caps() const = 0;
  // A block of `bytes`, or an empty one when the tier cannot hold it after the pool's own retries
  // (waiting for pending frees, releasing cached memory).
  virtual PoolBlock try_allocate(std::uint64_t bytes) = 0;
  // Returns a block; it is reused only once `last_use` is ready (null: at once).
  virtual void free(const PoolBlock& b, std::shared_ptr<const Fence> last_use) = 0;
  virtual PoolStats stats() const = 0;
  // The caching allocator behind a pointer pool (its PyTorch-style stats), or null (NVMe).
  virtual const CachingAllocator* allocator() const { return nullptr; }
};

std::unique_ptr<TierPool> make_caching_pool(Tier tier, std::unique_ptr<CachingAllocator> alloc,
                                            bool host_addressable);
// `store` must outlive the pool.
std::unique_ptr<TierPool> make_nvme_pool(nvme::SwapStore& store);

}  // namespace strata::tiering
