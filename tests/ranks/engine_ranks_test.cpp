// The engine at world size 2 (stage 3, host backend), run as two MPI ranks: each rank also trains the
// one-rank reference in-process over a single-rank communicator. DESIGN.md §7: N ranks give the losses of
// one rank that sees the same samples per step — here bit for bit: 2 ranks x micro-batch 1 against
// 1 rank x micro-batch 1 x accumulation 2 (two fp32 addends sum the same in either order, and the
// gradient norm adds the same per-block partials in the same order; zero3/engine_cache.cpp, Note
// [Ranks]).
#include <gtest/gtest.h>

#include <numeric>

#include "cpu_optim/cpu_optim.h"
#include "engine_util.h"
#include "model/loss_mask.h"
#include "tests/ranks/ranks_env.h"

namespace strata::zero3 {
namespace {

using test::make_config;
using test::make_tokens;
using test::ScratchDir;

struct RunResult {
  std::vector<double> losses, norms;
  std::uint64_t pinned_state = 0, nvme_state = 0, device_state = 0;
  std::uint64_t registered = 0;  // shard tensors' bytes in the tier manager
  int overlap_groups = 0;        // sub-groups updated during backward (plan)
  std::uint64_t overlap_updates = 0;
  MemoryPlan plan;
  std::uint64_t capacity = 0;  // the device capacity the engine planned with
};

// What a rank measures on its own, for RanksAgree: its device cap, the compute interface's device
// optimizer (device_state_by_ops, which offload_optimizer.ratio "auto" times), and its measured rates.
struct RankInputs {
  std::uint64_t cap = 0;
  bool by_ops = false;
  std::function<void(double&, double&)> rates = nullptr;
  std::vector<int> frozen = {};  // EngineOptions.frozen_chunks
  bool lora = false;             // LoRA adapters (r 4, every linear layer) over a frozen base
  bool nf4 = false;              // with lora: the base's projections in NF4 (model/nf4_chunk.h)
};

RunResult train(const Config& cfg, comm::Communicator& c, const std::string& tokens, int steps,
                const RankInputs& in = {}) {
  kernels::cpu::set_blas_threads(1);
  model::ModelConfig mcfg = model::ModelConfig::preset("tiny");
  if (in.lora)
    mcfg.lora = model::resolve_lora(mcfg, {.modules = {"all-linear"}},
                                    {.r = 4, .alpha = 8, .nf4_base = in.nf4}, "test");
  Engine e(cfg, mcfg,
           {.backend = "host",
            .device_memory_cap = in.cap,
            .seq_len = 32,
            .communicator = &c,
            .frozen_chunks = in.frozen,
            .testing = {.device_state_by_ops = in.by_ops, .measured_rates = in.rates}});
  model::TokenFile file = model::TokenFile::open(tokens);
  model::DataLoader data(file, {.batch_size = e.micro_batch(),
                                .seq_len = 32,
                                .rank = c.rank(),
                                .world = c.world_size(),
                                .seed = 3,
                                .vocab_size = 256});
  model::LlamaModel m(mcfg, e.model_options());
  RunResult r;
  for (int i = 0; i < steps; ++i) {
    const StepResult s = e.train_batch(m, data);
    r.losses.push_back(s.loss);
    r.norms.push_back(s.grad_norm);
  }
  r.pinned_state = e.plan().pinned_state;
  r.nvme_state = e.plan().nvme_state;
  r.device_state = e.plan().device_state;
  r.overlap_groups = e.plan().overlap_groups;
  r.plan = e.plan();
  r.capacity = e.device().caps().capacity;
  r.overlap_updates = e.overlap_stats().updates;
  // The tier manager's registry: the bytes of this rank's shard tensors (params, gradients, master,
  // moments; not the gathered copies or gradient buffers, which are whole chunks for a moment).
  for (tiering::TensorId id : e.tiers().tensor_ids()) {
    const tiering::TensorInfo t = e.tiers().info(id);
    if (t.desc.chunk >= 0 && t.desc.shard >= 0) r.registered += t.desc.bytes;
  }
  return r;
}

using Placement = std::tuple<OffloadDevice, OffloadDevice>;
class TwoRanks : public ::testing::TestWithParam<Placement> {
 protected:
  void SetUp() override {
    if (testing::ranks().world_size() != 2) GTEST_SKIP() << "run under mpirun -np 2 (ctest does)";
  }
  Config config(const ScratchDir& d, int accumulation, int world) const {
    return make_config(std::get<0>(GetParam()), std::get<1>(GetParam()), d.path(),
                       {{"train_micro_batch_size_per_gpu", 1}, {"gradient_accumulation_steps", accumulation}},
                       world);
  }
};

TEST_P(TwoRanks, LossesAndNormsAreOneRanksWithTheSameSamplesBitForBit) {
  ScratchDir d("ranks-exact-r" + std::to_string(testing::ranks().rank()));
  const std::string tokens = make_tokens(d);
  std::unique_ptr<comm::Communicator> one = comm::make_single_rank();
  const RunResult ref = train(config(d, 2, 1), *one, tokens, 6);
  const RunResult two = train(config(d, 1, 2), testing::ranks(), tokens, 6);
  ASSERT_EQ(two.losses.size(), ref.losses.size());
  for (std::size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_EQ(two.losses[i], ref.losses[i]) << "step " << i + 1;
    EXPECT_EQ(two.norms[i], ref.norms[i]) << "step " << i + 1;
  }
  EXPECT_LT(two.losses.back(), two.losses.front());
}

// The block inputs off the device (Note [Checkpoints off the device] in zero3/engine_checkpoints.h) at two
// ranks: the losses and norms of the run with them on the device, bit for bit.
TEST_P(TwoRanks, BlockInputsOffTheDeviceTrainTheSameLossesAndNormsBitForBit) {
  ScratchDir d("ranks-ckpt-offload-r" + std::to_string(testing::ranks().rank()));
  const std::string tokens = make_tokens(d);
  const auto run = [&](bool offload) {
    return train(make_config(std::get<0>(GetParam()), std::get<1>(GetParam()), d.path(),
                             {{"train_micro_batch_size_per_gpu", 1},
                              {"strata", {{"checkpoint_activations", true}}},
                              {"activation_checkpointing", {{"cpu_checkpointing", offload}}}},
                             2),
                 testing::ranks(), tokens, 3);
  };
  const RunResult on = run(true), off = run(false);
  EXPECT_TRUE(on.plan.activation_offload);
  EXPECT_EQ(on.losses, off.losses);
  EXPECT_EQ(on.norms, off.norms);
}

// Frozen chunks (the embedding and block 0 of tiny's four) are gathered at N ranks as at one and pass no
// gradient: the chunks that train give one rank's losses and norms, bit for bit.
TEST_P(TwoRanks, WithFrozenChunksLossesAndNormsAreOneRanksBitForBit) {
  ScratchDir d("ranks-frozen-r" + std::to_string(testing::ranks().rank()));
  const std::string tokens = make_tokens(d);
  std::unique_ptr<comm::Communicator> one = comm::make_single_rank();
  const RankInputs frozen{.frozen = {0, 1}};
  const RunResult ref = train(config(d, 2, 1), *one, tokens, 4, frozen);
  const RunResult two = train(config(d, 1, 2), testing::ranks(), tokens, 4, frozen);
  EXPECT_EQ(two.losses, ref.losses);
  EXPECT_EQ(two.norms, ref.norms);
  EXPECT_LT(two.losses.back(), two.losses.front());
}

// LoRA adapters over a frozen base (model/lora.h): the adapter chunks train at N ranks as at one, bit for
// bit.
TEST_P(TwoRanks, WithAdaptersLossesAndNormsAreOneRanksBitForBit) {
  ScratchDir d("ranks-lora-r" + std::to_string(testing::ranks().rank()));
  const std::string tokens = make_tokens(d);
  std::unique_ptr<comm::Communicator> one = comm::make_single_rank();
  const RankInputs lora{.lora = true};
  const RunResult ref = train(config(d, 2, 1), *one, tokens, 4, lora);
  const RunResult two = train(config(d, 1, 2), testing::ranks(), tokens, 4, lora);
  EXPECT_EQ(two.losses, ref.losses);
  EXPECT_EQ(two.norms, ref.norms);
  EXPECT_LT(two.losses.back(), two.losses.front());
}

// QLoRA's base (Note [NF4 base] in model/nf4_chunk.h): every rank packs the whole chunk and never
// all-gathers it; the adapters train at N ranks as at one, bit for bit.
TEST_P(TwoRanks, WithAnNf4BaseLossesAndNormsAreOneRanksBitForBit) {
  ScratchDir d("ranks-nf4-r" + std::to_string(testing::ranks().rank()));
  const std::string tokens = make_tokens(d);
  std::unique_ptr<comm::Communicator> one = comm::make_single_rank();
  const RankInputs qlora{.lora = true, .nf4 = true};
  const RunResult ref = train(config(d, 2, 1), *one, tokens, 4, qlora);
  const RunResult two = train(config(d, 1, 2), testing::ranks(), tokens, 4, qlora);
  EXPECT_EQ(two.losses, ref.losses);
  EXPECT_EQ(two.norms, ref.norms);
  EXPECT_LT(two.losses.back(), two.losses.front());
}

// A loss mask that makes samples count different numbers of targets, weighed by tokens (the default; Note
// [Loss weighting] in zero3/engine_step.cpp): two ranks sum the step's counted targets across them and
// give the losses and norms of one rank with the same samples, bit for bit — each micro-batch's factor is
// the same, and the reported loss sums the same terms in the same order.
TEST_P(TwoRanks, MaskedLossesWeighedByTokensAreOneRanksBitForBit) {
  ScratchDir d("ranks-masked-r" + std::to_string(testing::ranks().rank()));
  const std::string tokens = make_tokens(d);
  const std::size_t n = model::TokenFile::open(tokens).size();
  std::vector<std::uint8_t> mask(n);
  for (std::size_t i = 0; i < n; ++i)  // sparse in even samples of 32, dense in odd ones
    mask[i] = ((i * 2654435761u) >> 8) % 100 < ((i / 32) % 2 ? 80u : 15u) ? 1 : 0;
  model::write_mask_file(model::mask_path(tokens), mask);
  std::unique_ptr<comm::Communicator> one = comm::make_single_rank();
  const RunResult ref = train(config(d, 2, 1), *one, tokens, 4);
  const RunResult two = train(config(d, 1, 2), testing::ranks(), tokens, 4);
  ASSERT_EQ(two.losses.size(), ref.losses.size());
  for (std::size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_EQ(two.losses[i], ref.losses[i]) << "step " << i + 1;
    EXPECT_EQ(two.norms[i], ref.norms[i]) << "step " << i + 1;
  }
}

// The optimizer overlapped with backward (Note [Optimizer overlap] in zero3/engine_overlap.cpp) at two
// ranks: each rank updates its shards as their reduce-scatters land, and the losses and norms are those
// of the step after backward, bit for bit — clipping (gradient_clipping 1.0) fires on the early steps.
TEST_P(TwoRanks, OptimizerOverlapOnAndOffAreTheSameBitForBit) {
  if (std::get<1>(GetParam()) == OffloadDevice::nvme || std::get<0>(GetParam()) == OffloadDevice::nvme)
    GTEST_SKIP() << "the overlap does not apply with NVMe-resident state (Note [Optimizer overlap]): on and "
                    "off would be one configuration";
  ScratchDir d("ranks-overlap-r" + std::to_string(testing::ranks().rank()));
  const std::string tokens = make_tokens(d);
  Config on = config(d, 2, 2), off = config(d, 2, 2);
  on.strata.overlap_optimizer = StrataConfig::Overlap::on;
  off.strata.overlap_optimizer = StrataConfig::Overlap::off;
  const RunResult a = train(on, testing::ranks(), tokens, 6);
  const RunResult b = train(off, testing::ranks(), tokens, 6);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.norms, b.norms);
  // It applies here (the CPU optimizer in addressable memory): chunks were updated during backward.
  EXPECT_GT(a.overlap_groups, 0);
  EXPECT_GT(a.overlap_updates, 0u);
}

// zero_optimization.offload_optimizer.ratio at two ranks (Note [Offload ratio] in zero3/engine_ratio.cpp):
// ratios 0, 0.5 and 1 keep none, half and all of each rank's sub-groups offloaded, and train the same
// losses and norms bit for bit.
TEST_P(TwoRanks, OffloadRatiosZeroHalfAndOneAreTheSameBitForBit) {
  if (std::get<1>(GetParam()) == OffloadDevice::none) GTEST_SKIP() << "the optimizer is not offloaded";
  ScratchDir d("ranks-ratio-r" + std::to_string(testing::ranks().rank()));
  const std::string tokens = make_tokens(d);
  auto at = [&](double ratio) {
    Config c = config(d, 2, 2);
    c.zero_optimization.offload_optimizer.ratio = ratio;
    return train(c, testing::ranks(), tokens, 4);
  };
  const RunResult one = at(1.0), half = at(0.5), zero = at(0.0);
  EXPECT_EQ(half.losses, one.losses);
  EXPECT_EQ(half.norms, one.norms);
  EXPECT_EQ(zero.losses, one.losses);
  EXPECT_EQ(zero.norms, one.norms);
  // The state moved: ratio 0 keeps all of it on the device, 0.5 some.
  EXPECT_GT(half.device_state, one.device_state);
  EXPECT_GT(zero.device_state, half.device_state);
}

// Each rank holds its 1/N of the partitioned state, read from the tier manager's registry: the shards of
// chunks padded to whole multiples of world x the norm's block, so at most 2 x 8192 elements of padding per
// chunk beyond an even split.
TEST_P(TwoRanks, EachRankHoldsHalfTheState) {
  ScratchDir d("ranks-half-r" + std::to_string(testing::ranks().rank()));
  const std::string tokens = make_tokens(d);
  std::unique_ptr<comm::Communicator> one = comm::make_single_rank();
  const RunResult ref = train(config(d, 2, 1), *one, tokens, 1);
  const RunResult two = train(config(d, 1, 2), testing::ranks(), tokens, 1);
  const model::ModelLayout layout(model::ModelConfig::preset("tiny"));
  const std::uint64_t per_param = 2 + 4 + 4 + 8;  // bf16 working, fp32 gradient, master, two moments
  const std::uint64_t padding =
      std::uint64_t(layout.num_chunks()) * 2 * cpu_optim::kGradStatsBlock * per_param;
  const std::uint64_t total_ref = ref.registered, mine = two.registered;
  ASSERT_GT(mine, 0u);
  EXPECT_GE(2 * mine, total_ref);
  EXPECT_LE(2 * mine, total_ref + padding);
  // Every rank the same share, and the plan says what the tier manager holds (the plan counts device
  // bytes as allocator blocks, so at least that).
  EXPECT_EQ(testing::ranks().all_reduce_max(double(mine)), double(mine));
  EXPECT_GE(two.pinned_state + two.nvme_state + two.device_state, mine);
}

INSTANTIATE_TEST_SUITE_P(Stage3, TwoRanks,
                         ::testing::Values(Placement{OffloadDevice::cpu, OffloadDevice::cpu},
                                           Placement{OffloadDevice::none, OffloadDevice::none},
                                           Placement{OffloadDevice::none, OffloadDevice::cpu},
                                           Placement{OffloadDevice::cpu, OffloadDevice::nvme},
                                           Placement{OffloadDevice::nvme, OffloadDevice::nvme}),
                         [](const auto& info) {
                           return std::string("param_") + test::name(std::get<0>(info.param)) + "_optim_" +
                                  test::name(std::get<1>(info.param));
                         });

// Note [Ranks agree] in zero3/engine_plan.cpp: ranks with different device caps and different measured
// optimizer rates plan alike — the least cap, rank 0's choice of offload_optimizer.ratio "auto" — and
// train the losses of ranks given those same inputs, bit for bit. Rank 1's own inputs would plan
// otherwise: more device memory, and the device optimizer measured far faster.
TEST(RanksAgree, DifferentCapsAndMeasuredRatesMakeOnePlan) {
  comm::Communicator& ranks = testing::ranks();
  if (ranks.world_size() != 2) GTEST_SKIP() << "run under mpirun -np 2 (ctest does)";
  ScratchDir d("ranks-agree-r" + std::to_string(ranks.rank()));
  const std::string tokens = make_tokens(d);
  Config cfg = make_config(OffloadDevice::none, OffloadDevice::cpu, d.path(),
                           {{"train_micro_batch_size_per_gpu", 1},
                            {"zero_optimization", {{"offload_optimizer", {{"ratio", "auto"}}}}}},
                           2);
  // The least cap: what ratio 1 needs and a little more, so that "auto" has room for no sub-group.
  Config all_offloaded = cfg;
  all_offloaded.zero_optimization.offload_optimizer.ratio = 1.0;
  all_offloaded.zero_optimization.offload_optimizer.ratio_auto = false;
  const std::uint64_t small = train(all_offloaded, ranks, tokens, 1, {.by_ops = true}).plan.device_need();
  const std::uint64_t large = 8 * small;
  const auto cpu_faster = [](double& cpu, double& device) { cpu = 1e12, device = 1e6; };
  const auto device_faster = [](double& cpu, double& device) { cpu = 1e6, device = 1e12; };
  // Rank 1's inputs on both ranks: the plan it would make alone keeps sub-groups on the device.
  const RunResult rank1s =
      train(cfg, ranks, tokens, 1, {.cap = large, .by_ops = true, .rates = device_faster});
  ASSERT_GT(rank1s.plan.device_optimizer_groups, 0);
  // Rank 0's inputs on both ranks, and then each rank its own.
  const RunResult same = train(cfg, ranks, tokens, 4, {.cap = small, .by_ops = true, .rates = cpu_faster});
  const RunResult own =
      ranks.rank() == 0
          ? train(cfg, ranks, tokens, 4, {.cap = small, .by_ops = true, .rates = cpu_faster})
          : train(cfg, ranks, tokens, 4, {.cap = large, .by_ops = true, .rates = device_faster});
  EXPECT_EQ(own.capacity, small) << "every rank plans with the least capacity";
  EXPECT_EQ(own.plan.device_optimizer_groups, same.plan.device_optimizer_groups) << "rank 0's choice";
  EXPECT_EQ(own.plan.device_cache, same.plan.device_cache);
  EXPECT_EQ(own.plan.device_need(), same.plan.device_need());
  EXPECT_EQ(own.plan.checkpoint_activations, same.plan.checkpoint_activations);
  EXPECT_EQ(own.losses, same.losses);
  EXPECT_EQ(own.norms, same.norms);
  // And the ranks' plans are one: rank 1's cache budget as rank 0's.
  const double cache = double(own.plan.device_cache);
  EXPECT_EQ(ranks.all_reduce_max(cache), cache);
  EXPECT_EQ(-ranks.all_reduce_max(-cache), cache);
}

// A config resolved for one world size refuses another, naming both, before training.
TEST(RanksConfig, AWorldSizeMismatchIsRefusedNamingBoth) {
  if (testing::ranks().world_size() != 2) GTEST_SKIP() << "run under mpirun -np 2 (ctest does)";
  ScratchDir d("ranks-mismatch-r" + std::to_string(testing::ranks().rank()));
  try {
    Engine e(make_config(OffloadDevice::cpu, OffloadDevice::cpu, d.path()),
             model::ModelConfig::preset("tiny"),
             {.backend = "host", .device_memory_cap = 0, .seq_len = 32, .communicator = &testing::ranks()});
    FAIL() << "world_size 1 config accepted by 2 ranks";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("world_size 1 but 2 ranks"), std::string::npos) << e.what();
  }
}

