// zero_optimization.offload_optimizer.ratio (Note [Offload ratio] in zero3/engine_ratio.cpp): the first
// 1 - ratio of the optimizer sub-groups keep master, states and gradients on the device. On the host
// backend's direct path the arithmetic of each tensor is the same wherever it lives, so ratios 0, 0.5 and
// 1 train the same losses and fp32 master weights bit for bit, with the optimizer overlapped with
// backward or not; through the compute interface's device optimizer (device_state_by_ops) the device's
// reductions sum in another order, so they track to a relative 1e-5. The plan moves the bytes between
// the tiers, checkpoints load at any ratio, and "auto" chooses within the device memory it has.
#include <gtest/gtest.h>

#include "core/topology.h"
#include "tests/zero3/engine_util.h"

namespace strata::zero3::test {
namespace {

// (offload_param, offload_optimizer, device state by ops)
using Case = std::tuple<OffloadDevice, OffloadDevice, bool>;

const model::ModelConfig kModel = block_model("blocks", 3);
constexpr int kSeq = 32;
constexpr int kSteps = 5;

struct Result {
  std::vector<double> losses, norms;
  std::vector<std::vector<float>> masters;
  MemoryPlan plan;
  OverlapStats overlap;
  UpdateStats updates;
};

Result run(const Config& cfg, const std::string& tokens, bool by_ops, int steps = kSteps,
           std::uint64_t cap = 0, std::function<void(double&, double&)> rates = nullptr) {
  kernels::cpu::set_blas_threads(1);
  Engine e(cfg, kModel,
           {.backend = "host",
            .device_memory_cap = cap,
            .seq_len = kSeq,
            .testing = {.device_state_by_ops = by_ops, .measured_rates = std::move(rates)}});
  model::TokenFile file = model::TokenFile::open(tokens);
  model::DataLoader data(file,
                         {.batch_size = e.micro_batch(), .seq_len = kSeq, .seed = 3, .vocab_size = 256});
  model::LlamaModel m(kModel, e.model_options());
  Result r;
  for (int i = 0; i < steps; ++i) {
    const StepResult s = e.train_batch(m, data);
    r.losses.push_back(s.loss);
    r.norms.push_back(s.grad_norm);
  }
  for (int c = 0; c < e.layout().num_chunks(); ++c) r.masters.push_back(e.master_params(c));
  r.plan = e.plan();
  r.overlap = e.overlap_stats();
  r.updates = e.update_stats();
  return r;
}

nlohmann::json ratio(const nlohmann::json& value) {
  return {{"zero_optimization", {{"offload_optimizer", {{"ratio", value}}}}}};
}

class Ratio : public ::testing::TestWithParam<Case> {
 protected:
  Config config(const ScratchDir& d, const nlohmann::json& r, bool overlap = false) const {
    nlohmann::json extra = ratio(r);
    extra["strata"]["overlap_optimizer"] = overlap;
    return make_config(std::get<0>(GetParam()), std::get<1>(GetParam()), d.path(), extra);
  }
  bool by_ops() const { return std::get<2>(GetParam()); }
  void expect_same(const Result& a, const Result& b, const char* what) const {
    ASSERT_EQ(a.losses.size(), b.losses.size());
    if (!by_ops()) {
      EXPECT_EQ(a.losses, b.losses) << what;
      EXPECT_EQ(a.norms, b.norms) << what;
      EXPECT_EQ(a.masters, b.masters) << what;
      return;
    }
    for (std::size_t i = 0; i < a.losses.size(); ++i)
      EXPECT_NEAR(a.losses[i], b.losses[i], 1e-5 * b.losses[i]) << what << ", step " << i + 1;
  }
};

TEST_P(Ratio, ZeroHalfAndOneTrainTheSameLosses) {
  ScratchDir d("ratio-same");
  const std::string tokens = make_tokens(d);
  const Result one = run(config(d, 1.0), tokens, by_ops());
  const Result half = run(config(d, 0.5), tokens, by_ops());
  const Result zero = run(config(d, 0.0), tokens, by_ops());
  expect_same(half, one, "ratio 0.5 against 1");
  expect_same(zero, one, "ratio 0 against 1");
  EXPECT_LT(one.losses.back(), one.losses.front());
}

TEST_P(Ratio, OverlappedWithBackwardTheSameLosses) {
  ScratchDir d("ratio-overlap");
  const std::string tokens = make_tokens(d);
  const Result off = run(config(d, 1.0, false), tokens, by_ops());
  const Result on = run(config(d, 0.5, true), tokens, by_ops());
  expect_same(on, off, "ratio 0.5 overlapped against ratio 1 after backward");
  // Both ran: the offloaded sub-groups' updates during backward (not with NVMe-swapped states, Note
  // [Optimizer overlap]: after backward), the device's by its optimizer.
  if (std::get<1>(GetParam()) == OffloadDevice::nvme) {
    EXPECT_EQ(on.overlap.updates, 0u);
    EXPECT_GT(on.updates.cpu_optimizer, 0u);
  } else {
    EXPECT_GT(on.overlap.updates, 0u);
  }
  EXPECT_GT(on.updates.device_optimizer + on.updates.model_cpus, 0u);
  EXPECT_EQ(off.updates.device_optimizer + off.updates.model_cpus, 0u);
}

// DeepSpeed's rule: the first (1 - ratio) x G sub-groups keep the optimizer on the device, and the plan
// moves their master, states and gradients (16 bytes an element for AdamW) from host to device.
TEST_P(Ratio, ThePlanMovesTheFirstSubGroupsStateToTheDevice) {
  ScratchDir d("ratio-plan");
  const std::string tokens = make_tokens(d);
  const MemoryPlan one = run(config(d, 1.0), tokens, by_ops(), 1).plan;
  const MemoryPlan half = run(config(d, 0.5), tokens, by_ops(), 1).plan;
  const MemoryPlan zero = run(config(d, 0.0), tokens, by_ops(), 1).plan;
  const int G = one.optimizer_groups;
  ASSERT_GE(G, 2);
  EXPECT_EQ(one.device_optimizer_groups, 0);
  EXPECT_EQ(half.device_optimizer_groups, G / 2);
  EXPECT_EQ(zero.device_optimizer_groups, G);
  EXPECT_EQ(one.offload_ratio, 1.0);
  EXPECT_DOUBLE_EQ(half.offload_ratio, 1.0 - double(G / 2) / G);
  EXPECT_EQ(zero.offload_ratio, 0.0);
  // State moves from the host tiers to the device and none is lost (device bytes are allocator blocks, at
  // least the tensors' bytes).
  const std::uint64_t host_one = one.pinned_state + one.nvme_state,
                      host_half = half.pinned_state + half.nvme_state;
  EXPECT_LT(host_half, host_one);
  EXPECT_GE(half.device_state - one.device_state, host_one - host_half);
  EXPECT_GT(zero.device_state, half.device_state);
}

// A checkpoint holds every tensor whatever its home: saved at 0.5, it resumes at 1 (and the other way)
// with the losses of the run that never stopped.
TEST_P(Ratio, ACheckpointResumesAtAnotherRatio) {
  if (by_ops()) GTEST_SKIP() << "bit-for-bit resumes are the direct path's (the device reductions differ)";
  ScratchDir d("ratio-resume");
  const std::string tokens = make_tokens(d);
  auto trainer = [&](double r) {
    kernels::cpu::set_blas_threads(1);
    return std::make_unique<Engine>(
        config(d, r), kModel, EngineOptions{.backend = "host", .device_memory_cap = 0, .seq_len = kSeq});
  };
  auto steps = [&](Engine& e, model::DataLoader& data, model::LlamaModel& m, int n) {
    std::vector<double> l;
    for (int i = 0; i < n; ++i) l.push_back(e.train_batch(m, data).loss);
    return l;
  };
  model::TokenFile file = model::TokenFile::open(tokens);
  const model::DataOptions dopt{.batch_size = 2, .seq_len = kSeq, .seed = 3, .vocab_size = 256};
  std::vector<double> straight;
  {
    auto e = trainer(0.5);
    model::DataLoader data(file, dopt);
    model::LlamaModel m(kModel, e->model_options());
    straight = steps(*e, data, m, 4);
  }
  {
    auto e = trainer(0.5);
    model::DataLoader data(file, dopt);
    model::LlamaModel m(kModel, e->model_options());
    steps(*e, data, m, 2);
    e->save_checkpoint(d.file("ckpt"), {}, &data);
  }
  {
    auto e = trainer(1.0);
    model::DataLoader data(file, dopt);
    model::LlamaModel m(kModel, e->model_options());
    e->load_checkpoint(d.file("ckpt"), "", &data);
    EXPECT_EQ(steps(*e, data, m, 2), std::vector<double>(straight.begin() + 2, straight.end()));
  }
}

// "auto" measures and chooses; whatever it chooses trains the losses of ratio 1 (bit for bit on the
// direct path), within the plan.
TEST_P(Ratio, AutoChoosesASplitThatTrainsTheSameLosses) {
  ScratchDir d("ratio-auto");
  const std::string tokens = make_tokens(d);
  const Result one = run(config(d, 1.0), tokens, by_ops());
  const Result a = run(config(d, "auto"), tokens, by_ops());
  EXPECT_GE(a.plan.device_optimizer_groups, 0);
  EXPECT_LE(a.plan.device_optimizer_groups, a.plan.optimizer_groups);
  EXPECT_DOUBLE_EQ(a.plan.offload_ratio,
                   1.0 - double(a.plan.device_optimizer_groups) / a.plan.optimizer_groups);
  expect_same(a, one, "ratio auto against 1");
  // The host backend's direct path: the device's optimizer runs on the CPU's cores, so "auto" offloads
  // everything.
  if (!by_ops()) {
    EXPECT_EQ(a.plan.device_optimizer_groups, 0);
  }
}

// "auto" follows the measurement: a device optimizer measured far faster than the CPU's takes every
// sub-group the device has room for, one measured far slower none — and either trains ratio 1's losses.
TEST_P(Ratio, AutoChoosesWhatTheMeasuredRatesFavour) {
  if (!by_ops()) GTEST_SKIP() << "the host backend's direct path never splits (AutoChoosesASplit...)";
  ScratchDir d("ratio-auto-rates");
  const std::string tokens = make_tokens(d);
  const Result one = run(config(d, 1.0), tokens, by_ops(), 2);
  const Result fast = run(config(d, "auto"), tokens, by_ops(), 2, 0, [](double& cpu, double& device) {
    cpu = 1e6;
    device = 1e12;
  });
  const Result slow = run(config(d, "auto"), tokens, by_ops(), 2, 0, [](double& cpu, double& device) {
    cpu = 1e12;
    device = 1e6;
  });
  EXPECT_EQ(fast.plan.device_optimizer_groups, fast.plan.optimizer_groups);
  EXPECT_GT(fast.updates.device_optimizer, 0u);
  EXPECT_EQ(slow.plan.device_optimizer_groups, 0);
  EXPECT_EQ(slow.updates.device_optimizer, 0u);
  expect_same(fast, one, "auto (the device measured faster) against ratio 1");
  expect_same(slow, one, "auto (the CPU measured faster) against ratio 1");
}

// With no device memory beyond what ratio 1 needs, "auto" keeps every sub-group offloaded.
TEST_P(Ratio, AutoOffloadsEverythingWithoutDeviceRoom) {
  ScratchDir d("ratio-auto-tight");
  const std::string tokens = make_tokens(d);
  const MemoryPlan one = run(config(d, 1.0), tokens, by_ops(), 1).plan;
  const Result a = run(config(d, "auto"), tokens, by_ops(), 1, one.device_need());
  EXPECT_EQ(a.plan.device_optimizer_groups, 0);
}

INSTANTIATE_TEST_SUITE_P(Placements, Ratio,
                         ::testing::Values(Case{OffloadDevice::none, OffloadDevice::cpu, false},
                                           Case{OffloadDevice::cpu, OffloadDevice::cpu, false},
                                           Case{OffloadDevice::none, OffloadDevice::nvme, false},
                                           Case{OffloadDevice::nvme, OffloadDevice::nvme, false},
                                           Case{OffloadDevice::none, OffloadDevice::cpu, true},
                                           Case{OffloadDevice::cpu, OffloadDevice::cpu, true},
                                           Case{OffloadDevice::none, OffloadDevice::nvme, true}),
                         [](const auto& info) {
                           return placement_name(std::get<0>(info.param), std::get<1>(info.param),
                                                 std::get<2>(info.param));
                         });

// With cores of its own for the CPU optimizer (strata.cpu_optim.cores), the host backend's device
// optimizer steps the device's sub-groups on the other cpus at the same time: the same bits, overlapped
// with backward or not; "auto" offloads everything there (the model's cpus share the update anyway).
TEST(RatioCores, SideBySideOnSeparateCoresTrainTheSameBits) {
  const std::size_t n = allowed_cpus().size();
  if (n < 2) GTEST_SKIP() << "needs 2 cpus; this process may run on " << n;
  ScratchDir d("ratio-cores");
  const std::string tokens = make_tokens(d);
  auto cfg = [&](const nlohmann::json& r, bool overlap, int cores) {
    nlohmann::json extra = ratio(r);
    extra["strata"]["overlap_optimizer"] = overlap;
    extra["strata"]["cpu_optim"]["cores"] = cores;
    return make_config(OffloadDevice::none, OffloadDevice::cpu, d.path(), extra);
  };
  const Result one = run(cfg(1.0, false, 0), tokens, false);
  for (const bool overlap : {false, true}) {
    const Result half = run(cfg(0.5, overlap, 1), tokens, false);
    EXPECT_EQ(half.losses, one.losses) << "overlap " << overlap;
    EXPECT_EQ(half.masters, one.masters) << "overlap " << overlap;
    EXPECT_GT(half.plan.device_optimizer_groups, 0);
    const Result a = run(cfg("auto", overlap, 1), tokens, false);
    EXPECT_EQ(a.losses, one.losses) << "auto, overlap " << overlap;
    EXPECT_EQ(a.plan.device_optimizer_groups, 0);
  }
}

TEST(RatioRule, TheFirstSubGroupsStayOnTheDevice) {
  EXPECT_EQ(device_optimizer_groups(1.0, 8), 0);
  EXPECT_EQ(device_optimizer_groups(0.0, 8), 8);
  EXPECT_EQ(device_optimizer_groups(0.5, 8), 4);
  EXPECT_EQ(device_optimizer_groups(0.9, 10), 1);  // 0.1 x 10 in binary is just under 1
  EXPECT_EQ(device_optimizer_groups(0.7, 3), 0);   // 0.9 rounds down
  EXPECT_EQ(device_optimizer_groups(0.5, 1), 0);   // one sub-group: all of it offloaded
}

// One sub-group (DeepSpeed's default sub_group_size) at ratio 0.5 keeps none on the device, as DeepSpeed
// does, and trains as ratio 1.
TEST(RatioRule, OneSubGroupAtHalfIsOffloaded) {
  ScratchDir d("ratio-one-group");
  const Config cfg = make_config(
      OffloadDevice::none, OffloadDevice::cpu, d.path(),
      {{"zero_optimization", {{"sub_group_size", 1000000000}, {"offload_optimizer", {{"ratio", 0.5}}}}}});
  const Result r = run(cfg, make_tokens(d), false, 1);
  EXPECT_EQ(r.plan.optimizer_groups, 1);
  EXPECT_EQ(r.plan.device_optimizer_groups, 0);
}

// Lion has no device optimizer: with part of its state on a device reached by stream work, it is refused
// before training, naming the setting.
TEST(RatioRule, LionOnTheDeviceIsRefusedNamingTheRatio) {
  ScratchDir d("ratio-lion");
  const Config cfg = make_config(OffloadDevice::none, OffloadDevice::cpu, d.path(),
                                 {{"optimizer", {{"type", "Lion"}, {"params", {{"lr", 1e-4}}}}},
                                  {"zero_optimization", {{"offload_optimizer", {{"ratio", 0.5}}}}}});
  try {
    Engine e(cfg, kModel,
             {.backend = "host",
              .device_memory_cap = 0,
              .seq_len = kSeq,
              .testing = {.device_state_by_ops = true}});
    FAIL() << "Lion with ratio 0.5 on the device was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("offload_optimizer.ratio"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata::zero3::test
