// Model state at home on the device, reached by stream work only (what a device the CPU cannot address —
// cuda — needs): initialised by copies, its gradients' norm and overflow checked by the compute
// interface's reductions, updated by the device optimizer (Ops::adamw), new working params copied to a
// host home, checkpoints through host memory. On the host backend EngineOptions.device_state_by_ops takes
// that path over the same memory, so it is tested here against the direct one; on cuda (when a GPU is
// visible, otherwise skipped with the reason) against the host backend.
#include <gtest/gtest.h>

#include <cmath>

#include "engine_util.h"
#include "tests/core/device_fixture.h"

namespace strata::zero3 {
namespace {

using test::make_config;
using test::make_tokens;
using test::ScratchDir;

// (backend, offload_param, offload_optimizer): every placement that keeps some state on the device.
using Case = std::tuple<std::string, OffloadDevice, OffloadDevice>;

class StateOnTheDevice : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (backend() == "cuda") {
      std::string why;
      if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA GPU visible: " << why;
    }
  }
  std::string backend() const { return std::get<0>(GetParam()); }
  Config config(const ScratchDir& d, const nlohmann::json& extra = nlohmann::json::object()) const {
    return make_config(std::get<1>(GetParam()), std::get<2>(GetParam()), d.path(), extra);
  }
  EngineOptions by_ops() const {
    return {.backend = backend(),
            .device_memory_cap = 0,
            .seq_len = 32,
            .testing = {.device_state_by_ops = true}};
  }
};

// The reductions and the optimizer are the compute interface's (kernels/cpu on the host), not the SIMD
// CPU optimizer's: the same arithmetic in another order, so the host-backend losses agree to a relative
// 1e-5 over 20 steps rather than bit for bit. On cuda (bf16 activations) the fp32 run's bound of the
// backend tests applies.
TEST_P(StateOnTheDevice, TwentyStepsTrackTheDirectPath) {
  ScratchDir d("device-state-track");
  const model::ModelConfig mcfg = model::ModelConfig::preset("tiny");
  const std::string tokens = make_tokens(d);
  const test::Run direct = test::train(config(d), mcfg, tokens, 20, 32, {.backend = "host"});
  const test::Run here = test::train(config(d), mcfg, tokens, 20, 32, by_ops());
  ASSERT_EQ(here.losses.size(), direct.losses.size());
  for (std::size_t i = 0; i < direct.losses.size(); ++i) {
    const double bound = backend() == "host" ? 1e-5 * direct.losses[i] : 0.02 + 0.02 * direct.losses[i];
    EXPECT_NEAR(here.losses[i], direct.losses[i], bound) << "step " << i + 1;
    EXPECT_TRUE(here.applied[i]) << "step " << i + 1;
  }
  EXPECT_LT(here.losses.back(), here.losses.front());
}

// Run to run, the stream path is deterministic: the same losses bit for bit.
TEST_P(StateOnTheDevice, RepeatsBitForBit) {
  if (backend() != "host") GTEST_SKIP() << "bit-for-bit repeats are a host-backend property";
  ScratchDir d("device-state-repeat");
  const model::ModelConfig mcfg = model::ModelConfig::preset("tiny");
  const std::string tokens = make_tokens(d);
  const test::Run a = test::train(config(d), mcfg, tokens, 4, 32, by_ops());
  const test::Run b = test::train(config(d), mcfg, tokens, 4, 32, by_ops());
  EXPECT_EQ(a.losses, b.losses);
}

