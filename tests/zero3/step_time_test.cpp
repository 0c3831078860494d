// The step-time model (zero3/step_time.h): what a plan asks of a machine, the prediction from rates, the
// placements offload devices "auto" consider, and the engine's choice among them (Note [Placement auto] in
// zero3/engine_auto.cpp) with rates given, so that the choice does not depend on this machine.
#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/zero3/engine_util.h"
#include "zero3/step_time.h"

namespace strata::zero3::test {
namespace {

MachineRates rates(double flops = 1e12) {
  MachineRates m;
  m.name = "test";
  m.compute_flops = m.backward_flops = flops;
  m.attention_flops = flops;
  m.memory_bandwidth = 1e11;
  m.link_h2d = m.link_d2h = 1e10;
  m.cpu_optimizer = m.device_optimizer = 1e9;
  m.grad_norm = 1e10;
  m.nvme_read = m.nvme_write = 1e9;
  return m;
}

StepModel compute_only() {
  StepModel s;
  s.forward_flops = 1e12;
  s.backward_flops = 2e12;
  s.cpu_optimizer_elements = 1'000'000'000;
  s.host_norm_elements = 1'000'000'000;
  return s;
}

TEST(StepTime, TheProductsOfAForwardAreTwiceTokensTimesTheLinearWeights) {
  const model::ModelConfig m = block_model("products", 3);
  const int B = 2, T = 16;
  double flops = 0;
  for (const Product& p : forward_products(m, B, T, false)) flops += p.flops();
  // Every linear weight of a block (the block's parameters less its two norms' C each) and the head's.
  const double weights = double(m.n_layers) * double(m.block_parameters() - 2 * m.d_model) +
                         double(m.d_model) * double(m.vocab_size);
  EXPECT_DOUBLE_EQ(flops, 2.0 * B * T * weights);
}

TEST(StepTime, AFrozenBaseBackwardComputesOnlyTheInputGradients) {
  model::ModelConfig m = block_model("frozen", 2);
  double trains = 0, frozen = 0;
  for (const Product& p : forward_products(m, 1, 8, false)) trains += p.flops() * (p.trains ? 2 : 1);
  for (const Product& p : forward_products(m, 1, 8, true)) frozen += p.flops() * (p.trains ? 2 : 1);
  EXPECT_DOUBLE_EQ(frozen * 2, trains);
}

TEST(StepTime, ThePassIsTheLongestOfWhatRunsBesideTheCompute) {
  MachineRates m = rates();
  StepModel s = compute_only();
  StepPrediction p = predict_step(s, m);
  EXPECT_DOUBLE_EQ(p.compute, 3.0);  // 3e12 FLOP at 1e12
  EXPECT_DOUBLE_EQ(p.pass, p.compute);
  EXPECT_EQ(p.bottleneck, "compute");
  s.link.gathers = 50'000'000'000;  // 5 s over the link: the link is now the pass
  p = predict_step(s, m);
  EXPECT_DOUBLE_EQ(p.pass, 5.0);
  EXPECT_EQ(p.bottleneck, "host link");
  EXPECT_DOUBLE_EQ(p.step, p.pass + p.update);
}

TEST(StepTime, TheUpdateFollowsTheNormAndTakesTheLongerOfTheOptimizerAndTheDrive) {
  MachineRates m = rates();
  m.host_backend = false;
  StepModel s = compute_only();
  s.nvme_state_reads = 4'000'000'000;  // 4 s at 1 GB/s, beside 2 s of writes
  s.nvme_state_writes = 2'000'000'000;
  const StepPrediction p = predict_step(s, m);
  EXPECT_DOUBLE_EQ(p.norm, 0.1);
  EXPECT_DOUBLE_EQ(p.cpu_optimizer, 1.0);
  EXPECT_DOUBLE_EQ(p.nvme_optimizer, 4.0);
  EXPECT_DOUBLE_EQ(p.update, 4.1);
  EXPECT_EQ(p.bottleneck, "NVMe (optimizer states)");
  m.nvme_read = m.nvme_write = 1e10;  // a faster drive: the CPU optimizer is what is left
  EXPECT_DOUBLE_EQ(predict_step(s, m).update, 1.1);
}

TEST(StepTime, UpdatesOverlappedWithBackwardLeaveOnlyWhatBackwardDoesNotHide) {
  MachineRates m = rates();
  StepModel s = compute_only();
  s.overlapped_elements = s.cpu_optimizer_elements;  // 1 s of updates beside a 2 s backward
  EXPECT_DOUBLE_EQ(predict_step(s, m).cpu_optimizer, 0.0);
  s.backward_flops = 0.5e12;  // a 0.5 s backward hides half
  EXPECT_DOUBLE_EQ(predict_step(s, m).cpu_optimizer, 0.5);
}

TEST(StepTime, ARateThePlanNeedsAndTheMachineLacksIsNamed) {
  MachineRates m = rates();
  m.nvme_read = 0;
  StepModel s = compute_only();
  s.nvme_param_reads = 1'000'000;
  EXPECT_EQ(predict_step(s, m).missing, "the NVMe drive's read rate");
}

TEST(StepTime, ADescribedMachineReadsItsKeysAndRefusesUnknownOnes) {
  const nlohmann::json h100 = {{"name", "H100"},      {"device_memory", "80GiB"},  {"bf16_tflops", 600},
                               {"memory_gbps", 3000}, {"link_gbps", 50},           {"host_memory", "512GiB"},
                               {"cores", 16},         {"cpu_optimizer_gelems", 4}, {"nvme_read_gbps", 6}};
  const MachineRates m = machine_from_json(h100, "h100.json");
  EXPECT_EQ(m.device_memory, std::uint64_t(80) << 30);
  EXPECT_DOUBLE_EQ(m.compute_flops, 600e12);
  EXPECT_DOUBLE_EQ(m.attention_flops, 300e12);  // half the products' unless given
  EXPECT_DOUBLE_EQ(m.link_h2d, 50e9);
  EXPECT_DOUBLE_EQ(m.grad_norm, 16e9);
  EXPECT_DOUBLE_EQ(m.nvme_write, 0);
  nlohmann::json bad = h100;
  bad["bf16_tflop"] = 1;
  try {
    machine_from_json(bad, "h100.json");
    FAIL() << "an unknown key was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown key \"bf16_tflop\""), std::string::npos) << e.what();
  }
  bad = h100;
  bad.erase("memory_gbps");
  EXPECT_THROW(machine_from_json(bad, "h100.json"), ConfigError);
}

