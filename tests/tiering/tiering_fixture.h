// Shared by the tiering tests: a device (parameterised over backends), an NVMe swap store in a scratch
// directory, a tier manager over them, and helpers that write and read tensors through the manager.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/device.h"
#include "nvme/engine.h"
#include "nvme/swap_store.h"
#include "tests/common/scratch_dir.h"
#include "tiering/manager.h"

namespace strata::tiering::test {

using Bytes = std::vector<std::uint8_t>;

inline Bytes random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Bytes v(n);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t x = rng();
    std::memcpy(v.data() + i, &x, 8);
  }
  for (; i < n; ++i) v[i] = std::uint8_t(rng());
  return v;
}

// "t7", "th2.3": tensor names for generated tests.
inline std::string label(const char* prefix, int i, int j = -1) {
  char b[64];
  if (j < 0)
    std::snprintf(b, sizeof b, "%s%d", prefix, i);
  else
    std::snprintf(b, sizeof b, "%s%d.%d", prefix, i, j);
  return b;
}

struct RigOptions {
  std::uint64_t device_budget = 8 << 20;
  std::uint64_t pinned_budget = 8 << 20;
  std::size_t pinned_slab = 2 << 20;
  std::uint64_t nvme_capacity = 64 << 20;  // 0: no NVMe tier
  std::size_t ring = 1 << 16;
};

// Parameterised over device backends; the cuda case skips with the reason when no GPU is visible.
class TieringTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "cuda") {
      std::string why;
      if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA GPU visible: " << why;
    }
  }
  void TearDown() override {
    tm.reset();
    stream.reset();
    swap.reset();
    engine.reset();
    dev.reset();
  }

  void make(const RigOptions& o = {}) {
    dev = open_device({.backend = GetParam(), .ordinal = 0, .memory_cap = 0});
    if (o.nvme_capacity) {
      nvme::AioOptions aio;
      aio.block_size = 256 << 10;
      aio.queue_depth = 8;
      engine = std::make_unique<nvme::AioEngine>(aio);
      swap = std::make_unique<nvme::SwapStore>(
          *engine,
          nvme::SwapOptions{.nvme_path = dir.path(), .capacity = o.nvme_capacity, .grow_bytes = 4 << 20});
    }
    TierOptions to;
    to.device_budget = o.device_budget;
    to.pinned_budget = o.pinned_budget;
    to.pinned_slab_bytes = o.pinned_slab;
    to.event_ring_capacity = o.ring;
    tm = std::make_unique<TierManager>(*dev, to, swap.get());
    stream = dev->create_stream("test");
  }

  TensorId add(const std::string& name, std::uint64_t bytes, Tier home = Tier::pinned,
               Kind kind = Kind::param) {
    return tm->register_tensor(
        {.name = name, .kind = kind, .dtype = DType::u8, .bytes = bytes, .home = home});
  }

  // Writes `data` as the tensor's only valid copy on `tier` (device or pinned).
  void write(TensorId id, Tier tier, const Bytes& data) {
    tm->pin(id);
    void* p = tm->allocate(id, tier);
    if (tier == Tier::pinned) {
      std::memcpy(p, data.data(), data.size());
    } else {
      stream->copy_async(p, data.data(), data.size(), CopyKind::host_to_device);
      stream->synchronize();
    }
    tm->mark_written(id, tier);
    tm->unpin(id);
  }

  // The tensor's bytes, read through a pinned copy (fetched if needed).
  Bytes read(TensorId id) {
    tm->pin(id);
    tm->fetch(id, Tier::pinned).wait();
    const auto* p = static_cast<const std::uint8_t*>(tm->data(id, Tier::pinned));
    Bytes out(p, p + tm->info(id).desc.bytes);
    tm->unpin(id);
    return out;
  }

  // No pool reserves more than its budget.
  void expect_within_budgets(const char* where) {
    for (int t = 0; t < kTierCount; ++t) {
      if (!tm->has_tier(Tier(t))) continue;
      PoolStats s = tm->pool_stats(Tier(t));
      if (s.capacity == 0) continue;
      EXPECT_LE(s.reserved.peak, s.capacity) << to_string(Tier(t)) << " tier over budget " << where;
    }
  }

  strata::test::ScratchDir dir{"tiering"};
  std::unique_ptr<Device> dev;
  std::unique_ptr<nvme::AioEngine> engine;
  std::unique_ptr<nvme::SwapStore> swap;
  std::unique_ptr<TierManager> tm;
  std::unique_ptr<Stream> stream;
};

inline std::string backend_name(const ::testing::TestParamInfo<std::string>& i) {
  return i.param;
}

}  // namespace strata::tiering::test

#define STRATA_TIERING_BACKENDS(Suite)                                         \
  INSTANTIATE_TEST_SUITE_P(Backends, Suite, ::testing::Values("host", "cuda"), \
                           ::strata::tiering::test::backend_name)