// A checkpoint saved through the stream path resumes with the losses an uninterrupted run has, bit for bit.
TEST_P(StateOnTheDevice, CheckpointResumesBitIdentically) {
  ScratchDir d("device-state-resume");
  const model::ModelConfig mcfg = model::ModelConfig::preset("tiny");
  const std::string tokens = make_tokens(d);
  kernels::cpu::set_blas_threads(1);
  auto run = [&](Engine& e, model::DataLoader& data, model::LlamaModel& m, int steps) {
    std::vector<double> l;
    for (int i = 0; i < steps; ++i) l.push_back(e.train_batch(m, data).loss);
    return l;
  };
  model::TokenFile file = model::TokenFile::open(tokens);
  const model::DataOptions dopt{.batch_size = 2, .seq_len = 32, .seed = 3, .vocab_size = 256};
  std::vector<double> straight, resumed;
  {
    Engine e(config(d), mcfg, by_ops());
    model::DataLoader data(file, dopt);
    model::LlamaModel m(mcfg, e.model_options());
    straight = run(e, data, m, 4);
  }
  {
    Engine e(config(d), mcfg, by_ops());
    model::DataLoader data(file, dopt);
    model::LlamaModel m(mcfg, e.model_options());
    run(e, data, m, 2);
    e.save_checkpoint(d.file("ckpt"), {}, &data);
  }
  {
    Engine e(config(d), mcfg, by_ops());
    model::DataLoader data(file, dopt);
    model::LlamaModel m(mcfg, e.model_options());
    e.load_checkpoint(d.file("ckpt"), "", &data);
    resumed = run(e, data, m, 2);
  }
  ASSERT_EQ(resumed.size(), 2u);
  EXPECT_EQ(resumed[0], straight[2]);
  EXPECT_EQ(resumed[1], straight[3]);
}

// The plan counts the state, the gradient statistics, the working set, the activations and the compute
// interface's own bytes (its workspace: cuBLASLt's on cuda, the stand-in on the host): at the smallest cap it
// accepts, the run trains and the device never holds more than the cap.
TEST_P(StateOnTheDevice, TrainsAtTheSmallestCapThePlanAccepts) {
  ScratchDir d("device-state-cap");
  const model::ModelConfig mcfg = model::ModelConfig::preset("tiny");
  const Config cfg = config(d, {{"gradient_accumulation_steps", 1}});
  std::uint64_t need = 0;
  {
    Engine probe(cfg, mcfg, by_ops());
    const MemoryPlan& p = probe.plan();
    need = p.device_need();
    ASSERT_GT(p.device_ops, 0u);
  }
  EngineOptions o = by_ops();
  o.device_memory_cap = need;
  const test::Run r = test::train(cfg, mcfg, make_tokens(d), 3, 32, o);
  EXPECT_LT(r.losses.back(), r.losses.front());
  {
    Engine e(cfg, mcfg, o);
    model::TokenFile file = model::TokenFile::open(make_tokens(d));
    model::DataLoader data(file, {.batch_size = 2, .seq_len = 32, .seed = 3, .vocab_size = 256});
    model::LlamaModel m(mcfg, e.model_options());
    for (int i = 0; i < 2; ++i) e.train_batch(m, data);
    EXPECT_LE(e.device().memory_stats().peak_in_use, e.device().caps().capacity);
  }
}

INSTANTIATE_TEST_SUITE_P(Placements, StateOnTheDevice,
                         ::testing::Values(Case{"host", OffloadDevice::none, OffloadDevice::none},
                                           Case{"host", OffloadDevice::none, OffloadDevice::cpu},
                                           Case{"host", OffloadDevice::none, OffloadDevice::nvme},
                                           Case{"host", OffloadDevice::cpu, OffloadDevice::none},
                                           Case{"host", OffloadDevice::nvme, OffloadDevice::none},
                                           Case{"cuda", OffloadDevice::none, OffloadDevice::none},
                                           Case{"cuda", OffloadDevice::none, OffloadDevice::cpu},
                                           Case{"cuda", OffloadDevice::cpu, OffloadDevice::none}),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_param_" + test::name(std::get<1>(info.param)) +
                                  "_optim_" + test::name(std::get<2>(info.param));
                         });

// Only Adam and AdamW run on the device: Lion with the optimizer state there is refused before training,
// naming the settings that fix it.
TEST(DeviceStateByOps, ALionOptimizerOnTheDeviceIsRefusedNamingTheSettings) {
  ScratchDir d("device-state-lion");
  const Config cfg = make_config(OffloadDevice::none, OffloadDevice::none, d.path(),
                                 {{"optimizer", {{"type", "Lion"}, {"params", {{"lr", 1e-4}}}}}});
  try {
    Engine e(
        cfg, model::ModelConfig::preset("tiny"),
        {.backend = "host", .device_memory_cap = 0, .seq_len = 32, .testing = {.device_state_by_ops = true}});
    FAIL() << "Lion on the device was accepted";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("optimizer.type Lion"), std::string::npos) << what;
    EXPECT_NE(what.find("offload_optimizer.device"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace strata::zero3
