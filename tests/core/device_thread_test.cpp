// The thread's device (Note [thread device] in core/device.h), on the host backend, which emulates CUDA's
// per-thread current device: a device at ordinal 1 with check_thread_device refuses every call from a
// thread that has not bound it, with a message naming the call, the thread and both ordinals; threads
// that bound it, the thread that opened it and its streams' workers work.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/device.h"
#include "core/error.h"

namespace strata::testing {
namespace {

std::unique_ptr<Device> open_checked(int ordinal = 1) {
  return open_device({.backend = "host", .ordinal = ordinal, .memory_cap = 0, .check_thread_device = true});
}

// Runs f on a fresh thread; returns the message of the strata::Error it threw ("" when none).
std::string error_on_new_thread(const std::function<void()>& f, bool bind_first = false,
                                const Device* dev = nullptr) {
  std::string msg;
  std::thread t([&] {
    try {
      if (bind_first) dev->bind_thread();
      f();
    } catch (const Error& e) {
      msg = e.what();
    }
  });
  t.join();
  return msg;
}

TEST(ThreadDevice, TheHostDeviceKeepsItsOrdinal) {
  EXPECT_EQ(open_device({.backend = "host", .ordinal = 3})->caps().ordinal, 3);
  EXPECT_THROW(open_device({.backend = "host", .ordinal = -1}), ConfigError);
}

TEST(ThreadDevice, AThreadThatDidNotBindIsRefusedNamingTheCallTheThreadAndBothOrdinals) {
  auto dev = open_checked();
  const std::string msg = error_on_new_thread([&] { dev->allocate(64, "x"); });
  EXPECT_NE(msg.find("host device 1: Device::allocate called from thread "), std::string::npos) << msg;
  EXPECT_NE(msg.find("whose current device is 0, not 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Device::bind_thread()"), std::string::npos) << msg;
  EXPECT_EQ(dev->memory_stats().allocations, 0u) << "refused before allocating";
}

TEST(ThreadDevice, AStreamCallNamesTheStream) {
  auto dev = open_checked();
  auto s = dev->create_stream("h2d");
  std::vector<char> a(16), b(16);
  const std::string msg =
      error_on_new_thread([&] { s->copy_async(b.data(), a.data(), a.size(), CopyKind::host_to_device); });
  EXPECT_NE(msg.find("host device 1: stream 'h2d' copy_async called from thread"), std::string::npos) << msg;
}

TEST(ThreadDevice, EveryEntryPointRefusesAnUnboundThread) {
  auto dev = open_checked();
  auto s = dev->create_stream("s");
  auto e = dev->create_event();
  s->record(*e);
  void* d = dev->allocate(64);
  void* p = dev->allocate_pinned(64);
  std::vector<char> h(64);
  const std::vector<std::pair<const char*, std::function<void()>>> calls = {
      {"Device::allocate", [&] { dev->allocate(8); }},
      {"Device::deallocate", [&] { dev->deallocate(d); }},
      {"Device::allocate_pinned", [&] { dev->allocate_pinned(8); }},
      {"Device::deallocate_pinned", [&] { dev->deallocate_pinned(p); }},
      {"Device::create_stream", [&] { dev->create_stream("t"); }},
      {"Device::create_event", [&] { dev->create_event(); }},
      {"Device::synchronize", [&] { dev->synchronize(); }},
      {"copy_async", [&] { s->copy_async(d, h.data(), 8, CopyKind::host_to_device); }},
      {"memset_async", [&] { s->memset_async(d, 0, 8); }},
      {"host_fn", [&] { s->host_fn([] {}); }},
      {"record", [&] { s->record(*e); }},
      {"wait", [&] { s->wait(*e); }},
      {"synchronize", [&] { s->synchronize(); }},
      {"Event::query", [&] { e->query(); }},
      {"Event::synchronize", [&] { e->synchronize(); }},
  };
  for (const auto& [name, call] : calls) {
    const std::string msg = error_on_new_thread(call);
    EXPECT_NE(msg.find(std::string(" ") + name + " called from thread"), std::string::npos)
        << name << ": " << msg;
  }
  // Nothing was freed by the refused calls; the opening thread still can.
  dev->deallocate(d);
  dev->deallocate_pinned(p);
  EXPECT_EQ(dev->memory_stats().allocations, 0u);
  EXPECT_EQ(dev->memory_stats().pinned_in_use, 0u);
}

TEST(ThreadDevice, ABoundThreadUsesEveryEntryPoint) {
  auto dev = open_checked();
  const std::string msg = error_on_new_thread(
      [&] {
        DeviceBuffer d(*dev, 256);
        PinnedBuffer p(*dev, 256);
        auto s = dev->create_stream("bound");
        auto e = dev->create_event();
        s->memset_async(d.data(), 0x11, 256);
        s->copy_async(p.data(), d.data(), 256, CopyKind::device_to_host);
        s->record(*e);
        s->wait(*e);
        e->synchronize();
        EXPECT_TRUE(e->query());
        s->synchronize();
        dev->synchronize();
        EXPECT_EQ(static_cast<unsigned char*>(p.data())[255], 0x11);
      },
      /*bind_first=*/true, dev.get());
  EXPECT_EQ(msg, "");
}

TEST(ThreadDevice, OpeningADeviceBindsTheOpeningThread) {
  std::string msg = error_on_new_thread([] {
    auto dev = open_checked(2);
    DeviceBuffer d(*dev, 64);
    dev->create_stream("s")->synchronize();
  });
  EXPECT_EQ(msg, "");
}

TEST(ThreadDevice, AStreamWorkerIsBoundSoHostFunctionsMayUseTheDevice) {
  auto dev = open_checked();
  auto s = dev->create_stream("worker");
  std::string in_fn = "not run";
  s->host_fn([&] {
    try {
      DeviceBuffer d(*dev, 64);
      auto e = dev->create_event();
      e->synchronize();
      in_fn.clear();
    } catch (const Error& e) {
      in_fn = e.what();
    }
  });
  s->synchronize();
  EXPECT_EQ(in_fn, "");
}

TEST(ThreadDevice, BindingIsPerThreadAndFollowsTheLastBind) {
  auto one = open_checked(1);
  auto two = open_checked(2);  // the opening thread is now bound to 2
  EXPECT_NE(error_on_new_thread([&] { one->allocate(8); }), "");
  EXPECT_THROW(one->create_event(), Error);
  one->bind_thread();
  auto e = one->create_event();
  EXPECT_THROW(two->create_event(), Error);
  EXPECT_TRUE(e->query());
}

TEST(ThreadDevice, WithoutCheckingAnyThreadMayCallADeviceOfAnotherOrdinal) {
  auto dev = open_device({.backend = "host", .ordinal = 1});
  const std::string msg = error_on_new_thread([&] {
    DeviceBuffer d(*dev, 64);
    auto s = dev->create_stream("s");
    s->memset_async(d.data(), 0, 64);
    s->synchronize();
  });
  EXPECT_EQ(msg, "");
}

}  // namespace
}  // namespace strata::testing
