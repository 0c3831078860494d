// Frozen chunks (EngineOptions.frozen_chunks; UpdateRoute::trains false): the working copy alone in
// offload_param's tier — no gradient buffer, master, gradient shard or optimizer state — never changed by a
// step, while the chunks that train get the gradients a run training everything gets, and train bit for bit
// alike at every placement.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "tests/zero3/engine_util.h"
#include "zero3/placement.h"

namespace strata::zero3 {
namespace {

using test::make_config;
using Placement = std::tuple<OffloadDevice, OffloadDevice>;  // offload_param, offload_optimizer

const std::vector<int> kFrozen = {0, 2};  // 2-block model: the embedding and block 1 (chunks 0..3)
bool frozen(int c) {
  return std::find(kFrozen.begin(), kFrozen.end(), c) != kFrozen.end();
}

std::string placement_name(const ::testing::TestParamInfo<Placement>& i) {
  return test::placement_name(std::get<0>(i.param), std::get<1>(i.param), false);
}

class FrozenChunks : public ::testing::TestWithParam<Placement> {
 protected:
  Config config(const test::ScratchDir& dir) const {
    return make_config(std::get<0>(GetParam()), std::get<1>(GetParam()), dir.path());
  }
};

// Step 1's gradients of the chunks that train are bit for bit those of a run that trains every chunk (the
// frozen ones change neither the forward nor what flows back through them); the frozen chunks never hand
// off a gradient, and after three steps their params are what they started as.
TEST_P(FrozenChunks, TrainedChunksGetTheFullRunsGradientsAndFrozenOnesNeverChange) {
  test::ScratchDir dir("frozen");
  const Config cfg = config(dir);
  const model::ModelConfig mcfg = test::block_model("frozen", 2);
  const std::string tokens = test::make_tokens(dir);
  struct Seen {
    std::vector<std::vector<float>> first;  // per chunk: its first hand-off's gradients
    std::vector<int> handoffs;
  };
  auto run = [&](const std::vector<int>& freeze, Seen& seen, std::vector<std::vector<float>>* params_before,
                 std::vector<std::vector<float>>* params_after) {
    kernels::cpu::set_blas_threads(1);
    EngineOptions opts{.backend = "host", .seq_len = 32, .frozen_chunks = freeze};
    opts.testing.gradient_hook = [&](int c, float* g, std::size_t n) {
      if (seen.handoffs[std::size_t(c)]++ == 0) seen.first[std::size_t(c)].assign(g, g + n);
    };
    Engine engine(cfg, mcfg, opts);
    const int C = engine.layout().num_chunks();
    seen.first.assign(std::size_t(C), {});
    seen.handoffs.assign(std::size_t(C), 0);
    auto read_all = [&](std::vector<std::vector<float>>* out) {
      if (!out) return;
      out->clear();
      for (int c = 0; c < C; ++c) {
        out->emplace_back(engine.layout().chunk(c).padded_numel);
        engine.read_params(c, out->back().data());
      }
    };
    read_all(params_before);
    model::TokenFile file = model::TokenFile::open(tokens);
    model::DataLoader data(file,
                           {.batch_size = engine.micro_batch(), .seq_len = 32, .seed = 3, .vocab_size = 256});
    model::LlamaModel m(mcfg, engine.model_options());
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(engine.train_batch(m, data).applied);
    read_all(params_after);
  };
  Seen all, some;
  std::vector<std::vector<float>> before, after;
  run({}, all, nullptr, nullptr);
  run(kFrozen, some, &before, &after);
  for (int c = 0; c < int(all.first.size()); ++c) {
    SCOPED_TRACE("chunk " + std::to_string(c));
    if (frozen(c)) {
      EXPECT_EQ(some.handoffs[std::size_t(c)], 0) << "a frozen chunk handed off gradients";
      EXPECT_EQ(std::memcmp(before[std::size_t(c)].data(), after[std::size_t(c)].data(),
                            before[std::size_t(c)].size() * sizeof(float)),
                0)
          << "a frozen chunk's params changed";
    } else {
      ASSERT_EQ(some.first[std::size_t(c)].size(), all.first[std::size_t(c)].size());
      EXPECT_EQ(std::memcmp(some.first[std::size_t(c)].data(), all.first[std::size_t(c)].data(),
                            all.first[std::size_t(c)].size() * sizeof(float)),
                0)
          << "step 1's gradients differ from the full run's";
      EXPECT_NE(std::memcmp(before[std::size_t(c)].data(), after[std::size_t(c)].data(),
                            before[std::size_t(c)].size() * sizeof(float)),
                0)
          << "a chunk that trains did not change";
    }
  }
}

// The same frozen chunks train bit for bit alike wherever the state lives (the oracle the other routes
// keep: offload placements give the same losses).
TEST_P(FrozenChunks, LossesEqualThoseOfTheStateOnThePinnedTier) {
  test::ScratchDir dir("frozen-losses");
  const model::ModelConfig mcfg = test::block_model("frozen", 2);
  const std::string tokens = test::make_tokens(dir);
  const EngineOptions opts{.backend = "host", .seq_len = 32, .frozen_chunks = kFrozen};
  const test::Run here = test::train(config(dir), mcfg, tokens, 4, 32, opts);
  const test::Run pinned =
      test::train(make_config(OffloadDevice::cpu, OffloadDevice::cpu, dir.path()), mcfg, tokens, 4, 32, opts);
  EXPECT_EQ(here.losses, pinned.losses);
  const test::Run full = test::train(config(dir), mcfg, tokens, 4, 32, {.backend = "host", .seq_len = 32});
  EXPECT_EQ(here.losses.front(), full.losses.front()) << "step 1's forward is the same model";
  EXPECT_NE(here.losses.back(), full.losses.back()) << "freezing changed what trains";
}

INSTANTIATE_TEST_SUITE_P(Placements, FrozenChunks,
                         ::testing::Values(Placement{OffloadDevice::cpu, OffloadDevice::cpu},
                                           Placement{OffloadDevice::none, OffloadDevice::none},
                                           Placement{OffloadDevice::nvme, OffloadDevice::nvme}),
                         placement_name);

// The optimizer overlapped with backward updates the chunks that train and passes the frozen ones by: the
// same losses bit for bit as without it, with updates made during backward.
TEST(FrozenOverlap, LossesEqualThoseWithoutTheOverlap) {
  test::ScratchDir dir("frozen-overlap");
  const model::ModelConfig mcfg = test::block_model("frozen", 2);
  const std::string tokens = test::make_tokens(dir);
  Config on = make_config(OffloadDevice::cpu, OffloadDevice::cpu, dir.path()), off = on;
  on.strata.overlap_optimizer = StrataConfig::Overlap::on;
  off.strata.overlap_optimizer = StrataConfig::Overlap::off;
  const EngineOptions opts{.backend = "host", .seq_len = 32, .frozen_chunks = kFrozen};
  kernels::cpu::set_blas_threads(1);
  Engine e(on, mcfg, opts);
  const std::vector<UpdateRoute> routes = e.update_routes();
  for (int c : kFrozen) EXPECT_FALSE(routes[std::size_t(c)].overlap || routes[std::size_t(c)].defer);
  EXPECT_TRUE(routes[1].overlap || routes[3].overlap) << "a chunk that trains overlaps";
  EXPECT_EQ(test::train(on, mcfg, tokens, 4, 32, opts).losses,
            test::train(off, mcfg, tokens, 4, 32, opts).losses);
}

// A checkpoint of a run with frozen chunks resumes it bit for bit, into another placement too (the frozen
// chunks' working params are in it, the chunks that train have their master and states).
TEST(FrozenResume, TwoStepsSavedAndTwoMoreAreFourStepsBitForBit) {
  test::ScratchDir dir("frozen-resume");
  const model::ModelConfig mcfg = test::block_model("frozen", 2);
  const std::string tokens = test::make_tokens(dir);
  const Config pinned = make_config(OffloadDevice::cpu, OffloadDevice::cpu, dir.path());
  const Config nvme = make_config(OffloadDevice::nvme, OffloadDevice::nvme, dir.path());
  const EngineOptions opts{.backend = "host", .seq_len = 32, .frozen_chunks = kFrozen};
  const std::vector<double> whole = test::train(pinned, mcfg, tokens, 4, 32, opts).losses;
  const std::vector<double> resumed =
      test::resumed_losses(pinned, nvme, mcfg, tokens, dir.file("ckpt"), opts, 2, 2);
  EXPECT_EQ(resumed, whole);
}

// A frozen chunk's state is its working copy: the plan counts its params alone (no gradient buffer, no
// gradient shard, master or states), the tier manager holds no other tensor of it, and its route says so.
TEST(FrozenPlan, AFrozenChunkHoldsItsWorkingCopyOnly) {
  test::ScratchDir dir("frozen-plan");
  const Config cfg = make_config(OffloadDevice::cpu, OffloadDevice::cpu, dir.path());
  const model::ModelConfig mcfg = test::block_model("frozen", 2);
  Engine full(cfg, mcfg, {.backend = "host", .seq_len = 32});
  Engine some(cfg, mcfg, {.backend = "host", .seq_len = 32, .frozen_chunks = kFrozen});
  std::uint64_t saved = 0;  // pinned bytes a frozen chunk does without: fp32 gradient, master, two states
  for (int c : kFrozen) saved += 4ull * 4 * full.layout().chunk(c).padded_numel;
  EXPECT_EQ(some.plan().pinned_state, full.plan().pinned_state - saved);
  const std::vector<UpdateRoute> routes = some.update_routes();
  for (int c = 0; c < int(routes.size()); ++c) {
    EXPECT_EQ(routes[std::size_t(c)].trains, !frozen(c)) << "chunk " << c;
    EXPECT_EQ(describe(routes[std::size_t(c)]).rfind("frozen", 0) == 0, frozen(c)) << "chunk " << c;
    EXPECT_EQ(some.trains(c), !frozen(c));
  }
  for (tiering::TensorId id : some.tiers().tensor_ids()) {
    const tiering::TensorInfo info = some.tiers().info(id);
    if (!frozen(info.desc.chunk)) continue;
    EXPECT_TRUE(info.desc.kind == tiering::Kind::param) << info.desc.name << " of a frozen chunk";
  }
  EXPECT_LT(some.checkpoint_bytes(), full.checkpoint_bytes());
}

TEST(FrozenPlan, AChunkThatDoesNotExistIsRefusedByName) {
  test::ScratchDir dir("frozen-bad");
  const Config cfg = make_config(OffloadDevice::cpu, OffloadDevice::cpu, dir.path());
  try {
    Engine e(cfg, test::block_model("frozen", 2), {.backend = "host", .seq_len = 32, .frozen_chunks = {9}});
    FAIL() << "accepted chunk 9 of 4";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("EngineOptions.frozen_chunks: chunk 9 does not exist"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace strata::zero3
