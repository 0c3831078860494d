// Every thread of the engine that calls the device binds to it first (core/device.h, Note [thread
// device]): on cuda a thread that does not runs on GPU 0 and takes a context there, another rank's GPU. The
// host backend finds such a thread without a GPU: the engine opens device 1 with check_thread_device, so
// any device call from a thread still on ordinal 0 throws, and training, the optimizer overlapped with
// backward, NVMe moves, the memprof trace, a checkpoint and its load all run.
#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "engine_util.h"

namespace strata::zero3 {
namespace {

using test::make_config;
using test::make_tokens;
using test::ScratchDir;

class ThreadDevice : public ::testing::TestWithParam<OffloadDevice> {};

TEST_P(ThreadDevice, EveryEngineThreadBindsItsDevice) {
  ScratchDir d(std::string("thread-device-") + test::name(GetParam()));
  Config cfg = make_config(GetParam(), GetParam(), d.path(),
                           {{"strata", {{"device", 1}, {"memprof", {{"path", d.file("trace.jsonl")}}}}}});
  if (std::thread::hardware_concurrency() > 1 && GetParam() == OffloadDevice::cpu) {
    cfg.strata.cpu_optim.cores = 1;  // its own core, so "auto" overlaps the optimizer with backward
    cfg.strata.overlap_optimizer = StrataConfig::Overlap::on;
  }
  const std::string tokens = make_tokens(d);
  const model::ModelConfig mcfg = model::ModelConfig::preset("tiny");
  const EngineOptions o{
      .backend = "", .device_memory_cap = 0, .seq_len = 32, .testing = {.check_thread_device = true}};
  const std::string ckpt = d.file("ckpt");
  std::vector<double> straight;
  {
    Engine e(cfg, mcfg, o);
    ASSERT_EQ(e.device().caps().ordinal, 1);
    model::TokenFile file = model::TokenFile::open(tokens);
    model::DataLoader data(file,
                           {.batch_size = e.micro_batch(), .seq_len = 32, .seed = 3, .vocab_size = 256});
    model::LlamaModel m(mcfg, e.model_options());
    for (int i = 0; i < 3; ++i) straight.push_back(e.train_batch(m, data).loss);
    e.save_checkpoint(ckpt, {}, &data);
    straight.push_back(e.train_batch(m, data).loss);
  }
  Engine e(cfg, mcfg, o);
  model::TokenFile file = model::TokenFile::open(tokens);
  model::DataLoader data(file, {.batch_size = e.micro_batch(), .seq_len = 32, .seed = 3, .vocab_size = 256});
  model::LlamaModel m(mcfg, e.model_options());
  e.load_checkpoint(ckpt, "", &data);
  EXPECT_EQ(e.train_batch(m, data).loss, straight.back());
  // A thread the engine did not start uses the engine after binding, as the Python binding's callers may.
  std::thread other([&] { EXPECT_NO_THROW(e.train_batch(m, data)); });
  other.join();
}

INSTANTIATE_TEST_SUITE_P(Offload, ThreadDevice, ::testing::Values(OffloadDevice::cpu, OffloadDevice::nvme),
                         [](const auto& info) { return std::string(test::name(info.param)); });

}  // namespace
}  // namespace strata::zero3
