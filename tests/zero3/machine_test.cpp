// This machine's rates (zero3/machine.h): the compute's figures kept in the rates cache per set of shapes
// as the fastest any run measured, and predicted with (Note [The fastest run's compute] in
// zero3/machine.cpp), so that a start-up sampled while the cores were busy does not slow the prediction.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/ops.h"
#include "zero3/machine.h"

namespace strata::zero3::test {
namespace {

class MachineRatesCache : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "/machine_rates_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".json";
    std::filesystem::remove(path_);
    ::setenv("STRATA_RATES_CACHE", path_.c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("STRATA_RATES_CACHE");
    std::filesystem::remove(path_);
  }

  MachineRates measure() {
    std::unique_ptr<Device> dev = open_device({.backend = "host", .ordinal = 0, .memory_cap = 0});
    std::unique_ptr<Stream> compute = dev->create_stream("compute"), copy = dev->create_stream("copy");
    std::unique_ptr<kernels::Ops> ops = kernels::make_ops(*dev, *compute, {.matmul = DType::bf16});
    const MeasureKit kit{.dev = *dev,
                         .compute = *compute,
                         .copy = *copy,
                         .ops = *ops,
                         .activation = DType::bf16,
                         .working = DType::bf16,
                         .cpu_optimizer = {},
                         .device_optimizer = {},
                         .optimizer = nullptr,
                         .nvme_dirs = {},
                         .aio = {},
                         .cores = 1};
    return measure_machine(kit, model::ModelConfig::preset("tiny"), 1, 16);
  }

  // Every compute figure the cache keeps for this machine, set to `v`.
  void set_kept(double v) {
    nlohmann::json doc = nlohmann::json::parse(std::ifstream(path_));
    int n = 0;
    for (auto& machine : doc)
      for (auto& shapes : machine["compute"])
        for (auto& figure : shapes) figure = v, ++n;
    ASSERT_EQ(n, 4) << doc.dump();  // products forward and backward, attention, elementwise ops
    std::ofstream(path_) << doc.dump();
  }

  double kept_forward() {
    const nlohmann::json doc = nlohmann::json::parse(std::ifstream(path_));
    return doc.begin()->at("compute").begin()->at("forward").get<double>();
  }

  std::string path_;
};

TEST_F(MachineRatesCache, AFasterFigureKeptForTheseShapesIsWhatIsPredictedWith) {
  (void)measure();
  set_kept(1e18);
  const MachineRates r = measure();
  EXPECT_EQ(r.compute_flops, 1e18);
  EXPECT_EQ(r.backward_flops, 1e18);
  EXPECT_EQ(r.attention_flops, 1e18);
  EXPECT_EQ(r.memory_bandwidth, 1e18);
}

TEST_F(MachineRatesCache, AFasterMeasurementReplacesASlowerFigureKept) {
  (void)measure();
  set_kept(1.0);
  const MachineRates r = measure();
  EXPECT_GT(r.compute_flops, 1.0);
  EXPECT_GT(r.attention_flops, 1.0);
  EXPECT_EQ(kept_forward(), r.compute_flops);
}

}  // namespace
}  // namespace strata::zero3::test
