// A bad config fails when the engine is built, before any training step, with a message naming the key.
#include <gtest/gtest.h>

#include "engine_util.h"

namespace strata::zero3 {
namespace {

using test::make_config;
using test::ScratchDir;

template <typename E>
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(EngineConfig, MissingNvmePathFailsWhenTheConfigIsRead) {
  nlohmann::json j = {{"train_micro_batch_size_per_gpu", 1},
                      {"zero_optimization", {{"stage", 3}, {"offload_optimizer", {{"device", "nvme"}}}}}};
  const std::string m = error_of<ConfigError>([&] { Config::parse(j); });
  EXPECT_NE(m.find("offload_optimizer.nvme_path"), std::string::npos) << m;
}

// Buffers that do not fit host memory are refused when the engine is built, naming what they are made of
// and the setting that sizes the largest: here offload_param.buffer_count.
TEST(EngineConfig, BuffersBeyondHostMemoryAreRefusedNamingTheSetting) {
  ScratchDir d("cfg-buffers-ram");
  const auto mcfg = model::ModelConfig::preset("tiny");
  const Config c =
      make_config(OffloadDevice::nvme, OffloadDevice::nvme, d.path(),
                  {{"zero_optimization", {{"offload_param", {{"buffer_count", 1'000'000'000'000}}}}}});
  const std::string m = error_of<OutOfMemory>([&] { Engine e(c, mcfg); });
  for (const char* must : {"does not fit host memory", "parameter read buffers (offload_param.buffer_count",
                           "lower zero_optimization.offload_param.buffer_count"})
    EXPECT_NE(m.find(must), std::string::npos) << "names no '" << must << "': " << m;
}

// DeepSpeed's buffer_size counts elements of one tensor; Strata reads whole chunks, so a config whose
// buffer_size is below the largest chunk trains as if it were the chunk's size: the same plan, the same
// losses.
TEST(EngineConfig, NvmeBufferSmallerThanAChunkReadsThroughChunkSizedBuffers) {
  ScratchDir d1("cfg-bufsize-small"), d2("cfg-bufsize-exact");
  const auto mcfg = model::ModelConfig::preset("tiny");
  Config small = make_config(OffloadDevice::nvme, OffloadDevice::cpu, d1.path(),
                             {{"zero_optimization", {{"offload_param", {{"buffer_size", 100}}}}}});
  Config exact = make_config(OffloadDevice::nvme, OffloadDevice::cpu, d2.path());
  {
    Engine e(small, mcfg), ref(exact, mcfg);
    EXPECT_EQ(e.plan().pinned_staging, ref.plan().pinned_staging);
  }
  const std::string tokens = test::make_tokens(d1);
  EXPECT_EQ(test::train(small, mcfg, tokens, 3).losses, test::train(exact, mcfg, tokens, 3).losses);
}

TEST(EngineConfig, TooFewOptimizerSwapBuffersIsRejected) {
  ScratchDir d("cfg-bufcount");
  Config cfg = make_config(OffloadDevice::cpu, OffloadDevice::nvme, d.path(),
                           {{"zero_optimization", {{"offload_optimizer", {{"buffer_count", 2}}}}}});
  const std::string m = error_of<ConfigError>([&] { Engine e(cfg, model::ModelConfig::preset("tiny")); });
  EXPECT_NE(m.find("offload_optimizer.buffer_count"), std::string::npos) << m;
}

TEST(EngineConfig, MoreThanOneRankIsRejected) {
  ScratchDir d("cfg-world");
  nlohmann::json j = {{"train_batch_size", 2}, {"zero_optimization", {{"stage", 3}}}};
  Config cfg = Config::parse(j, {{"world_size", 2}});
  const std::string m = error_of<ConfigError>([&] { Engine e(cfg, model::ModelConfig::preset("tiny")); });
  EXPECT_NE(m.find("world_size"), std::string::npos) << m;
}

TEST(EngineConfig, UnknownBackendIsRejected) {
  ScratchDir d("cfg-backend");
  Config cfg = make_config(OffloadDevice::cpu, OffloadDevice::cpu, d.path());
  EXPECT_THROW(Engine(cfg, model::ModelConfig::preset("tiny"), {.backend = "tpu"}), Error);
}

}  // namespace
}  // namespace strata::zero3
