// A model whose state is 10x the device cap fails up front without offload, with an OutOfMemory that names
// the offload settings. (With cpu and nvme offload it trains: tests/zero3/backend_test.cpp, every backend.)
#include <gtest/gtest.h>

#include "engine_util.h"

namespace strata::zero3 {
namespace {

using test::make_config;
using test::ScratchDir;

constexpr std::uint64_t kCap = 6ull << 20;
constexpr int kLayers = 22;  // about 4.8M parameters: 77 MB of state at 16 bytes each, 12x the cap

TEST(Capacity, WithoutOffloadFailsBeforeTrainingNamingTheOffloadSettings) {
  ScratchDir d("capacity-none");
  Config cfg = make_config(OffloadDevice::none, OffloadDevice::none, d.path());
  try {
    Engine engine(cfg, test::block_model("capacity-test", kLayers),
                  {.backend = "", .device_memory_cap = kCap});
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
  EXPECT_THROW(
      Engine(cfg, test::block_model("capacity-test", kLayers), {.backend = "", .device_memory_cap = kCap}),
      OutOfMemory);
}

}  // namespace
}  // namespace strata::zero3
