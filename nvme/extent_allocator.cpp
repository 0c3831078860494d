#include "nvme/extent_allocator.h"

#include <algorithm>

#include "core/error.h"

namespace strata::nvme {

void Stat::add(std::uint64_t n) {
  current += n;
  allocated += n;
  peak = std::max(peak, current);
}

void Stat::sub(std::uint64_t n) {
  current -= n;
  freed += n;
}

double AllocatorStats::fragmentation() const {
  return hole_bytes == 0 ? 0.0 : 1.0 - double(largest_hole) / double(hole_bytes);
}

ExtentAllocator::ExtentAllocator(std::uint64_t alignment, std::uint64_t capacity)
    : align_(alignment), capacity_(capacity) {
  STRATA_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0, "extent alignment ", alignment,
               " is not a power of two");
}

void ExtentAllocator::add_hole(std::uint64_t off, std::uint64_t bytes) {
  holes_.emplace(off, bytes);
  by_size_.emplace(bytes, off);
  hole_bytes_ += bytes;
}

void ExtentAllocator::remove_hole(std::map<std::uint64_t, std::uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  hole_bytes_ -= it->second;
  holes_.erase(it);
}

std::optional<std::uint64_t> ExtentAllocator::allocate(std::uint64_t bytes) {
  const std::uint64_t size = std::max<std::uint64_t>((bytes + align_ - 1) / align_ * align_, align_);
  std::uint64_t off;
  auto fit = by_size_.lower_bound({size, 0});
  if (fit != by_size_.end()) {
    // Best fit: the smallest hole that holds it; the rest of the hole stays a hole.
    off = fit->second;
    std::uint64_t hole = fit->first;
    remove_hole(holes_.find(off));
    if (hole > size) add_hole(off + size, hole - size);
    ++reused_;
  } else {
    // Grow at the end (free() never leaves a hole touching the end, so there is nothing to extend).
    off = end_;
    if (capacity_ != 0 && off + size > capacity_) return std::nullopt;
    end_ = off + size;
  }
  used_.emplace(off, size);
  extents_.add(1);
  reserved_.add(size);
  return off;
}

void ExtentAllocator::free(std::uint64_t offset) {
  auto it = used_.find(offset);
  STRATA_CHECK(it != used_.end(), "free of swap extent at offset ", offset,
               ": no live extent starts there (freed twice, or never allocated)");
  std::uint64_t off = it->first, size = it->second;
  used_.erase(it);
  extents_.sub(1);
  reserved_.sub(size);
  // Merge with the holes on either side.
  auto next = holes_.lower_bound(off);
  if (next != holes_.end() && next->first == off + size) {
    size += next->second;
    remove_hole(next);
  }
  auto prev = holes_.lower_bound(off);
  if (prev != holes_.begin()) {
    --prev;
    if (prev->first + prev->second == off) {
      off = prev->first;
      size += prev->second;
      remove_hole(prev);
    }
  }
  if (off + size == end_)
    end_ = off;  // the free space reaches the end: lower the high-water mark instead of keeping a hole
  else
    add_hole(off, size);
}

std::uint64_t ExtentAllocator::reserved(std::uint64_t offset) const {
  auto it = used_.find(offset);
  return it == used_.end() ? 0 : it->second;
}

AllocatorStats ExtentAllocator::stats() const {
  AllocatorStats s;
  s.alignment = align_;
  s.capacity = capacity_;
  s.extents = extents_;
  s.reserved_bytes = reserved_;
  s.end = end_;
  s.holes = holes_.size();
  s.hole_bytes = hole_bytes_;
  s.largest_hole = by_size_.empty() ? 0 : by_size_.rbegin()->first;
  s.reused = reused_;
  return s;
}

}  // namespace strata::nvme
