// ExtentAllocator: alignment, best fit, merging of holes, the high-water mark and the capacity.
#include <gtest/gtest.h>

#include "core/error.h"
#include "nvme/extent_allocator.h"

namespace strata::nvme {
namespace {

TEST(ExtentAllocator, ExtentsAreAlignedAndReserveWholeUnits) {
  ExtentAllocator a(4096, 0);
  auto x = a.allocate(1), y = a.allocate(4097), z = a.allocate(0);
  ASSERT_TRUE(x && y && z);
  EXPECT_EQ(*x, 0u);
  EXPECT_EQ(*y, 4096u);
  EXPECT_EQ(*z, 3u * 4096);
  EXPECT_EQ(a.reserved(*y), 2u * 4096);
  EXPECT_EQ(a.end(), 4u * 4096);
}

TEST(ExtentAllocator, BestFitPicksTheSmallestHoleThatHolds) {
  ExtentAllocator a(4096, 0);
  std::vector<std::uint64_t> o;
  for (std::uint64_t s : {3, 1, 2, 1, 1}) o.push_back(*a.allocate(s * 4096));
  a.free(o[0]);  // hole of 3 units at 0
  a.free(o[2]);  // hole of 2 units at 4
  auto p = a.allocate(2 * 4096);
  ASSERT_TRUE(p);
  EXPECT_EQ(*p, o[2]);
  EXPECT_EQ(a.stats().reused, 1u);
}

TEST(ExtentAllocator, NeighbouringHolesMergeAndAHoleAtTheEndLowersTheHighWaterMark) {
  ExtentAllocator a(4096, 0);
  auto x = *a.allocate(4096), y = *a.allocate(4096), z = *a.allocate(4096), w = *a.allocate(4096);
  a.free(x);
  a.free(z);
  EXPECT_EQ(a.stats().holes, 2u);
  a.free(y);  // x, y, z become one hole
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.holes, 1u);
  EXPECT_EQ(s.hole_bytes, 3u * 4096);
  EXPECT_EQ(s.fragmentation(), 0.0);
  a.free(w);  // everything free: no holes, nothing reserved
  s = a.stats();
  EXPECT_EQ(s.holes, 0u);
  EXPECT_EQ(s.end, 0u);
  EXPECT_EQ(s.extents.current, 0u);
  EXPECT_EQ(s.extents.peak, 4u);
  EXPECT_EQ(s.reserved_bytes.freed, 4u * 4096);
}

TEST(ExtentAllocator, CapacityBoundsTheHighWaterMark) {
  ExtentAllocator a(4096, 3 * 4096);
  EXPECT_TRUE(a.allocate(2 * 4096));
  EXPECT_FALSE(a.allocate(2 * 4096));
  EXPECT_TRUE(a.allocate(4096));
  EXPECT_FALSE(a.allocate(1));
}

TEST(ExtentAllocator, FreeingWhatWasNotAllocatedIsAnError) {
  ExtentAllocator a(4096, 0);
  auto x = *a.allocate(4096);
  EXPECT_THROW(a.free(x + 4096), Error);
  a.free(x);
  EXPECT_THROW(a.free(x), Error);
}

TEST(ExtentAllocator, AlignmentMustBeAPowerOfTwo) {
  EXPECT_THROW(ExtentAllocator(3000, 0), Error);
}

}  // namespace
}  // namespace strata::nvme