// Ranks that freeze different chunks would issue different collectives: every rank refuses it by name,
// before any state exists.
TEST(RanksConfig, DifferentFrozenChunksAreRefusedOnEveryRank) {
  if (testing::ranks().world_size() != 2) GTEST_SKIP() << "run under mpirun -np 2 (ctest does)";
  const int rank = testing::ranks().rank();
  ScratchDir d("ranks-frozen-mismatch-r" + std::to_string(rank));
  try {
    Engine e(make_config(OffloadDevice::cpu, OffloadDevice::cpu, d.path(), nlohmann::json::object(), 2),
             model::ModelConfig::preset("tiny"),
             {.backend = "host",
              .device_memory_cap = 0,
              .seq_len = 32,
              .communicator = &testing::ranks(),
              .frozen_chunks = {rank + 1}});
    FAIL() << "rank " << rank << " accepted chunks frozen differently from the other rank";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("EngineOptions.frozen_chunks differs between ranks"),
              std::string::npos)
        << e.what();
  }
}

// Stages 1 and 2 (DeepSpeed's semantics: every rank keeps all working params; gradients all-reduced
// (stage 1) or reduce-scattered (stage 2) into this rank's partition; the updated slices all-gathered):
// the same bit-for-bit equality with one rank.
using StageCase = std::tuple<int, OffloadDevice>;  // stage, offload_optimizer (offload_param none)
class TwoRanksBelowStageThree : public ::testing::TestWithParam<StageCase> {};

