// The NCCL communicator on one GPU (comm::make_nccl_single_rank: one rank, no MPI), so that comm/nccl.cpp
// runs on a machine with one GPU: every collective over fp32 / bf16 / fp16 (and i32 / u8 where it moves
// data) with every reduction, in place and not, on a stream and with a null stream, returns the input
// (one rank); dup(), barrier, the host collectives and host scalars work; host memory is refused with a
// strata::Error naming the collective and the memory, managed memory accepted; communicators are torn
// down and made again. Skipped, with the reason, without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "comm/comm.h"
#include "core/cuda_check.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"

namespace strata::comm {
namespace {

// Why NCCL cannot run here, or "" when it can.
std::string skip_reason() {
  if (!nccl_built()) return "this build has no NCCL communicator";
  std::string why;
  if (cuda_device_count(&why) == 0) return "no CUDA GPU visible: " + why;
  return "";
}

// n elements of `dtype` from a hash of (i, salt): finite values in [-8, 8) on a 1/64 grid, exact in every
// float dtype (integers for i32 / u8).
std::vector<std::uint8_t> pattern(DType dtype, std::size_t n, std::uint32_t salt) {
  std::vector<std::uint8_t> b(n * dtype_bytes(dtype));
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t h = (std::uint64_t(i) + 1) * 0x9e3779b97f4a7c15ull ^ (std::uint64_t(salt) << 40);
    h ^= h >> 29;
    const float v = float(std::int64_t(h % 1024) - 512) / 64.0f;
    switch (dtype) {
      case DType::fp32:
        std::memcpy(b.data() + 4 * i, &v, 4);
        break;
      case DType::bf16: {
        const std::uint16_t x = f32_to_bf16(v);
        std::memcpy(b.data() + 2 * i, &x, 2);
        break;
      }
      case DType::fp16: {
        const std::uint16_t x = f32_to_f16(v);
        std::memcpy(b.data() + 2 * i, &x, 2);
        break;
      }
      case DType::i32: {
        const std::int32_t x = std::int32_t(h % 100000) - 50000;
        std::memcpy(b.data() + 4 * i, &x, 4);
        break;
      }
      case DType::u8:
        b[i] = std::uint8_t(h);
        break;
    }
  }
  return b;
}

// A CUDA device, a one-rank NCCL communicator on it and a stream; torn down in the order NCCL needs (the
// stream drained, then the communicator, the stream and the device).
struct NcclEnv {
  NcclEnv()
      : dev(open_device({.backend = "cuda"})),
        comm(make_nccl_single_rank(*dev)),
        stream(dev->create_stream("nccl-test")) {}
  ~NcclEnv() {
    stream->synchronize();
    comm.reset();
    stream.reset();
    dev.reset();
  }
  std::unique_ptr<Device> dev;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Stream> stream;
};

// Each test its own NcclEnv (the tests of dup, teardown and refusals want a fresh one).
class CudaNccl : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
    own_ = std::make_unique<NcclEnv>();
    use(*own_);
  }
  void TearDown() override { own_.reset(); }
  void use(NcclEnv& e) {
    dev_ = e.dev.get();
    comm_ = e.comm.get();
    stream_ = e.stream.get();
  }
  // bytes -> a new device buffer, and back.
  DeviceBuffer to_device(const std::vector<std::uint8_t>& h) {
    DeviceBuffer d(*dev_, h.size());
    stream_->copy_async(d.data(), h.data(), h.size(), CopyKind::host_to_device);
    stream_->synchronize();
    return d;
  }
  std::vector<std::uint8_t> to_host(const void* d, std::size_t bytes) {
    std::vector<std::uint8_t> h(bytes);
    stream_->copy_async(h.data(), d, bytes, CopyKind::device_to_host);
    stream_->synchronize();
    return h;
  }
  std::unique_ptr<NcclEnv> own_;
  Device* dev_ = nullptr;
  Communicator* comm_ = nullptr;
  Stream* stream_ = nullptr;
};

enum class Coll { broadcast, all_gather, reduce_scatter, all_reduce, reduce };
const char* coll_name(Coll c) {
  static const char* const names[] = {"broadcast", "all_gather", "reduce_scatter", "all_reduce", "reduce"};
  return names[int(c)];
}

// Runs one collective of `n` elements on `c` (one rank: recv ends up equal to send, whatever the op).
void run(Communicator& c, Coll coll, const void* send, void* recv, std::size_t n, DType t, ReduceOp op,
         Stream* s) {
  switch (coll) {
    case Coll::broadcast:
      return c.broadcast(send, recv, n, t, 0, s);
    case Coll::all_gather:
      return c.all_gather(send, recv, n, t, s);
    case Coll::reduce_scatter:
      return c.reduce_scatter(send, recv, n, t, op, s);
    case Coll::all_reduce:
      return c.all_reduce(send, recv, n, t, op, s);
    case Coll::reduce:
      return c.reduce(send, recv, n, t, op, 0, s);
  }
}