TEST(StepTime, AutoConsidersEveryPlacementTheStageAllowsAndMarksNvmeWithoutAPath) {
  Config cfg = make_config(OffloadDevice::none, OffloadDevice::none, "");
  std::vector<PlacementOption> all = placement_candidates(cfg.zero_optimization, true, true);
  ASSERT_EQ(all.size(), 9u);
  EXPECT_EQ(placement_name(all[5]), "param cpu / optimizer nvme");
  EXPECT_EQ(all[5].why_not, "no offload_optimizer.nvme_path");
  EXPECT_EQ(all[6].why_not, "no offload_param.nvme_path");
  cfg.zero_optimization.stage = 2;
  const std::vector<PlacementOption> two = placement_candidates(cfg.zero_optimization, true, true);
  ASSERT_EQ(two.size(), 2u);  // params stay on the device below stage 3; no NVMe
  EXPECT_EQ(placement_name(two[1]), "param none / optimizer cpu");
  cfg.zero_optimization.stage = 3;
  cfg.zero_optimization.offload_optimizer.ratio = 0.5;  // a split needs an offloaded optimizer
  for (const PlacementOption& o : placement_candidates(cfg.zero_optimization, false, true))
    EXPECT_NE(o.optimizer, OffloadDevice::none);
}

TEST(StepTime, TheFastestThatFitsIsTakenAndANearTieGoesToTheLessOffloaded) {
  std::vector<PlacementOption> o(3);
  o[0].fits = false, o[0].predicted.step = 0.5;
  o[1].fits = true, o[1].predicted.step = 1.0;
  o[2].fits = true, o[2].predicted.step = 0.995;
  EXPECT_EQ(fastest_placement(o), 1);
  o[2].predicted.step = 0.9;
  EXPECT_EQ(fastest_placement(o), 2);
  o[1].fits = o[2].fits = false;
  EXPECT_EQ(fastest_placement(o), -1);
}

