// The engine's answer to a kernel that interrupts, refuses for now, or moves fewer bytes than asked:
// EINTR and EAGAIN are retried, short transfers resubmitted for the rest, and the bytes still match.
// A queue that injects those results stands in for the backend (the queue_impl.h test seam).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "nvme/engine.h"
#include "nvme/file.h"
#include "nvme/queue_impl.h"
#include "tests/nvme/test_util.h"

namespace strata::nvme {
namespace {

using test::ScratchDir;

enum class Faults { mixed, always_eagain };
std::atomic<Faults> g_faults{Faults::mixed};
std::atomic<unsigned> g_calls{0};

// pread/pwrite like the psync backend, except that it answers with a fault on a fixed schedule.
class FaultyQueue final : public detail::Queue {
 public:
  detail::QueueCaps caps() const override { return {}; }
  void prepare(std::uint32_t slot, const detail::IoDesc& d) override { staged_.push_back({slot, d}); }
  void submit() override {}
  std::size_t reap(std::size_t, detail::Completion* out, std::size_t cap) override {
    std::size_t n = 0;
    for (; n < staged_.size() && n < cap; ++n) {
      auto [slot, d] = staged_[n];
      unsigned k = g_calls.fetch_add(1);
      long res;
      if (g_faults == Faults::always_eagain || k % 5 == 1) {
        res = -EAGAIN;
      } else if (k % 5 == 2) {
        res = -EINTR;
      } else {
        std::size_t len = (k % 5 == 3 && d.len > 1) ? d.len / 2 + 1 : d.len;  // short transfer
        ssize_t r = d.op == detail::Op::read ? ::pread(d.fd, d.buf, len, off_t(d.off))
                                             : ::pwrite(d.fd, d.buf, len, off_t(d.off));
        res = r < 0 ? -long(errno) : long(r);
      }
      out[n] = {slot, res};
    }
    staged_.erase(staged_.begin(), staged_.begin() + long(n));
    return n;
  }

 private:
  std::vector<std::pair<std::uint32_t, detail::IoDesc>> staged_;
};

std::unique_ptr<detail::Queue> make_faulty(unsigned) {
  return std::make_unique<FaultyQueue>();
}

class Retry : public ::testing::Test {
 protected:
  void SetUp() override {
    g_calls = 0;
    previous_ = detail::exchange_queue_factory(&make_faulty);
  }
  void TearDown() override {
    detail::exchange_queue_factory(previous_);
    g_faults = Faults::mixed;
  }
  AioOptions opts() const {
    AioOptions o;
    o.backend = Backend::psync;
    o.block_size = 16 << 10;
    o.queue_depth = 4;
    return o;
  }
  detail::QueueFactory previous_ = nullptr;
};

TEST_F(Retry, InterruptedRefusedAndShortTransfersAreRetriedUntilEveryByteMoved) {
  ScratchDir dir("nvme");
  AioEngine engine(opts());
  File f = File::open(dir.file("r.bin"), OpenMode::create, /*direct=*/false);
  const std::size_t n = 300'001;
  auto content = test::random_bytes(n, 1);
  engine.write(f, content.data(), n, 17);
  auto on_disk = test::oracle_read(f.path(), 17, n);
  EXPECT_EQ(test::first_difference(on_disk.data(), content.data(), n), -1);
  std::vector<std::uint8_t> back(n);
  engine.read(f, back.data(), n, 17);
  EXPECT_EQ(test::first_difference(back.data(), content.data(), n), -1);
  IoStats s = engine.stats();
  EXPECT_GT(s.retries, 0u);
  EXPECT_GT(s.short_transfers, 0u);
  EXPECT_EQ(s.failed_requests, 0u);
}

TEST_F(Retry, AnEagainThatNeverClearsEndsAsIoErrorNamingTheErrno) {
  g_faults = Faults::always_eagain;
  ScratchDir dir("nvme");
  AioEngine engine(opts());
  File f = File::open(dir.file("e.bin"), OpenMode::create, false);
  std::vector<std::uint8_t> buf(5000, 1);
  try {
    engine.write(f, buf.data(), buf.size(), 0);
    FAIL() << "no error";
  } catch (const IoError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("Resource temporarily unavailable"), std::string::npos) << m;
    EXPECT_NE(m.find(f.path()), std::string::npos) << m;
  }
  EXPECT_GE(engine.stats().retries, 1000u);
}

TEST(IoUringSqpoll, RoundTripsWithAKernelPollingThread) {
  STRATA_SKIP_IF_UNAVAILABLE(Backend::io_uring);
  ScratchDir dir("nvme");
  AioOptions o;
  o.backend = Backend::io_uring;
  o.sqpoll = true;
  o.block_size = 64 << 10;
  std::unique_ptr<AioEngine> engine;
  try {
    engine = std::make_unique<AioEngine>(o);
  } catch (const BackendError& e) {
    GTEST_SKIP() << "SQPOLL refused here: " << e.what();
  }
  File f = File::open(dir.file("sq.bin"), OpenMode::create);
  auto content = test::random_bytes(777'777, 2);
  engine->write(f, content.data(), content.size(), 5);
  std::vector<std::uint8_t> back(content.size());
  engine->read(f, back.data(), back.size(), 5);
  EXPECT_EQ(back, content);
}

}  // namespace
}  // namespace strata::nvme
