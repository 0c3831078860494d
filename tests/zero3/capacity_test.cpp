// A model whose state is 10x the device's room fails up front without offload, with an OutOfMemory that
// names the offload settings. (With cpu and nvme offload it trains: tests/zero3/backend_test.cpp, every
// backend.) The room is what the cap leaves beside the compute interface's own bytes (its matrix-product
// workspace: cuBLASLt's on cuda, the stand-in of tests/common/workspace_standin.cpp on the host), which the
// engine takes before it plans.
#include <gtest/gtest.h>

#include "engine_util.h"

namespace strata::zero3 {
namespace {

using test::make_config;
using test::ScratchDir;

constexpr std::uint64_t kRoom = 6ull << 20;
constexpr int kLayers = 22;  // about 4.8M parameters: 77 MB of state at 16 bytes each, 12x the room

// The compute interface's own bytes and the room (the same with every offload target: they depend on the
// model's shapes alone, so they are read once from an engine that keeps its state off the device).
std::uint64_t cap() {
  static const std::uint64_t ops = [] {
    ScratchDir d("capacity-ops");
    return test::ops_device_bytes(make_config(OffloadDevice::cpu, OffloadDevice::cpu, d.path()),
                                  test::block_model("capacity-test", kLayers), {.backend = ""});
  }();
  return ops + kRoom;
}

TEST(Capacity, WithoutOffloadFailsBeforeTrainingNamingTheOffloadSettings) {
  ScratchDir d("capacity-none");
  Config cfg = make_config(OffloadDevice::none, OffloadDevice::none, d.path());
  try {
    Engine engine(cfg, test::block_model("capacity-test", kLayers),
                  {.backend = "", .device_memory_cap = cap()});
    FAIL() << "a model with 10x the device's room in state was accepted without offload";
  } catch (const OutOfMemory& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("the model does not fit the device"), std::string::npos) << m;  // the plan's refusal
    EXPECT_NE(m.find("offload_param.device"), std::string::npos) << m;
    EXPECT_NE(m.find("offload_optimizer.device"), std::string::npos) << m;
    EXPECT_NE(m.find("device_memory_cap"), std::string::npos) << m;
  }
}

TEST(Capacity, OptimizerOffloadAloneIsNotEnoughForParamsThatDoNotFit) {
  ScratchDir d("capacity-param");
  // Working params (2 bytes each) alone are ~9.6 MB: above the room without offload_param.
  Config cfg = make_config(OffloadDevice::none, OffloadDevice::cpu, d.path());
  try {
    Engine(cfg, test::block_model("capacity-test", kLayers), {.backend = "", .device_memory_cap = cap()});
    FAIL() << "working params above the device's room were accepted without offload_param";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("the model does not fit the device"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata::zero3