TEST_P(TwoRanksBelowStageThree, LossesAndNormsAreOneRanksWithTheSameSamplesBitForBit) {
  if (testing::ranks().world_size() != 2) GTEST_SKIP() << "run under mpirun -np 2 (ctest does)";
  const auto [stage, optim] = GetParam();
  ScratchDir d("ranks-stage" + std::to_string(stage) + "-r" + std::to_string(testing::ranks().rank()));
  const std::string tokens = make_tokens(d);
  auto config = [&](int accumulation, int world) {
    return make_config(OffloadDevice::none, optim, d.path(),
                       {{"train_micro_batch_size_per_gpu", 1},
                        {"gradient_accumulation_steps", accumulation},
                        {"zero_optimization", {{"stage", stage}}}},
                       world);
  };
  std::unique_ptr<comm::Communicator> one = comm::make_single_rank();
  const RunResult ref = train(config(2, 1), *one, tokens, 6);
  const RunResult two = train(config(1, 2), testing::ranks(), tokens, 6);
  for (std::size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_EQ(two.losses[i], ref.losses[i]) << "step " << i + 1;
    EXPECT_EQ(two.norms[i], ref.norms[i]) << "step " << i + 1;
  }
  EXPECT_LT(two.losses.back(), two.losses.front());
  // The working params are whole on each rank: more state per rank than stage 3's half.
  EXPECT_GT(2 * (two.device_state + two.pinned_state + two.nvme_state),
            ref.device_state + ref.pinned_state + ref.nvme_state);
}

