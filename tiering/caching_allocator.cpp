#include "tiering/caching_allocator.h"

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/log.h"

// Note [fenced reuse]
// A block that is freed while a copy or an I/O request may still read or write it (the source of an
// eviction, a staging buffer, a block the compute stream last used) must not be handed to anyone else
// until that work is done: on the cuda backend free() returns long before the GPU reaches the copy, and
// on the host backend the stream's worker thread may still be in its memcpy. So free() takes the fence of
// the block's last use and parks the block on a pending list; blocks are moved to the free lists only
// once their fence is ready (checked, without blocking, at every allocation). PyTorch's allocator does
// the same with the events of record_stream(). When an allocation cannot be met otherwise, the allocator
// waits for the pending fences rather than fail: fences are signalled by the device or by the mover's
// worker threads, and neither ever takes this allocator's mutex or the tier manager's, so the wait ends.
// The cost of the rule is memory that is free but not yet reusable; pending_bytes reports it.
//
// Threads: segments are allocated and released (Device::allocate / deallocate, allocate_pinned /
// deallocate_pinned) and event fences are queried on the thread that calls the allocator, which has
// bound the device (Note [thread device] in core/device.h). The cuda backend makes its device current in
// those entry points too, so a pinned free from any thread never touches another GPU.

namespace strata::tiering {
namespace {

std::size_t round_up(std::size_t n, std::size_t m) {
  return (n + m - 1) / m * m;
}

struct Segment;

struct Block {
  char* ptr = nullptr;
  std::size_t size = 0;       // bytes this block spans in its segment
  std::size_t requested = 0;  // bytes asked for (allocated blocks)
  bool allocated = false;
  bool pending = false;  // freed, waiting for `fence`
  Segment* seg = nullptr;
  Block* prev = nullptr;  // neighbours in the segment, by address
  Block* next = nullptr;
  std::shared_ptr<const Fence> fence;
};

struct Segment {
  char* base = nullptr;
  std::size_t size = 0;
  bool small = false;
  Block* head = nullptr;  // the block at `base`; never merged away (it has no previous block)
};

struct BySize {
  bool operator()(const Block* a, const Block* b) const {
    return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
  }
};

}  // namespace

struct CachingAllocator::Impl {
  AllocatorOptions opts;
  SegmentSource src;
  Device* events = nullptr;

  std::mutex mu;  // guards everything below
  std::set<Block*, BySize> free_small, free_large;
  std::unordered_map<const void*, Block*> live;
  std::vector<Block*> pending;
  std::vector<std::unique_ptr<Segment>> segments;
  AllocatorStats stats;

  // ---- private helpers: the mutex is held ----

  template <typename F>
  void update(bool small, F&& f) {
    f(0);
    f(small ? 1 : 2);
  }
  std::set<Block*, BySize>& free_set(bool small) { return small ? free_small : free_large; }

  bool is_free(const Block* b) const { return b && !b->allocated && !b->pending; }

  // Places `b` (not in any set) on its free list, merged with free neighbours.
  void insert_free(Block* b) {
    auto& fs = free_set(b->seg->small);
    if (is_free(b->prev)) {
      Block* p = b->prev;
      fs.erase(p);
      p->size += b->size;
      p->next = b->next;
      if (b->next) b->next->prev = p;
      delete b;
      b = p;
    }
    if (is_free(b->next)) {
      Block* n = b->next;
      fs.erase(n);
      b->size += n->size;
      b->next = n->next;
      if (n->next) n->next->prev = b;
      delete n;
    }
    fs.insert(b);
  }

  // A block that finished its last use becomes free.
  void retire(Block* b) {
    update(b->seg->small, [&](int i) { stats.active[i].sub(1); });
    insert_free(b);
  }

  void process_ready() {
    auto keep = pending.begin();
    for (Block* b : pending) {
      if (b->fence && !b->fence->ready()) {
        *keep++ = b;
        continue;
      }
      b->pending = false;
      b->fence.reset();
      update(b->seg->small, [&](int i) { stats.pending_bytes[i].sub(b->size); });
      retire(b);
    }
    pending.erase(keep, pending.end());
  }

  void wait_pending() {
    for (Block* b : pending)
      if (b->fence) b->fence->wait();
    process_ready();
  }

  // Cuts `b` to `size` when the rest is worth keeping, putting the rest on the free list.
  void split(Block* b, std::size_t size) {
    std::size_t rest = b->size - size;
    bool small = b->seg->small;
    if (small ? rest < opts.min_block : rest <= opts.small_size) return;
    Block* r = new Block;
    r->ptr = b->ptr + size;
    r->size = rest;
    r->seg = b->seg;
    r->prev = b;
    r->next = b->next;
    if (b->next) b->next->prev = r;
    b->next = r;
    b->size = size;
    insert_free(r);
  }

  Block* take_free(bool small, std::size_t size) {
    auto& fs = free_set(small);
    Block key;
    key.size = size;
    auto it = fs.lower_bound(&key);
    if (it == fs.end()) return nullptr;
    Block* b = *it;
    if (opts.exact_segments && b->size != size) return nullptr;
    fs.erase(it);
    b->allocated = true;  // before split: the rest must not merge back into it
    split(b, size);
    return b;
  }

