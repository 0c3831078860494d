// A model whose state is at least 10x the device cap trains with cpu and with nvme offload, never taking
// more device memory than the cap; without offload it fails up front with an OutOfMemory that names the
// offload settings.
#include <gtest/gtest.h>

#include "engine_util.h"

namespace strata::zero3 {
namespace {

using test::make_config;
using test::make_tokens;
using test::ScratchDir;

// About 4.8M parameters (77 MB of state at 16 bytes each); every chunk's fp32 copy stays under 1 MiB so
// that the device's caching allocator serves it from its small pool.
model::ModelConfig wide_model() {
  model::ModelConfig c;
  c.name = "capacity-test";
  c.vocab_size = 256;
  c.d_model = 128;
  c.n_layers = 22;
  c.n_heads = 4;
  c.n_kv_heads = 4;
  c.ffn_dim = 384;
  c.max_seq_len = 64;
  return c;
}

constexpr std::uint64_t kCap = 6ull << 20;

class Capacity : public ::testing::TestWithParam<OffloadDevice> {};

TEST_P(Capacity, StateTenTimesTheCapTrainsWithOffload) {
  ScratchDir d("capacity");
  const OffloadDevice off = GetParam();
  const model::ModelConfig mcfg = wide_model();
  ASSERT_GE(std::uint64_t(mcfg.num_parameters()) * 16, 10 * kCap);
  Config cfg = make_config(off, off, d.path(), {{"gradient_accumulation_steps", 1}});
  kernels::cpu::set_blas_threads(1);
  Engine engine(cfg, mcfg, {.backend = "", .device_memory_cap = kCap, .seq_len = 16});
  EXPECT_GE(engine.plan().total_state(), 10 * kCap);
  model::TokenFile file = model::TokenFile::open(make_tokens(d));
  model::DataLoader data(file, {.batch_size = 2, .seq_len = 16, .seed = 3, .vocab_size = 256});
  model::LlamaModel m(mcfg, engine.model_options());
  std::vector<double> losses;
  for (int i = 0; i < 3; ++i) {
    StepResult r = engine.train_batch(m, data);
    EXPECT_TRUE(r.applied);
    losses.push_back(r.loss);
  }
  EXPECT_LT(losses.back(), losses.front());
  EXPECT_LE(engine.device().memory_stats().peak_in_use, kCap);
  EXPECT_EQ(engine.prefetch_stats().misses, 0u);
}

INSTANTIATE_TEST_SUITE_P(CpuAndNvme, Capacity, ::testing::Values(OffloadDevice::cpu, OffloadDevice::nvme),
                         [](const auto& info) { return std::string(test::name(info.param)); });

TEST(Capacity, WithoutOffloadFailsBeforeTrainingNamingTheOffloadSettings) {
  ScratchDir d("capacity-none");
  Config cfg = make_config(OffloadDevice::none, OffloadDevice::none, d.path());
  try {
    Engine engine(cfg, wide_model(), {.backend = "", .device_memory_cap = kCap});
    FAIL() << "a model with 10x the device's memory in state was accepted without offload";
  } catch (const OutOfMemory& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("offload_param.device"), std::string::npos) << m;
    EXPECT_NE(m.find("offload_optimizer.device"), std::string::npos) << m;
    EXPECT_NE(m.find("device_memory_cap"), std::string::npos) << m;
  }
}

TEST(Capacity, OptimizerOffloadAloneIsNotEnoughForParamsThatDoNotFit) {
  ScratchDir d("capacity-param");
  // Working params (2 bytes each) alone are ~9.6 MB: above the cap without offload_param.
  Config cfg = make_config(OffloadDevice::none, OffloadDevice::cpu, d.path());
  EXPECT_THROW(Engine(cfg, wide_model(), {.backend = "", .device_memory_cap = kCap}), OutOfMemory);
}

}  // namespace
}  // namespace strata::zero3
