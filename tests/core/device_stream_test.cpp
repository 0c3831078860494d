// Streams and events: copies run in order and move bytes exactly; events order work across streams and
// threads. Work that must not have run yet is held by a gate (tests/common/stream_gate.h), not a sleep.
// (How far a copy overlaps the caller's work is measured by bench/core/overlap_bench.)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "core/error.h"
#include "tests/common/stream_gate.h"
#include "tests/core/device_fixture.h"

namespace strata::testing {
namespace {

class DeviceStream : public DeviceTest {};

TEST_P(DeviceStream, RoundTripThroughTheDeviceReturnsTheSameBytes) {
  auto dev = open();
  constexpr std::size_t n = (4ull << 20) + 13;
  PinnedBuffer src(*dev, n), dst(*dev, n);
  std::mt19937_64 rng(7);
  for (std::size_t i = 0; i < n; ++i) static_cast<unsigned char*>(src.data())[i] = (unsigned char)rng();
  std::memset(dst.data(), 0, n);
  DeviceBuffer d(*dev, n);
  auto h2d = dev->create_stream("h2d"), d2h = dev->create_stream("d2h");
  auto up = dev->create_event();
  h2d->copy_async(d.data(), src.data(), n, CopyKind::host_to_device);
  h2d->record(*up);
  d2h->wait(*up);
  d2h->copy_async(dst.data(), d.data(), n, CopyKind::device_to_host);
  d2h->synchronize();
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), n), 0);
}

TEST_P(DeviceStream, AnEventNeverRecordedIsComplete) {
  auto dev = open();
  auto e = dev->create_event();
  EXPECT_TRUE(e->query());
  e->synchronize();
}

TEST_P(DeviceStream, EventsOrderWorkAcrossTwoStreams) {
  auto dev = open();
  constexpr std::size_t n = 1 << 20;
  PinnedBuffer host(*dev, n), out(*dev, n);
  DeviceBuffer d(*dev, n);
  std::memset(out.data(), 0, n);
  auto a = dev->create_stream("a"), b = dev->create_stream("b");
  auto filled = dev->create_event(), read = dev->create_event();
  test::StreamGate gate;
  // Stream a: held at the gate, then the fill; b must not read before the fill completes.
  gate.hold(*a);
  std::memset(host.data(), 0x5a, n);
  a->copy_async(d.data(), host.data(), n, CopyKind::host_to_device);
  a->record(*filled);
  b->wait(*filled);
  b->copy_async(out.data(), d.data(), n, CopyKind::device_to_host);
  b->record(*read);
  EXPECT_FALSE(filled->query());  // a is held at the gate
  EXPECT_FALSE(read->query());    // and b waits for a's fill
  gate.open();
  b->synchronize();
  EXPECT_TRUE(filled->query());
  EXPECT_TRUE(read->query());
  const auto* o = static_cast<const unsigned char*>(out.data());
  EXPECT_TRUE(std::all_of(o, o + n, [](unsigned char c) { return c == 0x5a; }));
}

// The other thread's synchronize() cannot return while the gate holds the stream (whatever the timing, so
// the bounded wait below is only how long a wrong early return has to show), and returns after the work
// before the event ran.
TEST_P(DeviceStream, AnEventCanBeWaitedOnFromAnotherThread) {
  auto dev = open();
  auto s = dev->create_stream("s");
  auto e = dev->create_event();
  test::StreamGate gate;
  std::atomic<bool> ran{false};
  gate.hold(*s);
  s->host_fn([&ran] { ran = true; });
  s->record(*e);
  std::future<bool> seen = std::async(std::launch::async, [&] {
    e->synchronize();
    return ran.load();
  });
  EXPECT_EQ(seen.wait_for(std::chrono::milliseconds(20)), std::future_status::timeout)
      << "synchronize() returned while the stream was held";
  gate.open();
  EXPECT_TRUE(seen.get());
  s->synchronize();
}

TEST_P(DeviceStream, HostFunctionsRunInStreamOrder) {
  auto dev = open();
  auto s = dev->create_stream("s");
  std::vector<int> order;
  for (int i = 0; i < 100; ++i) s->host_fn([&order, i] { order.push_back(i); });
  s->synchronize();
  std::vector<int> want(100);
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(order, want);
}

TEST_P(DeviceStream, AnExceptionInAHostFunctionSurfacesAtSynchronize) {
  auto dev = open();
  auto s = dev->create_stream("s");
  s->host_fn([] { throw IoError("simulated failure"); });
  EXPECT_THROW(s->synchronize(), IoError);
  s->synchronize();  // reported once
}

// busy_seconds counts the stream's work, the work running now included, and never the time it sat
// waiting for another stream's event (what StepTimes.wait subtracts). The host backend measures it; cuda
// reports 0 by contract.
TEST_P(DeviceStream, BusySecondsCountWorkNotEventWaits) {
  auto dev = open();
  if (GetParam() == "cuda") GTEST_SKIP() << "cuda streams do not measure busy time (busy_seconds is 0)";
  auto a = dev->create_stream("a"), b = dev->create_stream("b");
  auto done = dev->create_event();
  test::StreamGate gate;
  std::promise<void> entered;
  gate.hold(*a, [&entered] { entered.set_value(); });  // a has reached the gate
  a->record(*done);
  b->wait(*done);  // b waits, idle, for all of a's work
  entered.get_future().wait();
  const double running = a->busy_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_GE(a->busy_seconds() - running, 0.020) << "the work running now counts";
  gate.open();
  a->host_fn([] { std::this_thread::sleep_for(std::chrono::milliseconds(30)); });
  b->synchronize();
  a->synchronize();
  EXPECT_GE(a->busy_seconds(), 0.050);
  EXPECT_EQ(b->busy_seconds(), 0.0) << "b only waited for an event";
}

STRATA_INSTANTIATE_BACKENDS(DeviceStream);

}  // namespace
}  // namespace strata::testing
