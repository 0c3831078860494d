// The engine on every backend (host always; cuda when a GPU is visible, otherwise skipped with the
// reason): with cpu and with nvme offload, 20 steps track the host backend's losses (bit for bit on the
// host, within a bf16 bound on cuda); a model of 10x the device cap trains; the device memory in use does
// not grow over 200 steps; state at home on a device the CPU cannot address is refused by name.
#include <gtest/gtest.h>

#include <cmath>

#include "engine_util.h"
#include "tests/core/device_fixture.h"

namespace strata::zero3 {
namespace {

using test::make_config;
using test::make_tokens;
using test::ScratchDir;

using Case = std::tuple<std::string, OffloadDevice>;

class EngineOnBackend : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (std::get<0>(GetParam()) == "cuda") {
      std::string why;
      if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA GPU visible: " << why;
    }
  }
  std::string backend() const { return std::get<0>(GetParam()); }
  OffloadDevice off() const { return std::get<1>(GetParam()); }
};

TEST_P(EngineOnBackend, TwentyStepsTrackTheHostBackend) {
  ScratchDir d("backend-track");
  const Config cfg = make_config(off(), off(), d.path());
  const model::ModelConfig mcfg = model::ModelConfig::preset("tiny");
  const std::string tokens = make_tokens(d);
  const test::Run host = test::train(cfg, mcfg, tokens, 20, 32, {.backend = "host", .device_memory_cap = 0});
  const test::Run here =
      test::train(cfg, mcfg, tokens, 20, 32, {.backend = backend(), .device_memory_cap = 0});
  ASSERT_EQ(here.losses.size(), host.losses.size());
  for (std::size_t i = 0; i < host.losses.size(); ++i) {
    if (backend() == "host")
      EXPECT_EQ(here.losses[i], host.losses[i]) << "step " << i + 1;
    else  // bf16 activations: the per-step loss stays within 2% + 0.02 nats of the fp32 run's
      EXPECT_NEAR(here.losses[i], host.losses[i], 0.02 + 0.02 * host.losses[i]) << "step " << i + 1;
  }
  EXPECT_LT(here.losses.back(), here.losses.front());
}

// About 4.8M parameters, 77 MB of state; the device is capped at 6 MiB.
TEST_P(EngineOnBackend, AModelOfTenTimesTheCapTrains) {
  ScratchDir d("backend-cap");
  model::ModelConfig mcfg;
  mcfg.name = "backend-cap";
  mcfg.vocab_size = 256, mcfg.d_model = 128, mcfg.n_layers = 22, mcfg.n_heads = 4, mcfg.n_kv_heads = 4;
  mcfg.ffn_dim = 384, mcfg.max_seq_len = 64;
  const std::uint64_t cap = 6ull << 20;
  ASSERT_GE(std::uint64_t(mcfg.num_parameters()) * 16, 10 * cap);
  const Config cfg = make_config(off(), off(), d.path(), {{"gradient_accumulation_steps", 1}});
  kernels::cpu::set_blas_threads(1);
  Engine engine(cfg, mcfg, {.backend = backend(), .device_memory_cap = cap, .seq_len = 16});
  model::TokenFile file = model::TokenFile::open(make_tokens(d));
  model::DataLoader data(file, {.batch_size = 2, .seq_len = 16, .seed = 3, .vocab_size = 256});
  model::LlamaModel m(mcfg, engine.model_options());
  std::vector<double> losses;
  for (int i = 0; i < 3; ++i) losses.push_back(engine.train_batch(m, data).loss);
  EXPECT_LT(losses.back(), losses.front());
  EXPECT_LE(engine.device().memory_stats().peak_in_use, engine.device().caps().capacity);
}

// After the first steps have sized every buffer, 200 more leave the device's bytes in use where they were.
TEST_P(EngineOnBackend, DeviceMemoryDoesNotGrowOverTwoHundredSteps) {
  ScratchDir d("backend-leak");
  const Config cfg = make_config(off(), off(), d.path(), {{"gradient_accumulation_steps", 1}});
  const model::ModelConfig mcfg = model::ModelConfig::preset("tiny");
  kernels::cpu::set_blas_threads(1);
  Engine engine(cfg, mcfg, {.backend = backend(), .device_memory_cap = 0, .seq_len = 16});
  model::TokenFile file = model::TokenFile::open(make_tokens(d));
  model::DataLoader data(file, {.batch_size = 1, .seq_len = 16, .seed = 3, .vocab_size = 256});
  model::LlamaModel m(mcfg, engine.model_options());
  for (int i = 0; i < 5; ++i) engine.train_batch(m, data);
  engine.device().synchronize();
  const DeviceMemoryStats warm = engine.device().memory_stats();
  for (int i = 0; i < 200; ++i) engine.train_batch(m, data);
  engine.device().synchronize();
  const DeviceMemoryStats after = engine.device().memory_stats();
  EXPECT_LE(after.in_use, warm.in_use);
  EXPECT_LE(after.allocations, warm.allocations);
  EXPECT_LE(after.pinned_in_use, warm.pinned_in_use);
}

INSTANTIATE_TEST_SUITE_P(Backends, EngineOnBackend,
                         ::testing::Combine(::testing::Values(std::string("host"), std::string("cuda")),
                                            ::testing::Values(OffloadDevice::cpu, OffloadDevice::nvme)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + test::name(std::get<1>(info.param));
                         });

TEST(EngineOnCuda, StateAtHomeOnTheDeviceIsRefusedNamingTheSettings) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA GPU visible: " << why;
  ScratchDir d("backend-none");
  try {
    Engine e(make_config(OffloadDevice::none, OffloadDevice::cpu, d.path()),
             model::ModelConfig::preset("tiny"), {.backend = "cuda", .device_memory_cap = 0, .seq_len = 16});
    FAIL() << "offload_param none was accepted on cuda";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("offload_param.device"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata::zero3