// coll, dtype, op, in place, on a stream.
// The 184 collective cases share one NcclEnv: NCCL takes a good part of a second to make a communicator,
// and a communicator each made the binary's run minutes long on a GPU. CommunicatorsAreTornDownAndMadeAgain
// checks making and tearing down.
using Param = std::tuple<Coll, DType, ReduceOp, bool, bool>;
class CudaNcclCollective : public CudaNccl, public ::testing::WithParamInterface<Param> {
 public:
  static void TearDownTestSuite() { shared_.reset(); }

 protected:
  void SetUp() override {
    if (const std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
    if (!shared_) shared_ = std::make_unique<NcclEnv>();
    use(*shared_);
  }
  void TearDown() override {
    if (stream_) stream_->synchronize();
  }
  static inline std::unique_ptr<NcclEnv> shared_;
};

TEST_P(CudaNcclCollective, OneRankReturnsItsInput) {
  const auto& [coll, dtype, op, in_place, on_stream] = GetParam();
  constexpr std::size_t n = 1001;
  const std::size_t bytes = n * dtype_bytes(dtype);
  const std::vector<std::uint8_t> in = pattern(dtype, n, 7);
  DeviceBuffer send = to_device(in);
  DeviceBuffer out = to_device(std::vector<std::uint8_t>(bytes, 0xab));
  void* recv = in_place ? send.data() : out.data();
  run(*comm_, coll, send.data(), recv, n, dtype, op, on_stream ? stream_ : nullptr);
  EXPECT_EQ(to_host(recv, bytes), in);  // to_host synchronises the stream first
  if (!in_place) {
    EXPECT_EQ(to_host(send.data(), bytes), in) << "send is read only";
  }
}

std::string param_name(const ::testing::TestParamInfo<Param>& i) {
  const auto& [coll, dtype, op, in_place, on_stream] = i.param;
  std::string s = std::string(coll_name(coll)) + "_" + dtype_name(dtype);
  if (coll == Coll::reduce_scatter || coll == Coll::all_reduce || coll == Coll::reduce)
    s += std::string("_") + to_string(op);
  return s + (in_place ? "_inplace" : "_outofplace") + (on_stream ? "_stream" : "_nullstream");
}

INSTANTIATE_TEST_SUITE_P(
    Reductions, CudaNcclCollective,
    ::testing::Combine(::testing::Values(Coll::reduce_scatter, Coll::all_reduce, Coll::reduce),
                       ::testing::Values(DType::fp32, DType::bf16, DType::fp16),
                       ::testing::Values(ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min),
                       ::testing::Bool(), ::testing::Bool()),
    param_name);
INSTANTIATE_TEST_SUITE_P(
    Movement, CudaNcclCollective,
    ::testing::Combine(::testing::Values(Coll::broadcast, Coll::all_gather),
                       ::testing::Values(DType::fp32, DType::bf16, DType::fp16, DType::i32, DType::u8),
                       ::testing::Values(ReduceOp::sum), ::testing::Bool(), ::testing::Bool()),
    param_name);

TEST_F(CudaNccl, ZeroElementsTouchNothing) {
  for (Coll c : {Coll::broadcast, Coll::all_gather, Coll::reduce_scatter, Coll::all_reduce, Coll::reduce})
    EXPECT_NO_THROW(run(*comm_, c, nullptr, nullptr, 0, DType::fp32, ReduceOp::sum, nullptr)) << coll_name(c);
}

TEST_F(CudaNccl, IdentityAndDup) {
  EXPECT_STREQ(comm_->name(), "nccl");
  EXPECT_EQ(comm_->rank(), 0);
  EXPECT_EQ(comm_->world_size(), 1);
  std::unique_ptr<Communicator> d = comm_->dup();
  EXPECT_STREQ(d->name(), "nccl");
  const std::vector<std::uint8_t> in = pattern(DType::bf16, 333, 3);
  DeviceBuffer buf = to_device(in);
  d->all_reduce(buf.data(), buf.data(), 333, DType::bf16, ReduceOp::sum, stream_);
  comm_->all_reduce(buf.data(), buf.data(), 333, DType::bf16, ReduceOp::max, stream_);
  EXPECT_EQ(to_host(buf.data(), in.size()), in);
}

TEST_F(CudaNccl, HostCollectivesScalarsAndBarrierAreLocal) {
  std::vector<std::uint64_t> v = {1, 2, 3};
  std::vector<std::uint64_t> g(3, 0);
  comm_->host_all_gather(v.data(), g.data(), 3 * sizeof(std::uint64_t));
  EXPECT_EQ(g, v);
  comm_->host_all_gather(g.data(), g.data(), 3 * sizeof(std::uint64_t));  // in place
  EXPECT_EQ(g, v);
  comm_->host_broadcast(v.data(), 3 * sizeof(std::uint64_t), 0);
  EXPECT_EQ(v, (std::vector<std::uint64_t>{1, 2, 3}));
  EXPECT_THROW(comm_->host_broadcast(v.data(), 8, 1), Error);
  EXPECT_EQ(comm_->all_reduce_sum(0.25), 0.25);
  EXPECT_EQ(comm_->all_reduce_max(-3.0), -3.0);
  EXPECT_FALSE(comm_->all_reduce_and(false));
  comm_->barrier();
}

// The message of the Error `f` throws ("" when it does not throw one).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST_F(CudaNccl, PageableHostMemoryIsRefusedNamingTheCollectiveAndWhatToUse) {
  std::vector<float> host(64, 1.0f);
  DeviceBuffer dbuf(*dev_, 64 * sizeof(float));
  for (Coll c : {Coll::broadcast, Coll::all_gather, Coll::reduce_scatter, Coll::all_reduce, Coll::reduce}) {
    for (bool host_is_send : {true, false}) {
      const void* send = host_is_send ? static_cast<const void*>(host.data()) : dbuf.data();
      void* recv = host_is_send ? dbuf.data() : static_cast<void*>(host.data());
      const std::string msg =
          error_of([&] { run(*comm_, c, send, recv, 64, DType::fp32, ReduceOp::sum, stream_); });
      EXPECT_NE(msg.find(std::string("NCCL ") + coll_name(c) + ": the " + (host_is_send ? "send" : "recv") +
                         " buffer"),
                std::string::npos)
          << msg;
      EXPECT_NE(msg.find("pageable host memory"), std::string::npos) << msg;
      EXPECT_NE(msg.find("host_all_gather"), std::string::npos) << msg;
    }
  }
  stream_->synchronize();  // nothing was launched, nothing failed
}

