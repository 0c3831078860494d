// The CPU optimizer overlapped with backward (Note [Optimizer overlap] in zero3/engine_overlap.cpp): the
// same losses, norms and fp32 master weights bit for bit as with strata.overlap_optimizer false, in every
// placement where it applies — with clipping firing on some steps and not others, with fp16 overflows
// skipping steps (both roll the early updates back, and are counted), and when something other than a
// step follows the backward (the early updates are undone).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/topology.h"
#include "tests/zero3/engine_util.h"

namespace strata::zero3::test {
namespace {

// (offload_param, offload_optimizer, device state by ops)
using Case = std::tuple<OffloadDevice, OffloadDevice, bool>;

const model::ModelConfig kModel = block_model("blocks", 3);
constexpr int kSeq = 32;
constexpr int kSteps = 6;

struct Result {
  std::vector<double> losses, norms;
  std::vector<bool> applied;
  std::vector<std::vector<float>> masters;  // every chunk's, after the last step
  MemoryPlan plan;
  OverlapStats stats;
  UpdateStats updates;
};

Result run(const Config& cfg, const std::string& tokens, bool by_ops, int steps = kSteps,
           std::function<void(int, float*, std::size_t)> hook = nullptr) {
  kernels::cpu::set_blas_threads(1);
  Engine e(cfg, kModel,
           {.backend = "host",
            .device_memory_cap = 0,
            .seq_len = kSeq,
            .testing = {.device_state_by_ops = by_ops, .gradient_hook = std::move(hook)}});
  model::TokenFile file = model::TokenFile::open(tokens);
  model::DataLoader data(file,
                         {.batch_size = e.micro_batch(), .seq_len = kSeq, .seed = 3, .vocab_size = 256});
  model::LlamaModel m(kModel, e.model_options());
  Result r;
  for (int i = 0; i < steps; ++i) {
    const StepResult s = e.train_batch(m, data);
    r.losses.push_back(s.loss);
    r.norms.push_back(s.grad_norm);
    r.applied.push_back(s.applied);
  }
  for (int c = 0; c < e.layout().num_chunks(); ++c) r.masters.push_back(e.master_params(c));
  r.plan = e.plan();
  r.stats = e.overlap_stats();
  r.updates = e.update_stats();
  return r;
}

Config with_overlap(Config cfg, bool on) {
  cfg.strata.overlap_optimizer = on ? StrataConfig::Overlap::on : StrataConfig::Overlap::off;
  return cfg;
}

void expect_same(const Result& on, const Result& off) {
  EXPECT_EQ(on.losses, off.losses);
  EXPECT_EQ(on.norms, off.norms);
  EXPECT_EQ(on.applied, off.applied);
  ASSERT_EQ(on.masters.size(), off.masters.size());
  for (std::size_t c = 0; c < on.masters.size(); ++c)
    EXPECT_EQ(on.masters[c], off.masters[c]) << "chunk " << c;
}

// Steps whose clipping fired (grad_scale's test).
int clipped(const Result& r, double clip) {
  int n = 0;
  for (double norm : r.norms) n += (norm + 1e-6) / clip > 1.0 ? 1 : 0;
  return n;
}

class Overlap : public ::testing::TestWithParam<Case> {
 protected:
  Config config(const ScratchDir& d, const nlohmann::json& extra = nlohmann::json::object()) const {
    return make_config(std::get<0>(GetParam()), std::get<1>(GetParam()), d.path(), extra);
  }
  bool by_ops() const { return std::get<2>(GetParam()); }
  // An engine with unclipped steps and the optimizer overlapped or not, its data and model, after one
  // step; `then(engine, data, model)` goes on from there and its result is returned.
  template <class F>
  auto after_one_step(const ScratchDir& d, const std::string& tokens, bool overlap, F then) const {
    kernels::cpu::set_blas_threads(1);
    Engine e(with_overlap(config(d, {{"gradient_clipping", 1e9}}), overlap), kModel,
             {.backend = "host",
              .device_memory_cap = 0,
              .seq_len = kSeq,
              .testing = {.device_state_by_ops = by_ops()}});
    model::TokenFile file = model::TokenFile::open(tokens);
    model::DataLoader data(file,
                           {.batch_size = e.micro_batch(), .seq_len = kSeq, .seed = 3, .vocab_size = 256});
    model::LlamaModel m(kModel, e.model_options());
    e.train_batch(m, data);
    return then(e, data, m);
  }
};

TEST_P(Overlap, IsPlannedWithItsHostMemory) {
  ScratchDir d("overlap-plan");
  const Result r = run(with_overlap(config(d), true), make_tokens(d), by_ops(), 1);
  EXPECT_GT(r.plan.overlap_groups, 0);
  EXPECT_LE(r.plan.overlap_groups, r.plan.optimizer_groups);
  // AdamW in bf16: the master and two moments in fp32 and the bf16 working params, 14 bytes a parameter.
  EXPECT_GE(r.plan.overlap_host, std::uint64_t(14) * kModel.num_parameters());
}

TEST_P(Overlap, UnclippedStepsKeepTheEarlyUpdatesBitForBit) {
  ScratchDir d("overlap-unclipped");
  const std::string tokens = make_tokens(d);
  const nlohmann::json never = {{"gradient_clipping", 1e9}};
  const Result on = run(with_overlap(config(d, never), true), tokens, by_ops());
  const Result off = run(with_overlap(config(d, never), false), tokens, by_ops());
  expect_same(on, off);
  EXPECT_EQ(on.stats.steps, std::uint64_t(kSteps));
  EXPECT_EQ(on.stats.rollbacks, 0u);
  EXPECT_GT(on.stats.updates, 0u);
}

TEST_P(Overlap, ClippingOnSomeStepsRollsThoseBackBitForBit) {
  ScratchDir d("overlap-clipped");
  const std::string tokens = make_tokens(d);
  // A threshold above the first step's norm and below a later one: the runs agree with the unclipped one
  // up to the first step that clips, so step 1 keeps its early updates and that step rolls its back.
  const Result free = run(with_overlap(config(d, {{"gradient_clipping", 0.0}}), false), tokens, by_ops());
  double above = 0;
  for (std::size_t i = 1; i < free.norms.size(); ++i)
    if (free.norms[i] > free.norms[0] && (above == 0 || free.norms[i] < above)) above = free.norms[i];
  ASSERT_GT(above, 0) << "no step's norm exceeds the first's; the test needs one";
  const double clip = (free.norms[0] + above) / 2;
  const nlohmann::json at = {{"gradient_clipping", clip}};
  const Result on = run(with_overlap(config(d, at), true), tokens, by_ops());
  const Result off = run(with_overlap(config(d, at), false), tokens, by_ops());
  expect_same(on, off);
  const int fired = clipped(off, clip);
  ASSERT_GT(fired, 0) << "clipping never fired at " << clip;
  ASSERT_LT(fired, kSteps) << "clipping fired on every step at " << clip;
  // Each step kept its early updates, rolled them back, or made none because the step before clipped.
  EXPECT_GT(on.stats.rollbacks, 0u);
  EXPECT_GT(on.stats.steps, 0u);
  EXPECT_EQ(on.stats.steps + on.stats.rollbacks + on.stats.waited, std::uint64_t(kSteps));
  EXPECT_LE(on.stats.rollbacks, std::uint64_t(fired));
  EXPECT_EQ(on.stats.cancelled, 0u);
}

// A step that clips every time: after the first, the next ones wait (no early updates), and step() leaves
// the updates to the worker, which makes them while the next forward starts (each chunk's before its
// gather). The same bits as without the overlap, read back between steps too.
TEST_P(Overlap, UpdatesLeftToTheWorkerAfterTheStepAreTheSameBitForBit) {
  ScratchDir d("overlap-deferred");
  const std::string tokens = make_tokens(d);
  const nlohmann::json always = {{"gradient_clipping", 1e-6}};
  const Result on = run(with_overlap(config(d, always), true), tokens, by_ops());
  const Result off = run(with_overlap(config(d, always), false), tokens, by_ops());
  expect_same(on, off);
  EXPECT_EQ(on.stats.steps, 0u);
  EXPECT_EQ(on.stats.waited, std::uint64_t(kSteps - 1));
  // In place on the worker where the working params are (pinned memory, or a device the CPU addresses).
  const bool in_place = !(by_ops() && std::get<0>(GetParam()) == OffloadDevice::none);
  if (in_place) {
    EXPECT_GT(on.stats.deferred, 0u);
  } else {
    EXPECT_EQ(on.stats.deferred, 0u);
  }
}

TEST_P(Overlap, Fp16OverflowsSkipTheStepAndRollBackBitForBit) {
  ScratchDir d("overlap-fp16");
  const std::string tokens = make_tokens(d);
  const nlohmann::json fp16 = {{"gradient_clipping", 1e9},
                               {"bf16", {{"enabled", false}}},
                               {"fp16", {{"enabled", true}, {"initial_scale_power", 12}, {"hysteresis", 1}}}};
  // An inf in block 0's gradients in the backward of every third step's last micro-batch.
  auto hook = [] {
    return [calls = 0](int chunk, float* g, std::size_t) mutable {
      if (chunk != 1) return;
      ++calls;  // two micro-batches a step: block 0 is handed off twice a step
      if (calls % 6 == 4) g[5] = std::numeric_limits<float>::infinity();
    };
  };
  const Result on = run(with_overlap(config(d, fp16), true), tokens, by_ops(), kSteps, hook());
  const Result off = run(with_overlap(config(d, fp16), false), tokens, by_ops(), kSteps, hook());
  expect_same(on, off);
  const auto skipped = std::count(off.applied.begin(), off.applied.end(), false);
  ASSERT_EQ(skipped, 2);
  EXPECT_EQ(on.stats.rollbacks, std::uint64_t(skipped));
  EXPECT_EQ(on.stats.steps, std::uint64_t(kSteps - skipped));
}

TEST_P(Overlap, AForwardBeforeTheStepSeesTheLastStepsWeights) {
  ScratchDir d("overlap-cancel");
  const std::string tokens = make_tokens(d);
  auto drive = [&](bool overlap) {
    return after_one_step(d, tokens, overlap, [](Engine& e, model::DataLoader& data, model::LlamaModel& m) {
      // The accumulation's micro-batches, then one more before the step (a caller that counts its own).
      std::vector<double> seen;
      for (int i = 0; i < e.accumulation_steps(); ++i) seen.push_back(e.forward_backward(m, data.next()));
      std::vector<float> master = e.master_params(1);  // read between backward and step
      seen.push_back(e.forward_backward(m, data.next()));
      const StepResult s = e.step();
      seen.push_back(s.loss);
      seen.push_back(s.grad_norm);
      std::vector<float> after = e.master_params(1);
      return std::make_tuple(seen, master, after, e.overlap_stats());
    });
  };
  const auto [seen_on, master_on, after_on, stats] = drive(true);
  const auto [seen_off, master_off, after_off, unused] = drive(false);
  EXPECT_EQ(seen_on, seen_off);
  EXPECT_EQ(master_on, master_off);
  EXPECT_EQ(after_on, after_off);
  EXPECT_GT(stats.cancelled, 0u);
}

// An evaluation between the last backward and step() (the model's forward outside a training pass, as
// the Python engine's eval_loss runs it) sees the last step's weights, not the early updates — and the
// step after it is the step without overlap, bit for bit.
TEST_P(Overlap, AnEvalBetweenBackwardAndStepSeesTheLastStepsWeights) {
  ScratchDir d("overlap-eval");
  const std::string tokens = make_tokens(d);
  auto drive = [&](bool overlap) {
    return after_one_step(d, tokens, overlap, [](Engine& e, model::DataLoader& data, model::LlamaModel& m) {
      const model::Batch held_out = data.next();
      auto eval = [&] {
        return double(m.forward(e, held_out.inputs.data(), held_out.targets.data(), held_out.rows, kSeq));
      };
      std::vector<double> evals{eval()}, seen;
      for (int i = 0; i < e.accumulation_steps(); ++i) seen.push_back(e.forward_backward(m, data.next()));
      evals.push_back(eval());  // between backward and step
      const StepResult s = e.step();
      seen.push_back(s.loss);
      seen.push_back(s.grad_norm);
      evals.push_back(eval());
      return std::make_tuple(seen, evals, e.overlap_stats());
    });
  };
  const auto [seen_on, evals_on, stats] = drive(true);
  const auto [seen_off, evals_off, unused] = drive(false);
  EXPECT_EQ(seen_on, seen_off);
  EXPECT_EQ(evals_on, evals_off);
  EXPECT_EQ(evals_on[1], evals_on[0]) << "the eval before the step sees the last step's weights";
  EXPECT_NE(evals_on[2], evals_on[1]) << "and the step changed them";
  EXPECT_GT(stats.cancelled, 0u) << "the early updates were made, then undone for the eval";
}

INSTANTIATE_TEST_SUITE_P(Placements, Overlap,
                         ::testing::Values(Case{OffloadDevice::none, OffloadDevice::cpu, false},
                                           Case{OffloadDevice::cpu, OffloadDevice::cpu, false},
                                           Case{OffloadDevice::none, OffloadDevice::none, false},
                                           Case{OffloadDevice::none, OffloadDevice::cpu, true},
                                           Case{OffloadDevice::cpu, OffloadDevice::cpu, true}),
                         [](const auto& info) {
                           return placement_name(std::get<0>(info.param), std::get<1>(info.param),
                                                 std::get<2>(info.param));
                         });

// Where it does not apply, the step runs after backward as before, and says so in the plan.
TEST(OverlapFallback, NvmeOptimizerStatesAreUpdatedAfterBackward) {
  ScratchDir d("overlap-nvme");
  Config cfg = make_config(OffloadDevice::cpu, OffloadDevice::nvme, d.path());
  cfg.strata.overlap_optimizer = StrataConfig::Overlap::on;
  const Result r = run(cfg, make_tokens(d), false, 1);
  EXPECT_EQ(r.plan.overlap_groups, 0);
  EXPECT_EQ(r.plan.overlap_host, 0u);
}

// "auto" leaves it off on the host backend, where backward computes on the optimizer's cores.
TEST(OverlapFallback, AutoIsOffOnTheHostBackend) {
  ScratchDir d("overlap-auto");
  const Config cfg = make_config(OffloadDevice::none, OffloadDevice::cpu, d.path());
  ASSERT_EQ(cfg.strata.overlap_optimizer, StrataConfig::Overlap::automatic);
  EXPECT_EQ(run(cfg, make_tokens(d), false, 1).plan.overlap_groups, 0);
}

// Note [Cores] in zero3/engine_plan.cpp: strata.cpu_optim.cores keeps the rank's last cpus for the optimizer.
TEST(Cores, EveryCpuForTheOptimizerIsRefusedBeforeTraining) {
  ScratchDir d("cores-all");
  Config cfg = make_config(OffloadDevice::none, OffloadDevice::cpu, d.path());
  cfg.strata.cpu_optim.cores = std::int64_t(allowed_cpus().size());
  try {
    Engine e(cfg, kModel, {.backend = "host", .device_memory_cap = 0, .seq_len = kSeq});
    FAIL() << "every cpu given to the optimizer was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("strata.cpu_optim.cores"), std::string::npos) << e.what();
  }
}

// Cores of its own turn the overlap on ("auto") on the host backend; the model computing on the other cpus
// gives the same bits as every cpu shared.
TEST(Cores, TheOptimizersOwnCoresOverlapItAndTrainTheSameBits) {
  const std::size_t n = allowed_cpus().size();
  if (n < 2) GTEST_SKIP() << "needs 2 cpus; this process may run on " << n;
  ScratchDir d("cores-own");
  const std::string tokens = make_tokens(d);
  Config own = make_config(OffloadDevice::cpu, OffloadDevice::cpu, d.path(), {{"gradient_clipping", 1e9}});
  own.strata.cpu_optim.cores = 1;
  const Result split = run(own, tokens, false);
  const Result shared = run(
      with_overlap(
          make_config(OffloadDevice::cpu, OffloadDevice::cpu, d.path(), {{"gradient_clipping", 1e9}}), false),
      tokens, false);
  EXPECT_GT(split.plan.overlap_groups, 0);
  EXPECT_EQ(split.stats.steps, std::uint64_t(kSteps));
  expect_same(split, shared);
}

// Note [The optimizer's tail] in zero3/engine_update.cpp: with the optimizer on cores of its own, the
// model's idle cpus take a share of the update after backward (all of it without the overlap, clipped
// steps with it): the same bits as one optimizer on every cpu.
TEST(Cores, TheModelsCpusShareTheUpdateAfterBackwardWithTheSameBits) {
  const std::size_t n = allowed_cpus().size();
  if (n < 2) GTEST_SKIP() << "needs 2 cpus; this process may run on " << n;
  ScratchDir d("cores-tail");
  const std::string tokens = make_tokens(d);
  for (const OffloadDevice param : {OffloadDevice::none, OffloadDevice::cpu}) {
    Config own = with_overlap(make_config(param, OffloadDevice::cpu, d.path()), false);
    own.strata.cpu_optim.cores = 1;
    const Result split = run(own, tokens, false);
    const Result shared =
        run(with_overlap(make_config(param, OffloadDevice::cpu, d.path()), false), tokens, false);
    expect_same(split, shared);
    EXPECT_GT(split.updates.model_cpus, 0u) << "the model's cpus took a share";
    EXPECT_GT(split.updates.cpu_optimizer, 0u) << "beside the CPU optimizer";
    EXPECT_EQ(shared.updates.model_cpus, 0u);
  }
}

}  // namespace
}  // namespace strata::zero3::test