  Block* new_segment(bool small, std::size_t size) {
    std::size_t want = opts.exact_segments           ? size
                       : small                       ? opts.small_segment
                       : size < opts.min_large_alloc ? opts.large_segment
                                                     : round_up(size, opts.round_large);
    want = std::max(want, size);
    std::uint64_t reserved = stats.reserved_bytes[0].current;
    if (reserved + want > opts.capacity) {
      if (reserved + size > opts.capacity) return nullptr;
      want = size;  // the budget's last bytes: a segment of exactly the request
    }
    void* p = nullptr;
    try {
      p = src.allocate(want);
    } catch (const OutOfMemory&) {
      return nullptr;
    }
    if (!p) return nullptr;
    auto seg = std::make_unique<Segment>();
    seg->base = static_cast<char*>(p);
    seg->size = want;
    seg->small = small;
    Block* b = new Block;
    b->ptr = seg->base;
    b->size = want;
    b->seg = seg.get();
    b->allocated = true;
    seg->head = b;
    segments.push_back(std::move(seg));
    update(small, [&](int i) {
      stats.segment[i].add(1);
      stats.reserved_bytes[i].add(want);
    });
    split(b, size);
    return b;
  }

  // Gives cached free segments back to the source: all of them, or (exact_segments) only as many as it
  // takes for `room` bytes to fit the budget, oldest first. When the source throws (a device error, a
  // thread that has not bound the device), the segment it refused and those not yet looked at stay
  // cached and consistent, and the exception propagates.
  std::size_t release_cached(std::size_t room = SIZE_MAX) {
    std::size_t released = 0;
    const bool all = room == SIZE_MAX || !opts.exact_segments;
    auto fits = [&] { return stats.reserved_bytes[0].current + room <= opts.capacity; };
    auto keep = segments.begin(), it = segments.begin();
    try {
      for (; it != segments.end(); ++it) {
        Segment* seg = it->get();
        Block* h = seg->head;
        if (!(is_free(h) && h->next == nullptr) || (!all && fits())) {
          *keep++ = std::move(*it);
          continue;
        }
        src.release(seg->base, seg->size);  // first: nothing has changed yet if it throws
        free_set(seg->small).erase(h);
        delete h;
        update(seg->small, [&](int i) {
          stats.segment[i].sub(1);
          stats.reserved_bytes[i].sub(seg->size);
        });
        released += seg->size;
      }
    } catch (...) {
      for (; it != segments.end(); ++it) *keep++ = std::move(*it);
      segments.erase(keep, segments.end());
      throw;
    }
    segments.erase(keep, segments.end());
    return released;
  }

  void* hand_out(Block* b, std::size_t bytes) {
    b->allocated = true;
    b->requested = bytes;
    live[b->ptr] = b;
    update(b->seg->small, [&](int i) {
      stats.allocation[i].add(1);
      stats.active[i].add(1);
      stats.allocated_bytes[i].add(b->size);
      stats.requested_bytes[i].add(bytes);
    });
    return b->ptr;
  }

  Block* find(bool small, std::size_t size) {
    if (Block* b = take_free(small, size)) return b;
    return new_segment(small, size);
  }

  void* try_allocate(std::size_t bytes) {
    std::size_t size = round_up(std::max<std::size_t>(bytes, 1), opts.min_block);
    bool small = size <= opts.small_size;
    process_ready();
    Block* b = find(small, size);
    bool retried = false;
    if (!b && !pending.empty()) {
      retried = true;
      wait_pending();
      b = find(small, size);
    }
    if (!b && release_cached(opts.exact_segments ? size : SIZE_MAX) > 0) {
      retried = true;
      b = new_segment(small, size);
    }
    if (retried) ++stats.num_alloc_retries;
    if (!b) {
      ++stats.num_ooms;
      return nullptr;
    }
    return hand_out(b, bytes);
  }

