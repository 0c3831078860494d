// measure() (nvme/tune.h), the engine's side of nvme_bench and nvme-tune: with and without a ramp the
// window it reports is at least the runtime and its figure is the bytes it counted over that window, and
// a sequential sweep of a range that is not a whole number of requests stays inside the file.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "nvme/engine.h"
#include "nvme/tune.h"
#include "tests/common/scratch_dir.h"
#include "tests/nvme/test_util.h"

namespace strata::nvme {
namespace {

class Measure : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override { STRATA_SKIP_IF_UNAVAILABLE(GetParam()); }
};

TEST_P(Measure, CountsAWindowOfAtLeastTheRuntimeWithAndWithoutARamp) {
  // 3 MiB of 1 MiB blocks read and written 2 MiB at a time: the last request of each pass is the 1 MiB
  // left, and a request past the end would fail the measurement.
  ScratchFile file(strata::test::scratch_root().string(), 3u << 20, /*direct=*/true);
  AioOptions o;
  o.backend = GetParam();
  o.block_size = 1u << 20;
  o.queue_depth = 2;
  AioEngine engine(o);
  ASSERT_EQ(measure_buffer_bytes(o), std::size_t(2) << 20);
  void* buf = nullptr;
  ASSERT_EQ(posix_memalign(&buf, 4096, 2u << 20), 0);
  std::unique_ptr<void, decltype(&std::free)> owner(buf, &std::free);
  for (Pattern p : {Pattern::seq_read, Pattern::rand_read, Pattern::seq_write})
    for (double ramp : {0.0, 0.05}) {
      SCOPED_TRACE(std::string(to_string(p)) + " ramp " + std::to_string(ramp));
      Measurement m = measure(engine, file.file(), file.bytes(), p, 0.05, buf, 2u << 20, ramp);
      // Submitting stops only once a completion is seen at or after the end of the runtime, and the
      // window closes at the last completion: never shorter than the runtime.
      EXPECT_GE(m.seconds, 0.05);
      EXPECT_GT(m.bytes, 0u);
      EXPECT_EQ(m.bytes % (1u << 20), 0u);  // whole requests of one or two blocks
      EXPECT_DOUBLE_EQ(m.gbps, double(m.bytes) / m.seconds / 1e9);
    }
  EXPECT_EQ(engine.stats().failed_requests, 0u);
}

TEST_P(Measure, GivesEachRequestInFlightItsOwnMemoryWhenTheBufferHoldsThemAll) {
  ScratchFile file(strata::test::scratch_root().string(), 3u << 20, /*direct=*/true);
  AioOptions o;
  o.backend = GetParam();
  o.block_size = 1u << 20;
  o.queue_depth = 2;
  AioEngine engine(o);
  // Sequential: 2 MiB requests, one covering the queue's two pieces plus the one before it; random: 1 MiB
  // requests, 2 + 1 of them.
  const std::size_t bytes = measure_inflight_bytes(o);
  EXPECT_EQ(bytes, std::size_t(4) << 20);
  void* buf = nullptr;
  ASSERT_EQ(posix_memalign(&buf, 4096, bytes), 0);
  std::unique_ptr<void, decltype(&std::free)> owner(buf, &std::free);
  for (Pattern p : {Pattern::seq_read, Pattern::rand_read}) {
    Measurement m = measure(engine, file.file(), file.bytes(), p, 0.05, buf, bytes, 0.02);
    EXPECT_GT(m.bytes, 0u) << to_string(p);
  }
  EXPECT_EQ(engine.stats().failed_requests, 0u);
}

TEST_P(Measure, RefusesANonPositiveRuntimeAndANegativeRamp) {
  ScratchFile file(strata::test::scratch_root().string(), 1u << 20, /*direct=*/true);
  AioOptions o;
  o.backend = GetParam();
  o.block_size = 1u << 20;
  AioEngine engine(o);
  void* buf = nullptr;
  ASSERT_EQ(posix_memalign(&buf, 4096, 1u << 20), 0);
  std::unique_ptr<void, decltype(&std::free)> owner(buf, &std::free);
  EXPECT_ANY_THROW(measure(engine, file.file(), file.bytes(), Pattern::seq_read, 0, buf, 1u << 20));
  EXPECT_ANY_THROW(measure(engine, file.file(), file.bytes(), Pattern::seq_read, 0.01, buf, 1u << 20, -1));
}

INSTANTIATE_TEST_SUITE_P(Backends, Measure, ::testing::ValuesIn(test::all_backends()),
                         test::backend_param_name);

}  // namespace
}  // namespace strata::nvme
