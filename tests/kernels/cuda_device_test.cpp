// The cuda backend of core/device.h on a real GPU: what the host backend promises (core/host_device.cpp),
// plus the CUDA-specific fixes: an event query leaves no error behind, host functions run off the driver's
// callback thread (so they may call CUDA and block without stalling other streams), later stream work
// waits for them, their exceptions surface at synchronize(), the capacity leaves room for CUDA itself, and
// ops follow their stream's device. Skipped without a GPU.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <stdexcept>
#include <thread>

#include "core/device.h"
#include "core/error.h"
#include "kernels/cuda/ops.h"
#include "tests/common/stream_gate.h"
#include "tests/kernels/cuda_test_util.h"

namespace strata::kernels::test {
namespace {

namespace kc = strata::kernels::cuda;
using namespace std::chrono_literals;

class CudaDevice : public CudaTest {};

// The stream is held at a gate (tests/common/stream_gate.h), so the event cannot be complete while it is
// queried.
TEST_F(CudaDevice, EventQueryThatIsNotReadyLeavesNoErrorBehind) {
  auto s = device_->create_stream("s");
  auto e = device_->create_event();
  strata::test::StreamGate gate;
  gate.hold(*s);
  s->record(*e);
  EXPECT_FALSE(e->query());
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  DeviceBuffer<float> x(std::vector<float>{1.0f});
  kc::scale(x.get(), 2.0f, 1, stream_);  // STRATA_KERNEL_CHECK sees no stale error: no throw
  gate.open();
  e->synchronize();
  EXPECT_TRUE(e->query());
  EXPECT_EQ(x.download(), std::vector<float>{2.0f});
}

TEST_F(CudaDevice, HostFunctionMayCallCuda) {
  auto s = device_->create_stream("s");
  cudaError_t seen = cudaErrorUnknown;
  s->host_fn([&] {
    std::size_t free_b = 0, total_b = 0;
    seen = cudaMemGetInfo(&free_b, &total_b);  // cudaErrorNotPermitted on the driver's callback thread
  });
  s->synchronize();
  EXPECT_EQ(seen, cudaSuccess);
}

TEST_F(CudaDevice, LaterWorkWaitsForTheHostFunction) {
  auto s = device_->create_stream("s");
  PinnedBuffer in(*device_, sizeof(int)), out(*device_, sizeof(int));
  DeviceBuffer<int> d(1);
  *static_cast<int*>(in.data()) = 0;
  *static_cast<int*>(out.data()) = -1;
  s->host_fn([&] {
    std::this_thread::sleep_for(100ms);
    *static_cast<int*>(in.data()) = 42;
  });
  s->copy_async(d.get(), in.data(), sizeof(int), CopyKind::host_to_device);
  s->copy_async(out.data(), d.get(), sizeof(int), CopyKind::device_to_host);
  s->synchronize();
  EXPECT_EQ(*static_cast<int*>(out.data()), 42);
}

TEST_F(CudaDevice, BlockingHostFunctionDoesNotStallOtherStreams) {
  auto a = device_->create_stream("a"), b = device_->create_stream("b");
  std::promise<void> released;
  auto wait = released.get_future();
  bool got = false;
  a->host_fn([&] { got = wait.wait_for(10s) == std::future_status::ready; });
  b->host_fn([&] { released.set_value(); });
  b->synchronize();
  a->synchronize();
  EXPECT_TRUE(got) << "a host function on stream b could not run while one on stream a blocked";
}

TEST_F(CudaDevice, HostFunctionExceptionSurfacesAtTheNextSynchronize) {
  auto s = device_->create_stream("s");
  bool later_ran = false;
  s->host_fn([] { throw std::runtime_error("boom"); });
  s->host_fn([&] { later_ran = true; });
  EXPECT_THROW(s->synchronize(), std::runtime_error);
  EXPECT_TRUE(later_ran);
  EXPECT_NO_THROW(s->synchronize());
  s->host_fn([] { throw std::runtime_error("again"); });
  EXPECT_THROW(device_->synchronize(), std::runtime_error);
}

TEST_F(CudaDevice, CapacityLeavesRoomForCudaAndHonoursTheCap) {
  const DeviceCaps& caps = device_->caps();
  EXPECT_LE(caps.capacity + (std::size_t(256) << 20), caps.physical_bytes);
  auto capped =
      open_device({.backend = "cuda", .ordinal = caps.ordinal, .memory_cap = std::size_t(64) << 20});
  EXPECT_EQ(capped->caps().capacity, std::size_t(64) << 20);
  void* p = capped->allocate(std::size_t(48) << 20, "first");
  EXPECT_THROW(capped->allocate(std::size_t(32) << 20, "second"), OutOfMemory);
  capped->deallocate(p);
  void* q = capped->allocate(std::size_t(60) << 20, "reused");  // the freed room is usable again
  EXPECT_NE(q, nullptr);
  EXPECT_GE(capped->memory_stats().in_use, std::size_t(60) << 20);
  capped->deallocate(q);
  EXPECT_EQ(capped->memory_stats().in_use, 0u);
}

TEST_F(CudaDevice, GemmWorkspaceIsCountedByTheDevice) {
  const std::size_t before = device_->memory_stats().in_use;
  {
    kc::Gemm gemm(*device_, std::size_t(4) << 20);
    EXPECT_EQ(device_->memory_stats().in_use, before + (std::size_t(4) << 20));
  }
  EXPECT_EQ(device_->memory_stats().in_use, before);
}

TEST_F(CudaDevice, OpsRunOnTheStreamsDeviceWhateverIsCurrent) {
  int n = 0;
  STRATA_CUDA_CHECK(cudaGetDeviceCount(&n));
  if (n < 2) GTEST_SKIP() << "needs two CUDA devices, " << n << " visible";
  auto dev1 = open_device({.backend = "cuda", .ordinal = 1});
  auto s1 = dev1->create_stream("s1");
  auto st = static_cast<cudaStream_t>(s1->native_handle());
  strata::DeviceBuffer x(*dev1, 1000 * sizeof(float)), scratch(*dev1, kc::squared_norm_scratch_bytes(1000));
  strata::DeviceBuffer out(*dev1, sizeof(double));
  std::vector<float> ones(1000, 1.0f);
  double norm = 0.0;
  STRATA_CUDA_CHECK(cudaSetDevice(0));
  s1->copy_async(x.data(), ones.data(), x.size(), CopyKind::host_to_device);
  kc::scale(static_cast<float*>(x.data()), 3.0f, 1000, st);
  kc::squared_norm(static_cast<double*>(out.data()), static_cast<const float*>(x.data()), 1000,
                   scratch.data(), scratch.size(), st);
  s1->copy_async(&norm, out.data(), sizeof(double), CopyKind::device_to_host);
  s1->synchronize();
  EXPECT_EQ(norm, 9000.0);
  int current = -1;
  STRATA_CUDA_CHECK(cudaGetDevice(&current));
  EXPECT_EQ(current, 0) << "an op left another device current";
}

}  // namespace
}  // namespace strata::kernels::test