  void free(void* p, std::shared_ptr<const Fence> fence) {
    if (!p) return;
    auto it = live.find(p);
    STRATA_CHECK(it != live.end(), "the ", opts.name, " allocator was asked to free ", p,
                 ", which is not a live block of it (double free, or memory from elsewhere)");
    Block* b = it->second;
    live.erase(it);
    b->allocated = false;
    update(b->seg->small, [&](int i) {
      stats.allocation[i].sub(1);
      stats.allocated_bytes[i].sub(b->size);
      stats.requested_bytes[i].sub(b->requested);
    });
    b->requested = 0;
    if (fence && !fence->ready()) {
      b->pending = true;
      b->fence = std::move(fence);
      pending.push_back(b);
      update(b->seg->small, [&](int i) { stats.pending_bytes[i].add(b->size); });
      return;
    }
    retire(b);
  }
};

CachingAllocator::CachingAllocator(AllocatorOptions opts, SegmentSource source, Device* events)
    : opts_(std::move(opts)), impl_(std::make_unique<Impl>()) {
  STRATA_CHECK(opts_.capacity > 0, "the ", opts_.name, " pool needs a capacity (", opts_.setting, ")");
  STRATA_CHECK(opts_.min_block > 0 && (opts_.min_block & (opts_.min_block - 1)) == 0,
               "min_block must be a power of two, not ", opts_.min_block);
  STRATA_CHECK(source.allocate && source.release, "a caching allocator needs a segment source");
  impl_->opts = opts_;
  impl_->src = std::move(source);
  impl_->events = events;
  impl_->stats.capacity = opts_.capacity;
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->wait_pending();
  if (!impl_->live.empty())
    STRATA_LOG_WARN("the ", opts_.name, " allocator is destroyed with ", impl_->live.size(),
                    " blocks still allocated (", format_bytes(impl_->stats.allocated_bytes[0].current),
                    "); their memory is released with it");
  for (auto& seg : impl_->segments) {
    for (Block* b = seg->head; b;) {
      Block* n = b->next;
      delete b;
      b = n;
    }
    try {  // a destructor cannot throw: a refused release leaks the segment, said once
      impl_->src.release(seg->base, seg->size);
    } catch (const std::exception& e) {
      STRATA_WARN_ONCE("the ", opts_.name,
                       " allocator could not release a segment at destruction: ", e.what());
    }
  }
}

void* CachingAllocator::try_allocate(std::size_t bytes) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->try_allocate(bytes);
}

void* CachingAllocator::allocate(std::size_t bytes, const char* what) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  if (void* p = impl_->try_allocate(bytes)) return p;
  const AllocatorStats& s = impl_->stats;
  std::uint64_t reserved = s.reserved_bytes[0].current, allocated = s.allocated_bytes[0].current;
  std::uint64_t pending = s.pending_bytes[0].current;
  throw OutOfMemory(strata::detail::cat(
      "out of ", opts_.name, " memory allocating ", format_bytes(bytes), what && *what ? " for " : "",
      what ? what : "", ": capacity ", format_bytes(opts_.capacity), ", allocated ", format_bytes(allocated),
      ", reserved ", format_bytes(reserved), " (cached free ", format_bytes(reserved - allocated - pending),
      "), free ", format_bytes(opts_.capacity - reserved),
      ". The request does not fit in one piece even after releasing the cache; raise ", opts_.setting,
      " or keep less state in this tier."));
}

void CachingAllocator::free(void* p, std::shared_ptr<const Fence> last_use) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->free(p, std::move(last_use));
}

void CachingAllocator::free(void* p, Stream& last_use) {
  STRATA_CHECK(impl_->events, "the ", opts_.name,
               " allocator has no device to record events with; free with a Fence instead");
  std::unique_ptr<Event> e = impl_->events->create_event();
  last_use.record(*e);
  auto fence = std::make_shared<EventFence>(std::move(e));
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->free(p, std::move(fence));
}

std::size_t CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->process_ready();
  return impl_->release_cached();
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->process_ready();  // blocks whose last use has ended are free, not pending
  return impl_->stats;
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lk(impl_->mu);
  AllocatorStats& s = impl_->stats;
  for (StatArray* a : {&s.allocation, &s.segment, &s.active, &s.allocated_bytes, &s.requested_bytes,
                       &s.reserved_bytes, &s.pending_bytes})
    for (Stat& st : *a) st.reset_peak();
}

std::size_t CachingAllocator::block_size(const void* p) const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  auto it = impl_->live.find(p);
  return it == impl_->live.end() ? 0 : it->second->size;
}

std::size_t CachingAllocator::block_bytes(const AllocatorOptions& opts, std::size_t bytes) {
  return round_up(std::max<std::size_t>(bytes, 1), opts.min_block);
}

std::unique_ptr<CachingAllocator> make_device_allocator(Device& dev, AllocatorOptions opts) {
  if (opts.capacity == 0) opts.capacity = dev.caps().capacity;
  SegmentSource src{[&dev](std::size_t n) { return dev.allocate(n, "caching allocator segment"); },
                    [&dev](void* p, std::size_t) { dev.deallocate(p); }};
  return std::make_unique<CachingAllocator>(std::move(opts), std::move(src), &dev);
}

std::unique_ptr<CachingAllocator> make_pinned_allocator(Device& dev, PinnedSlabOptions p) {
  AllocatorOptions opts;
  opts.name = "pinned";
  opts.capacity = p.capacity;
  opts.min_block = 4096;
  opts.small_size = 1 << 20;
  opts.small_segment = 2 << 20;
  opts.large_segment = std::max<std::size_t>(p.slab_bytes, 2 << 20);
  opts.min_large_alloc = opts.large_segment;
  opts.round_large = 2 << 20;
  opts.setting = p.setting;
  SegmentSource src{[&dev, on = p.on_slab](std::size_t n) {
                      void* ptr = dev.allocate_pinned(n);
                      if (on) on(ptr, n);
                      return ptr;
                    },
                    [&dev, off = p.on_release](void* ptr, std::size_t n) {
                      if (off) off(ptr, n);
                      dev.deallocate_pinned(ptr);
                    }};
  return std::make_unique<CachingAllocator>(std::move(opts), std::move(src), &dev);
}

}  // namespace strata::tiering