// Note [Stage 1 accumulates locally]: at stage 1 with accumulation 2 each rank sums its micro-batches on
// the device and reduces each chunk once a step — half of stage 2's reductions, one per micro-batch — and
// trains stage 2's losses to rounding (the sums are taken in another order).
TEST(StageOne, AccumulatesLocallyAndReducesOnceAStep) {
  comm::Communicator& ranks = testing::ranks();
  if (ranks.world_size() != 2) GTEST_SKIP() << "run under mpirun -np 2 (ctest does)";
  ScratchDir d("ranks-stage1-local-r" + std::to_string(ranks.rank()));
  const std::string tokens = make_tokens(d);
  const int steps = 4;
  auto run = [&](int stage) {
    const Config cfg = make_config(OffloadDevice::none, OffloadDevice::cpu, d.path(),
                                   {{"train_micro_batch_size_per_gpu", 1},
                                    {"gradient_accumulation_steps", 2},
                                    {"zero_optimization", {{"stage", stage}}}},
                                   2);
    kernels::cpu::set_blas_threads(1);
    Engine e(cfg, model::ModelConfig::preset("tiny"),
             {.backend = "host", .device_memory_cap = 0, .seq_len = 32, .communicator = &ranks});
    model::TokenFile file = model::TokenFile::open(tokens);
    model::DataLoader data(file, {.batch_size = e.micro_batch(),
                                  .seq_len = 32,
                                  .rank = ranks.rank(),
                                  .world = 2,
                                  .seed = 3,
                                  .vocab_size = 256});
    model::LlamaModel m(model::ModelConfig::preset("tiny"), e.model_options());
    std::vector<double> losses;
    for (int i = 0; i < steps; ++i) losses.push_back(e.train_batch(m, data).loss);
    return std::make_tuple(losses, e.transfer_stats(), e.plan(), e.layout().num_chunks());
  };
  const auto [one, one_moved, one_plan, chunks] = run(1);
  const auto [two, two_moved, two_plan, unused] = run(2);
  EXPECT_EQ(one_plan.device_accumulators, chunks) << "every chunk summed locally";
  EXPECT_EQ(one_moved.grad_reductions, std::uint64_t(chunks) * steps);
  EXPECT_EQ(two_moved.grad_reductions, 2 * std::uint64_t(chunks) * steps);
  EXPECT_EQ(2 * one_moved.grad_reduction_bytes, two_moved.grad_reduction_bytes);
  ASSERT_EQ(one.size(), two.size());
  for (std::size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(one[i], two[i], 1e-5 * two[i]) << "step " << i + 1;
  EXPECT_LT(one.back(), one.front());
}

INSTANTIATE_TEST_SUITE_P(StagesOneTwo, TwoRanksBelowStageThree,
                         ::testing::Combine(::testing::Values(1, 2),
                                            // NVMe offload needs stage 3 (the config says so)
                                            ::testing::Values(OffloadDevice::none, OffloadDevice::cpu)),
                         [](const auto& info) {
                           return "stage" + std::to_string(std::get<0>(info.param)) + "_optim_" +
                                  test::name(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace strata::zero3

namespace strata::zero3 {
namespace {

// Offload devices "auto" (Note [Placement auto] in zero3/engine_auto.cpp): ranks whose rates favour other
// placements take rank 0's choice, so that every rank plans alike.
TEST(RanksConfig, OffloadDevicesAutoTakeRankZerosChoice) {
  if (testing::ranks().world_size() != 2) GTEST_SKIP() << "run under mpirun -np 2 (ctest does)";
  const int rank = testing::ranks().rank();
  ScratchDir d("ranks-placement-auto-r" + std::to_string(rank));
  nlohmann::json z = {{"offload_param", {{"device", "auto"}}}, {"offload_optimizer", {{"device", "auto"}}}};
  const Config cfg = make_config(OffloadDevice::none, OffloadDevice::none, "", {{"zero_optimization", z}}, 2);
  // Rank 0: a slow link, so everything stays on the device; rank 1: a fast link and a device optimizer far
  // slower than the CPU's, so it would offload the optimizer.
  MachineRates r;
  r.compute_flops = r.backward_flops = r.attention_flops = 1e12;
  r.memory_bandwidth = 1e11;
  r.grad_norm = 1e10;
  r.cpu_optimizer = 1e9;
  r.link_h2d = r.link_d2h = rank == 0 ? 1e6 : 1e12;
  r.device_optimizer = rank == 0 ? 1e9 : 1e3;
  Engine e(
      cfg, model::ModelConfig::preset("tiny"),
      {.backend = "host", .seq_len = 32, .communicator = &testing::ranks(), .testing = {.machine_rates = r}});
  const double param = double(e.config().zero_optimization.offload_param.device);
  const double optimizer = double(e.config().zero_optimization.offload_optimizer.device);
  EXPECT_EQ(testing::ranks().all_reduce_max(param), param);
  EXPECT_EQ(testing::ranks().all_reduce_max(optimizer), optimizer);
  EXPECT_EQ(e.config().zero_optimization.offload_optimizer.device, OffloadDevice::none);  // rank 0's
}

}  // namespace
}  // namespace strata::zero3
