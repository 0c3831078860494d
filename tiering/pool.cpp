#include "tiering/pool.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "core/files.h"

namespace strata::tiering {
namespace {

class CachingPool final : public TierPool {
 public:
  CachingPool(Tier tier, std::unique_ptr<CachingAllocator> alloc, bool host_addressable)
      : alloc_(std::move(alloc)) {
    caps_.tier = tier;
    caps_.addressable = true;
    caps_.host_addressable = host_addressable;
    caps_.alignment = alloc_->options().min_block;
  }
  const PoolCaps& caps() const override { return caps_; }
  PoolBlock try_allocate(std::uint64_t bytes) override {
    PoolBlock b;
    b.ptr = alloc_->try_allocate(bytes);
    if (b.ptr) b.bytes = bytes;
    return b;
  }
  void free(const PoolBlock& b, std::shared_ptr<const Fence> last_use) override {
    alloc_->free(b.ptr, std::move(last_use));
  }
  PoolStats stats() const override {
    AllocatorStats a = alloc_->stats();
    PoolStats s;
    s.capacity = a.capacity;
    s.used = a.requested_bytes[0];
    s.reserved = a.reserved_bytes[0];
    s.blocks = a.allocation[0];
    s.pending = a.pending_bytes[0].current;
    s.free = a.capacity - std::min(a.capacity, s.reserved.current);
    s.retries = a.num_alloc_retries;
    s.ooms = a.num_ooms;
    return s;
  }
  const CachingAllocator* allocator() const override { return alloc_.get(); }

 private:
  PoolCaps caps_;
  std::unique_ptr<CachingAllocator> alloc_;
};

// NVMe extents. Frees wait for their fence like the caching allocator's (an extent must not be reused
// while a read of it may still be running); SwapStore::allocate's OutOfMemory means "full".
class NvmePool final : public TierPool {
 public:
  explicit NvmePool(nvme::SwapStore& store) : store_(store) {
    caps_.tier = Tier::nvme;
    caps_.addressable = false;
    caps_.alignment = store.alignment();
  }
  ~NvmePool() override {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& p : pending_) p.second->wait();
    process_ready();
  }
  const PoolCaps& caps() const override { return caps_; }

  PoolBlock try_allocate(std::uint64_t bytes) override {
    std::lock_guard<std::mutex> lk(mu_);
    process_ready();
    PoolBlock b = attempt(bytes);
    if (!b && !pending_.empty()) {
      ++retries_;
      for (auto& p : pending_) p.second->wait();
      process_ready();
      b = attempt(bytes);
    }
    if (!b) ++ooms_;
    return b;
  }
  void free(const PoolBlock& b, std::shared_ptr<const Fence> last_use) override {
    std::lock_guard<std::mutex> lk(mu_);
    if (last_use && !last_use->ready()) {
      pending_.emplace_back(b, std::move(last_use));
      pending_bytes_ += b.bytes;
      return;
    }
    release(b);
  }
  PoolStats stats() const override {
    nvme::SwapStats st = store_.stats();
    std::lock_guard<std::mutex> lk(mu_);
    PoolStats s;
    s.capacity = st.capacity_bytes;
    s.used = used_;
    s.reserved = reserved_;
    s.blocks = blocks_;
    s.pending = pending_bytes_;
    s.free = s.capacity ? s.capacity - std::min(s.capacity, reserved_.current)
                        : free_disk_bytes(store_.run_dir()).value_or(0) + st.hole_bytes;
    s.retries = retries_;
    s.ooms = ooms_;
    return s;
  }

 private:
  std::uint64_t aligned(std::uint64_t n) const {
    std::uint64_t a = caps_.alignment;
    return std::max<std::uint64_t>(a, (n + a - 1) / a * a);
  }
  PoolBlock attempt(std::uint64_t bytes) {
    PoolBlock b;
    try {
      b.extent = store_.allocate(bytes);
    } catch (const OutOfMemory&) {
      return b;
    }
    b.bytes = bytes;
    used_.add(bytes);
    reserved_.add(aligned(bytes));
    blocks_.add(1);
    return b;
  }
  void release(const PoolBlock& b) {
    store_.free(b.extent);
    used_.sub(b.bytes);
    reserved_.sub(aligned(b.bytes));
    blocks_.sub(1);
  }
  void process_ready() {
    auto keep = pending_.begin();
    for (auto& p : pending_) {
      if (!p.second->ready()) {
        *keep++ = std::move(p);
        continue;
      }
      pending_bytes_ -= p.first.bytes;
      release(p.first);
    }
    pending_.erase(keep, pending_.end());
  }

  nvme::SwapStore& store_;
  PoolCaps caps_;
  mutable std::mutex mu_;  // guards everything below
  std::vector<std::pair<PoolBlock, std::shared_ptr<const Fence>>> pending_;
  Stat used_, reserved_, blocks_;
  std::uint64_t pending_bytes_ = 0, retries_ = 0, ooms_ = 0;
};

}  // namespace

std::unique_ptr<TierPool> make_caching_pool(Tier tier, std::unique_ptr<CachingAllocator> alloc,
                                            bool host_addressable) {
  return std::make_unique<CachingPool>(tier, std::move(alloc), host_addressable);
}

std::unique_ptr<TierPool> make_nvme_pool(nvme::SwapStore& store) {
  return std::make_unique<NvmePool>(store);
}

}  // namespace strata::tiering
