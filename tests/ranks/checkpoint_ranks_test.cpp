// Checkpoints over ranks: every rank writes its shard file and rank 0 the metadata, committed together;
// a checkpoint saved by 2 ranks resumes on 2 and on 1 rank bit for bit (the same samples per step), and
// on 3 ranks (run by ctest as a second job, ranks_np3, after ranks_np2 has saved it) within a bound:
// there the micro-batches group the same samples differently, so gradients sum in another order.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "engine_util.h"
#include "tests/ranks/ranks_env.h"
#include "zero3/checkpoint.h"

namespace strata::zero3 {
namespace {

using test::make_config;
using test::make_tokens;
using test::ScratchDir;
using test::Trainer;

// A directory both jobs see: ranks_np2 saves there, ranks_np3 loads.
std::string shared_dir() {
  const std::string d = (strata::test::scratch_root() / "ranks-reshard").string();
  std::filesystem::create_directories(d);
  return d;
}

// Stage 3 with cpu offload, or stage 2 (parameters whole on every rank's device) with the optimizer's.
Config config(const std::string& dir, int micro, int accumulation, int world, int stage = 3) {
  return make_config(
      stage == 3 ? OffloadDevice::cpu : OffloadDevice::none, OffloadDevice::cpu, dir,
      {{"train_micro_batch_size_per_gpu", micro},
       {"gradient_accumulation_steps", accumulation},
       {"zero_optimization", {{"stage", stage}}},
       {"scheduler",
        {{"type", "WarmupDecayLR"},
         {"params", {{"warmup_num_steps", 2}, {"total_num_steps", 20}, {"warmup_max_lr", 3e-3}}}}}},
      world);
}

class RanksAtTwo : public ::testing::Test {
 protected:
  void SetUp() override {
    if (testing::ranks().world_size() != 2) GTEST_SKIP() << "run under mpirun -np 2 (ctest's ranks_np2)";
  }
};

TEST_F(RanksAtTwo, ACheckpointResumesOnTwoRanksBitForBit) {
  comm::Communicator& w = testing::ranks();
  ScratchDir d("ranks-ckpt2-r" + std::to_string(w.rank()));
  const std::string tokens = make_tokens(d);
  const std::string ckpt = shared_dir() + "/two";
  const std::vector<double> straight = Trainer(config(d.path(), 1, 1, 2), tokens, &w).run(4);
  {
    Trainer t(config(d.path(), 1, 1, 2), tokens, &w);
    t.run(2);
    t.engine.save_checkpoint(ckpt, {}, &t.data);
  }
  Trainer t(config(d.path(), 1, 1, 2), tokens, &w);
  t.engine.load_checkpoint(ckpt, "", &t.data);
  const std::vector<double> resumed = t.run(2);
  EXPECT_EQ(resumed[0], straight[2]);
  EXPECT_EQ(resumed[1], straight[3]);
}

// Resharded onto one rank with twice the accumulation: the losses the two ranks would have had. Stage 3
// (every tensor sharded) and stage 2 (working params whole on each rank, saved as slices).
class RanksAtTwoByStage : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (testing::ranks().world_size() != 2) GTEST_SKIP() << "run under mpirun -np 2 (ctest's ranks_np2)";
  }
};

TEST_P(RanksAtTwoByStage, ACheckpointOfTwoRanksResumesOnOneRankBitForBit) {
  const int stage = GetParam();
  comm::Communicator& w = testing::ranks();
  ScratchDir d("ranks-ckpt1-r" + std::to_string(w.rank()));
  const std::string tokens = make_tokens(d);
  const std::string ckpt = shared_dir() + "/to-one-stage" + std::to_string(stage);
  const std::vector<double> straight = Trainer(config(d.path(), 1, 1, 2, stage), tokens, &w).run(4);
  {
    Trainer t(config(d.path(), 1, 1, 2, stage), tokens, &w);
    t.run(2);
    t.engine.save_checkpoint(ckpt, {}, &t.data);
  }
  if (w.rank() == 0) {  // one rank on its own: the single-rank communicator
    std::unique_ptr<comm::Communicator> one = comm::make_single_rank();
    Trainer t(config(d.path(), 1, 2, 1, stage), tokens, one.get());
    t.engine.load_checkpoint(ckpt, "", &t.data);
    const std::vector<double> resumed = t.run(2);
    EXPECT_EQ(resumed[0], straight[2]);
    EXPECT_EQ(resumed[1], straight[3]);
  }
  w.barrier();
}

INSTANTIATE_TEST_SUITE_P(Stages, RanksAtTwoByStage, ::testing::Values(3, 2),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });

// Saves for ranks_np3: two ranks of micro-batch 3 (6 samples a step), the uninterrupted losses written
// next to the checkpoint.
TEST_F(RanksAtTwo, SavesACheckpointForThreeRanks) {
  comm::Communicator& w = testing::ranks();
  ScratchDir d("ranks-ckpt3-r" + std::to_string(w.rank()));
  const std::string tokens = make_tokens(d);
  const std::string ckpt = shared_dir() + "/to-three";
  const std::vector<double> straight = Trainer(config(d.path(), 3, 1, 2), tokens, &w).run(4);
  Trainer t(config(d.path(), 3, 1, 2), tokens, &w);
  t.run(2);
  t.engine.save_checkpoint(ckpt, {}, &t.data);
  if (w.rank() == 0) {
    std::ofstream out(shared_dir() + "/to-three.losses");
    out.precision(17);
    for (double l : straight) out << l << "\n";
  }
  w.barrier();
  // What ranks_np3 will load: latest names this step's checkpoint, and this rank's shard reads back.
  const CheckpointReader r(ckpt, "", w.rank());
  EXPECT_EQ(r.tag(), step_tag(t.engine.global_step()));
  EXPECT_EQ(r.meta().at("step"), t.engine.global_step());
  EXPECT_EQ(straight.size(), 4u);
}

TEST(RanksAtThree, ACheckpointOfTwoRanksResumesOnThree) {
  comm::Communicator& w = testing::ranks();
  if (w.world_size() != 3) GTEST_SKIP() << "run under mpirun -np 3 (ctest's ranks_np3)";
  std::ifstream in(shared_dir() + "/to-three.losses");
  ASSERT_TRUE(in) << "ranks_np2 saves the checkpoint this test loads";
  std::vector<double> straight;
  for (double l; in >> l;) straight.push_back(l);
  ASSERT_EQ(straight.size(), 4u);
  ScratchDir d("ranks-ckpt3-load-r" + std::to_string(w.rank()));
  Trainer t(config(d.path(), 2, 1, 3), make_tokens(d), &w);
  t.engine.load_checkpoint(shared_dir() + "/to-three", "", &t.data);
  EXPECT_EQ(t.engine.global_step(), 2);
  const std::vector<double> resumed = t.run(2);
  // The same 6 samples a step in other micro-batches: the per-row losses and gradients are the same
  // arithmetic, their sums group differently (fp32), so the losses agree to a relative 1e-5.
  EXPECT_NEAR(resumed[0], straight[2], 1e-5 * straight[2]);
  EXPECT_NEAR(resumed[1], straight[3], 1e-5 * straight[3]);
}

}  // namespace
}  // namespace strata::zero3
