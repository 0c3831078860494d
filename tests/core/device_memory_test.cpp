// Device memory: the cap is enforced on every backend, with a message a user can act on.
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/core/device_fixture.h"

namespace strata::testing {
namespace {

class DeviceMemory : public DeviceTest {};

TEST_P(DeviceMemory, AllocationsPastTheCapFailWithOutOfMemory) {
  constexpr std::size_t cap = 64ull << 20;
  auto dev = open(cap);
  ASSERT_EQ(dev->caps().capacity, cap);
  void* a = dev->allocate(40ull << 20, "a");
  void* b = dev->allocate(24ull << 20, "b");  // exactly fills the cap
  EXPECT_EQ(dev->memory_stats().in_use, cap);
  EXPECT_THROW(dev->allocate(1, "one byte more"), OutOfMemory);
  dev->deallocate(b);
  void* c = dev->allocate(24ull << 20, "c");  // freed bytes are usable again
  EXPECT_EQ(dev->memory_stats().peak_in_use, cap);
  dev->deallocate(a);
  dev->deallocate(c);
  EXPECT_EQ(dev->memory_stats().in_use, 0u);
}

TEST_P(DeviceMemory, OutOfMemoryNamesCapacityInUseRequestedAndTheSettingToChange) {
  auto dev = open(8ull << 20);
  DeviceBuffer held(*dev, 6ull << 20);
  try {
    dev->allocate(4ull << 20, "chunk 3 params");
    FAIL() << "no OutOfMemory";
  } catch (const OutOfMemory& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("8.00 MiB"), std::string::npos) << m;  // capacity
    EXPECT_NE(m.find("in use 6.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("allocating 4.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("for chunk 3 params"), std::string::npos) << m;
    EXPECT_NE(m.find("strata.device_memory_cap"), std::string::npos) << m;
    EXPECT_NE(m.find("offload_param.device"), std::string::npos) << m;
  }
}

TEST_P(DeviceMemory, PinnedHostMemoryIsPageAlignedWritableAndCounted) {
  auto dev = open();
  {
    PinnedBuffer p(*dev, 3 * 4096 + 5);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p.data()) % 4096, 0u);
    std::memset(p.data(), 0xab, p.size());
    EXPECT_EQ(static_cast<unsigned char*>(p.data())[p.size() - 1], 0xab);
    EXPECT_EQ(dev->memory_stats().pinned_in_use, p.size());
  }
  EXPECT_EQ(dev->memory_stats().pinned_in_use, 0u);
}

STRATA_INSTANTIATE_BACKENDS(DeviceMemory);

TEST(DeviceOpen, UnknownBackendIsAConfigErrorListingTheChoices) {
  try {
    open_device({.backend = "tpu"});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("auto, host, cuda"), std::string::npos) << e.what();
  }
}

TEST(DeviceOpen, CudaWithoutAGpuSaysWhyAndWhatToUseInstead) {
  std::string why;
  if (cuda_device_count(&why) > 0) GTEST_SKIP() << "a CUDA GPU is visible; this checks the no-GPU path";
  try {
    open_device({.backend = "cuda"});
    FAIL();
  } catch (const BackendError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(why), std::string::npos) << m;
    EXPECT_NE(m.find("\"host\""), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace strata::testing
