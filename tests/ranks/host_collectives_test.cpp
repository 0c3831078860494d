// The engine's collectives over host memory take the communicator's host collectives; its device
// collectives go on a stream. On cuda the device collectives are NCCL's, which must never be handed host
// memory (the gradient norm's partials, the params read for an export, the checkpoint's table): here the
// engine runs at two ranks over a communicator that refuses a device collective without a stream — the
// form a host buffer took — through training, an export's reads, a checkpoint save and a load.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include "engine_util.h"
#include "tests/ranks/ranks_env.h"

namespace strata::zero3 {
namespace {

using test::make_config;
using test::make_tokens;
using test::ScratchDir;

// Passes everything to `inner`, refusing device collectives that would run on the calling thread.
class StreamOnly final : public comm::Communicator {
 public:
  explicit StreamOnly(comm::Communicator& inner) : inner_(inner) {}
  explicit StreamOnly(std::unique_ptr<comm::Communicator> owned)
      : owned_(std::move(owned)), inner_(*owned_) {}
  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  const char* name() const override { return inner_.name(); }
  void broadcast(const void* send, void* recv, std::size_t count, DType dtype, int root,
                 Stream* stream) override {
    need("broadcast", stream);
    inner_.broadcast(send, recv, count, dtype, root, stream);
  }
  void all_gather(const void* send, void* recv, std::size_t send_count, DType dtype,
                  Stream* stream) override {
    need("all_gather", stream);
    inner_.all_gather(send, recv, send_count, dtype, stream);
  }
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType dtype, comm::ReduceOp op,
                      Stream* stream) override {
    need("reduce_scatter", stream);
    inner_.reduce_scatter(send, recv, recv_count, dtype, op, stream);
  }
  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, comm::ReduceOp op,
                  Stream* stream) override {
    need("all_reduce", stream);
    inner_.all_reduce(send, recv, count, dtype, op, stream);
  }
  void reduce(const void* send, void* recv, std::size_t count, DType dtype, comm::ReduceOp op, int root,
              Stream* stream) override {
    need("reduce", stream);
    inner_.reduce(send, recv, count, dtype, op, root, stream);
  }
  void barrier() override { inner_.barrier(); }
  std::unique_ptr<comm::Communicator> dup() override { return std::make_unique<StreamOnly>(inner_.dup()); }
  void host_all_gather(const void* send, void* recv, std::size_t bytes) override {
    ++host_calls;
    inner_.host_all_gather(send, recv, bytes);
  }
  void host_broadcast(void* buf, std::size_t bytes, int root) override {
    ++host_calls;
    inner_.host_broadcast(buf, bytes, root);
  }
  double all_reduce_sum(double x) override { return inner_.all_reduce_sum(x); }
  bool all_reduce_and(bool x) override { return inner_.all_reduce_and(x); }
  double all_reduce_max(double x) override { return inner_.all_reduce_max(x); }

  int host_calls = 0;

 private:
  static void need(const char* what, const Stream* stream) {
    if (!stream)
      throw Error(std::string("a device collective (") + what +
                  ") without a stream: host data must take the host collectives");
  }
  std::unique_ptr<comm::Communicator> owned_;
  comm::Communicator& inner_;
};

class HostCollectives : public ::testing::TestWithParam<OffloadDevice> {
 protected:
  void SetUp() override {
    if (testing::ranks().world_size() != 2) GTEST_SKIP() << "run under mpirun -np 2 (ctest does)";
  }
};

TEST_P(HostCollectives, TrainExportAndCheckpointKeepHostDataOffTheDeviceCollectives) {
  const int rank = testing::ranks().rank();
  ScratchDir d("host-collectives-r" + std::to_string(rank));
  const std::string tokens = make_tokens(d);
  const Config cfg =
      make_config(GetParam(), GetParam(), d.path(),
                  {{"train_micro_batch_size_per_gpu", 1}, {"gradient_accumulation_steps", 2}}, 2);
  StreamOnly c(testing::ranks());
  std::string ckpt_dir;
  {
    test::Trainer t(cfg, tokens, &c);
    EXPECT_NO_THROW(t.run(2));
    std::vector<float> params(t.engine.layout().chunk(0).padded_numel);
    EXPECT_NO_THROW(t.engine.read_params(0, params.data()));  // what an export reads
    // A directory every rank names the same (each writes its part of the checkpoint there).
    ckpt_dir = (strata::test::scratch_root() / "ranks-host-collectives" / test::name(GetParam())).string();
    std::filesystem::create_directories(ckpt_dir);
    EXPECT_NO_THROW(t.engine.save_checkpoint(ckpt_dir, {}, &t.data));
  }
  EXPECT_GT(c.host_calls, 0) << "the norm's partials, the export's reads and the checkpoint's table";
  test::Trainer back(cfg, tokens, &c);
  EXPECT_NO_THROW(back.engine.load_checkpoint(ckpt_dir, "", &back.data));
  EXPECT_NO_THROW(back.run(1));
}

INSTANTIATE_TEST_SUITE_P(Offload, HostCollectives, ::testing::Values(OffloadDevice::cpu, OffloadDevice::none),
                         [](const auto& info) { return std::string(test::name(info.param)); });

}  // namespace
}  // namespace strata::zero3
