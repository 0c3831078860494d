// The tiering module's threads bind the device (Note [thread device] in core/device.h): on a host device
// at ordinal 1 that refuses unbound threads (DeviceOptions::check_thread_device), moves over the six paths
// run on the manager's mover threads, pinned slabs are freed from another bound thread (an unbound one is
// refused and leaves them cached), and the memprof trace writer's thread reads the manager's figures, which
// query the device's events.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "core/error.h"
#include "tests/common/stream_gate.h"
#include "tests/tiering/tiering_fixture.h"
#include "tiering/caching_allocator.h"
#include "tiering/trace_writer.h"

namespace strata::tiering {
namespace {

using test::Bytes;
using test::random_bytes;

DeviceOptions checked_device() {
  return {.backend = "host", .ordinal = 1, .memory_cap = 0, .check_thread_device = true};
}

// A host device at ordinal 1 with checking, an NVMe store and a manager over them, built on this thread.
struct Rig {
  Rig() : dev(open_device(checked_device())), engine(aio()) {
    swap = std::make_unique<nvme::SwapStore>(
        engine, nvme::SwapOptions{.nvme_path = dir.path(), .capacity = 64 << 20, .grow_bytes = 4 << 20});
    TierOptions to;
    to.device_budget = 8 << 20;
    to.pinned_budget = 8 << 20;
    to.pinned_slab_bytes = 2 << 20;
    tm = std::make_unique<TierManager>(*dev, to, swap.get());
  }
  static nvme::AioOptions aio() {
    nvme::AioOptions a;
    a.block_size = 256 << 10;
    a.queue_depth = 8;
    return a;
  }
  TensorId add(std::uint64_t bytes, const Bytes& data) {
    TensorId id = tm->register_tensor(
        {.name = "t", .kind = Kind::param, .dtype = DType::u8, .bytes = bytes, .home = Tier::nvme});
    std::memcpy(tm->allocate(id, Tier::pinned), data.data(), data.size());
    tm->mark_written(id, Tier::pinned);
    return id;
  }
  strata::test::ScratchDir dir{"tiering-thread-device"};
  std::unique_ptr<Device> dev;
  nvme::AioEngine engine;
  std::unique_ptr<nvme::SwapStore> swap;
  std::unique_ptr<TierManager> tm;
};

TEST(TieringThreadDevice, TheSixPathsRunOnBoundMoverThreads) {
  Rig r;
  const std::size_t n = 777'777;
  const Bytes data = random_bytes(n, 11);
  const TensorId id = r.add(n, data);
  const Tier route[] = {Tier::pinned, Tier::nvme, Tier::device, Tier::pinned,
                        Tier::device, Tier::nvme, Tier::pinned};
  for (std::size_t i = 0; i + 1 < std::size(route); ++i) {
    Move m = r.tm->evict(id, route[i], route[i + 1]);
    ASSERT_TRUE(m);
    EXPECT_NO_THROW(m.wait()) << to_string(route[i]) << " -> " << to_string(route[i + 1]);
  }
  const auto* p = static_cast<const std::uint8_t*>(r.tm->data(id, Tier::pinned));
  EXPECT_EQ(Bytes(p, p + n), data);
}

TEST(TieringThreadDevice, MovesIssuedFromAnotherBoundThreadComplete) {
  Rig r;
  const std::size_t n = 300'000;
  const Bytes data = random_bytes(n, 12);
  const TensorId id = r.add(n, data);
  std::string error;
  std::thread t([&] {
    try {
      r.dev->bind_thread();
      r.tm->evict(id, Tier::pinned, Tier::device).wait();
      r.tm->evict(id, Tier::device, Tier::nvme).wait();
      r.tm->fetch(id, Tier::pinned).wait();
    } catch (const Error& e) {
      error = e.what();
    }
  });
  t.join();
  EXPECT_EQ(error, "");
  const auto* p = static_cast<const std::uint8_t*>(r.tm->data(id, Tier::pinned));
  EXPECT_EQ(Bytes(p, p + n), data);
}

TEST(TieringThreadDevice, PinnedSlabsAreFreedFromAnotherBoundThread) {
  auto dev = open_device(checked_device());
  PinnedSlabOptions po;
  po.capacity = 8 << 20;
  po.slab_bytes = 2 << 20;
  auto alloc = make_pinned_allocator(*dev, po);
  void* a = alloc->allocate(3 << 20, "a");  // a slab of its own
  void* b = alloc->allocate(4096, "b");
  ASSERT_GT(dev->memory_stats().pinned_in_use, 0u);
  std::string unbound, bound;
  std::thread t([&] {
    try {
      alloc->free(a, nullptr);
      alloc->free(b, nullptr);
      alloc->empty_cache();  // releases the slabs: Device::deallocate_pinned on an unbound thread
    } catch (const Error& e) {
      unbound = e.what();
    }
    try {
      dev->bind_thread();
      alloc->empty_cache();
    } catch (const Error& e) {
      bound = e.what();
    }
  });
  t.join();
  EXPECT_NE(unbound.find("Device::deallocate_pinned called from thread"), std::string::npos) << unbound;
  EXPECT_EQ(bound, "") << "the refused release left the slabs cached for the bound thread to free";
  EXPECT_EQ(dev->memory_stats().pinned_in_use, 0u);
  EXPECT_EQ(alloc->stats().reserved_bytes[0].current, 0u);
}

// Until close(), only the writer's thread drains. Each drain writes the new events, then reads the
// manager's figures, which asks the device's events whether blocks freed after them are reusable.
TEST(TieringThreadDevice, TheTraceWriterThreadQueriesTheDeviceBound) {
  Rig r;
  auto held = r.dev->create_stream("held");
  auto after = r.dev->create_event();
  strata::test::StreamGate gate;                             // after the stream: opened before it goes
  const std::size_t earlier = r.tm->events_since(0).size();  // before the writer: not written
  TraceWriter w(*r.tm, {.path = r.dir.file("trace.jsonl"), .sample_interval_ms = 1});
  const Bytes data = random_bytes(100'000, 13);
  const TensorId id = r.add(data.size(), data);
  r.tm->fetch(id, Tier::device).wait();
  gate.hold(*held);
  held->record(*after);
  r.tm->unregister_tensor(id, after.get());  // its blocks wait for `after`, which the gate holds
  // Waits (bounded) until the writer has written `n` events; false when it does not.
  auto written = [&](std::uint64_t n) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (w.stats().events < n && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return w.stats().events >= n;
  };
  const std::uint64_t removed = r.tm->events_since(0).size() - earlier;
  ASSERT_TRUE(written(removed)) << "the writer thread did not drain";
  // A later event is written by a later drain, so the drain that wrote the removal has also read the
  // figures with the blocks still waiting: the writer's thread asked the device while the gate was shut.
  r.tm->set_step(1, Phase::forward);
  EXPECT_TRUE(written(removed + 1)) << "the writer thread stopped (see its error above)";
  gate.open();
  EXPECT_NO_THROW(w.close());
}

}  // namespace
}  // namespace strata::tiering