TEST_F(CudaNccl, PinnedHostMemoryIsRefused) {
  PinnedBuffer pinned(*dev_, 64 * sizeof(float));
  const std::string msg = error_of(
      [&] { comm_->all_reduce(pinned.data(), pinned.data(), 64, DType::fp32, ReduceOp::sum, nullptr); });
  EXPECT_NE(msg.find("NCCL all_reduce: the send buffer"), std::string::npos) << msg;
  EXPECT_NE(msg.find("pinned host memory"), std::string::npos) << msg;
}

TEST_F(CudaNccl, ManagedMemoryIsAccepted) {
  constexpr std::size_t n = 4096;
  float* m = nullptr;
  STRATA_CUDA_CHECK(cudaMallocManaged(&m, n * sizeof(float)));
  for (std::size_t i = 0; i < n; ++i) m[i] = float(i % 77) - 30.0f;
  std::string msg = error_of([&] { comm_->all_reduce(m, m, n, DType::fp32, ReduceOp::sum, nullptr); });
  EXPECT_EQ(msg, "");
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += m[i] != float(i % 77) - 30.0f;
  EXPECT_EQ(bad, 0u);
  STRATA_CUDA_CHECK(cudaFree(m));
}

TEST_F(CudaNccl, CommunicatorsAreTornDownAndMadeAgain) {
  const std::vector<std::uint8_t> in = pattern(DType::fp32, 2048, 5);
  DeviceBuffer buf = to_device(in);
  for (int round = 0; round < 3; ++round) {
    std::unique_ptr<Communicator> c = make_nccl_single_rank(*dev_);
    c->all_reduce(buf.data(), buf.data(), 2048, DType::fp32, ReduceOp::sum, stream_);
    c->all_reduce(buf.data(), buf.data(), 2048, DType::fp32, ReduceOp::avg, nullptr);  // its own stream
    stream_->synchronize();
    std::unique_ptr<Communicator> d = c->dup();
    c.reset();  // the dup outlives its parent
    d->broadcast(buf.data(), buf.data(), 2048, DType::fp32, 0, stream_);
    stream_->synchronize();
  }
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  EXPECT_EQ(to_host(buf.data(), in.size()), in);
}

TEST_F(CudaNccl, MakeCommunicatorStillGivesOneRankTheSingleRankCommunicator) {
  EXPECT_STREQ(make_communicator(*dev_)->name(), "single");
}

TEST(Nccl, SingleRankNeedsACudaDevice) {
  if (!nccl_built()) GTEST_SKIP() << "this build has no NCCL communicator";
  auto host = open_device({.backend = "host"});
  EXPECT_THROW(make_nccl_single_rank(*host), Error);
}

}  // namespace
}  // namespace strata::comm
