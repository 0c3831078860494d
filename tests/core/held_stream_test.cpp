// A stream held by a gate (tests/common/stream_gate.h) refuses a copy to or from pageable host memory, which
// on cuda would wait for the gate in the thread that has yet to open it (Note [held streams] in
// core/stream_hold.h); copies with pinned or device memory are queued behind the gate as before, and a
// stream not held, or no longer held, takes any copy. Host backend only: the check is the host backend's
// (on cuda each refused call below would deadlock).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "tests/common/stream_gate.h"

namespace strata::testing {
namespace {

constexpr std::size_t n = 4096;

std::unique_ptr<Device> open_host() {
  return open_device({.backend = "host"});
}

// The message of the strata::Error that `call` throws; "" when it throws none.
template <typename Call>
std::string error_of(Call&& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const char* part) {
  return s.find(part) != std::string::npos;
}

TEST(HeldStream, APageableCopyIsRefusedAtOnceNamingTheStreamAndTheCure) {
  auto dev = open_host();
  auto s = dev->create_stream("h2d"), other = dev->create_stream("other");
  DeviceBuffer d(*dev, n), d_other(*dev, n);
  std::vector<unsigned char> pageable(n, 1);
  s->memset_async(d.data(), 0, n);
  test::StreamGate gate;
  gate.hold(*s);
  const std::string up =
      error_of([&] { s->copy_async(d.data(), pageable.data(), n, CopyKind::host_to_device); });
  EXPECT_TRUE(has(up, "copy from pageable host memory queued on stream 'h2d' while it is held")) << up;
  EXPECT_TRUE(has(up, "on cuda the copy waits for the stream's queued work first, so it would deadlock"))
      << up;
  EXPECT_TRUE(has(up, "stage it in pinned memory")) << up;
  const std::string down =
      error_of([&] { s->copy_async(pageable.data(), d.data(), n, CopyKind::device_to_host); });
  EXPECT_TRUE(has(down, "copy to pageable host memory queued on stream 'h2d' while it is held")) << down;
  const std::string both = error_of(
      [&] { s->copy_async(pageable.data() + n / 2, pageable.data(), n / 2, CopyKind::host_to_host); });
  EXPECT_TRUE(has(both, "pageable host memory queued on stream 'h2d'")) << both;
  // A stream the gate does not hold takes the same copy.
  EXPECT_EQ(
      error_of([&] { other->copy_async(d_other.data(), pageable.data(), n, CopyKind::host_to_device); }), "");
  other->synchronize();
  gate.open();
  s->synchronize();
  EXPECT_EQ(pageable, std::vector<unsigned char>(n, 1)) << "a refused copy was queued all the same";
}

TEST(HeldStream, CopiesWithPinnedAndDeviceMemoryAreQueuedBehindTheGate) {
  auto dev = open_host();
  auto s = dev->create_stream("s");
  auto e = dev->create_event();
  PinnedBuffer in(*dev, 2 * n), out(*dev, n);
  DeviceBuffer d(*dev, n), d2(*dev, n);
  std::memset(in.data(), 0x5a, 2 * n);
  std::memset(out.data(), 0, n);
  test::StreamGate gate;
  gate.hold(*s);
  auto* inside = static_cast<unsigned char*>(in.data()) + n / 2;  // anywhere inside the allocation
  EXPECT_EQ(error_of([&] { s->copy_async(d.data(), inside, n, CopyKind::host_to_device); }), "");
  EXPECT_EQ(error_of([&] { s->copy_async(d2.data(), d.data(), n, CopyKind::device_to_device); }), "");
  EXPECT_EQ(error_of([&] { s->copy_async(out.data(), d2.data(), n, CopyKind::device_to_host); }), "");
  s->record(*e);
  EXPECT_FALSE(e->query()) << "the gate is closed";
  gate.open();
  s->synchronize();
  EXPECT_EQ(std::memcmp(out.data(), inside, n), 0);
}

TEST(HeldStream, ACopyThatRunsPastItsPinnedAllocationCountsAsPageable) {
  auto dev = open_host();
  auto s = dev->create_stream("s");
  PinnedBuffer in(*dev, n);
  DeviceBuffer d(*dev, 2 * n);
  test::StreamGate gate;
  gate.hold(*s);
  const std::string m =
      error_of([&] { s->copy_async(d.data(), in.data(), 2 * n, CopyKind::host_to_device); });
  EXPECT_TRUE(has(m, "copy from pageable host memory")) << m;
}

TEST(HeldStream, OnceTheGateOpensAPageableCopyIsQueued) {
  auto dev = open_host();
  auto s = dev->create_stream("s");
  DeviceBuffer d(*dev, n);
  std::vector<unsigned char> in(n, 7), out(n, 0);
  test::StreamGate gate;
  gate.hold(*s);
  gate.open();
  EXPECT_EQ(error_of([&] { s->copy_async(d.data(), in.data(), n, CopyKind::host_to_device); }), "");
  EXPECT_EQ(error_of([&] { s->copy_async(out.data(), d.data(), n, CopyKind::device_to_host); }), "");
  s->synchronize();
  EXPECT_EQ(out, in);
}

// On cuda a stream that waits for an event recorded behind the gate cannot reach a later copy either, so
// it is held as long as that gate is, and so is a stream that waits for it in turn. An event recorded
// before the gate holds nothing.
TEST(HeldStream, AStreamWaitingForAnEventRecordedBehindTheGateIsHeldToo) {
  auto dev = open_host();
  auto a = dev->create_stream("a"), b = dev->create_stream("b"), c = dev->create_stream("c"),
       unheld = dev->create_stream("unheld");
  auto before = dev->create_event(), behind = dev->create_event(), via_b = dev->create_event();
  DeviceBuffer d(*dev, n);
  std::vector<unsigned char> pageable(n, 3);
  test::StreamGate gate;
  a->record(*before);
  gate.hold(*a);
  a->record(*behind);
  b->wait(*behind);
  b->record(*via_b);
  c->wait(*via_b);
  unheld->wait(*before);
  for (Stream* s : {b.get(), c.get()}) {
    const std::string m =
        error_of([&] { s->copy_async(d.data(), pageable.data(), n, CopyKind::host_to_device); });
    EXPECT_TRUE(has(m, ("stream '" + s->name() + "' while it is held").c_str())) << m;
  }
  EXPECT_EQ(error_of([&] { unheld->copy_async(d.data(), pageable.data(), n, CopyKind::host_to_device); }),
            "");
  unheld->synchronize();
  gate.open();
  for (Stream* s : {b.get(), c.get()}) {
    EXPECT_EQ(error_of([&] { s->copy_async(pageable.data(), d.data(), n, CopyKind::device_to_host); }), "");
    s->synchronize();
  }
}

}  // namespace
}  // namespace strata::testing