// ---- the engine's choice (Note [Placement auto]) ----

// Both offload devices "auto", through the config's parser; NVMe under `nvme_dir` where it is given.
Config auto_config(const std::string& nvme_dir) {
  nlohmann::json z = {{"offload_param", {{"device", "auto"}}}, {"offload_optimizer", {{"device", "auto"}}}};
  if (!nvme_dir.empty()) z["offload_param"]["nvme_path"] = z["offload_optimizer"]["nvme_path"] = nvme_dir;
  Config cfg = make_config(OffloadDevice::none, OffloadDevice::none, "", {{"zero_optimization", z}});
  EXPECT_TRUE(cfg.zero_optimization.offload_param.device_auto);
  EXPECT_TRUE(cfg.zero_optimization.offload_optimizer.device_auto);
  return cfg;
}

TEST(PlacementAuto, TakesTheFastestPlacementThatFitsAndSetsTheConfigToIt) {
  ScratchDir d("placement-auto");
  const model::ModelConfig m = block_model("auto", 3);
  // A slow link and a fast device: everything on the device, which has the room.
  MachineRates fast_device = rates();
  fast_device.link_h2d = fast_device.link_d2h = 1e6;
  Engine a(auto_config(d.path()), m,
           {.backend = "host", .seq_len = 32, .testing = {.machine_rates = fast_device}});
  ASSERT_GE(a.chosen_placement(), 0);
  EXPECT_EQ(a.config().zero_optimization.offload_param.device, OffloadDevice::none);
  EXPECT_EQ(a.config().zero_optimization.offload_optimizer.device, OffloadDevice::none);
  EXPECT_FALSE(a.config().zero_optimization.offload_param.device_auto);
  EXPECT_GT(a.predicted_step().step, 0);
  // A device too small for the state: the choice is a placement that fits it, and the plan does.
  const std::uint64_t cap = a.plan().device_need() - a.plan().device_state / 2;
  Engine b(
      auto_config(d.path()), m,
      {.backend = "host", .device_memory_cap = cap, .seq_len = 32, .testing = {.machine_rates = rates()}});
  const PlacementOption& c = b.placements().at(std::size_t(b.chosen_placement()));
  EXPECT_TRUE(c.fits);
  EXPECT_LE(b.plan().device_need(), cap);
  EXPECT_NE(b.config().zero_optimization.offload_optimizer.device, OffloadDevice::none);
  for (const PlacementOption& o : b.placements()) {
    if (o.fits) {
      EXPECT_GE(o.predicted.step, c.predicted.step * 0.99) << placement_name(o);
    }
  }
}

TEST(PlacementAuto, RefusesWithTheSmallestChangeWhenNothingFits) {
  const model::ModelConfig m = block_model("auto", 3);
  const Config cfg = auto_config("");
  // A device 1 MiB short of the least any placement needs.
  std::uint64_t least = ~std::uint64_t(0);
  {
    Engine e(cfg, m, {.backend = "host", .seq_len = 32, .testing = {.machine_rates = rates()}});
    for (const PlacementOption& o : e.placements()) least = std::min(least, o.device_need);
  }
  try {
    Engine e(cfg, m,
             {.backend = "host",
              .device_memory_cap = least - (1 << 20),
              .seq_len = 32,
              .testing = {.machine_rates = rates()}});
    FAIL() << "a device smaller than every placement's need was accepted";
  } catch (const OutOfMemory& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("no placement of"), std::string::npos) << w;
    EXPECT_NE(w.find("The smallest change that fits: "), std::string::npos) << w;
    EXPECT_NE(w.find("a device of at least"), std::string::npos) << w;
  }
}

}  // namespace
}  // namespace strata::zero3::test
