// session::loader_shape and loader_options: the data loader both front-ends train with (strata train's
// loader and --epochs count, engine.token_loader), built from the engine of the stock demo config.
#include <gtest/gtest.h>

#include <cstdint>

#include "session/session.h"
#include "tests/common/demo_config.h"

namespace strata::session {
namespace {

// The tiny preset's engine on the demo config (host backend, micro-batch 4).
struct TinyRun {
  ModelSource src = open_model("tiny", Weights::fresh_only);
  Config cfg = resolve_config({.path = "", .doc = test::demo_config_doc(), .origin = "demo_cpu.json"}, {},
                              src.config, {});
  Trainer t = build(cfg, src, 16, {}, {.backend = "host"});
};

TEST(LoaderShape, ShardsAndSkipsTheLastShortBatch) {
  const model::DataOptions o = loader_shape(4, 16, 1, 3);
  EXPECT_EQ(o.batch_size, 4);
  EXPECT_EQ(o.seq_len, 16);
  EXPECT_EQ(o.rank, 1);
  EXPECT_EQ(o.world, 3);
  EXPECT_FALSE(o.drop_last);  // padded to a multiple of the world, as DistributedSampler by default
  EXPECT_TRUE(o.drop_last_batch);
}

TEST(LoaderOptions, TheEnginesBatchAndRanksTheConfigsSeedTheModelsVocabulary) {
  TinyRun r;
  const model::DataOptions o =
      loader_options(*r.t.engine, r.cfg, r.src.config, 16, {.source = "--text a.txt"});
  EXPECT_EQ(o.batch_size, r.t.engine->micro_batch());
  EXPECT_EQ(o.seq_len, 16);
  EXPECT_EQ(o.rank, 0);
  EXPECT_EQ(o.world, 1);
  EXPECT_EQ(o.seed, std::uint64_t(r.cfg.strata.seed));
  EXPECT_TRUE(o.shuffle);
  EXPECT_EQ(o.vocab_size, r.src.config.vocab_size);
  EXPECT_EQ(o.source, "--text a.txt");
  EXPECT_EQ(o.drop_last_batch, loader_shape(1, 1, 0, 1).drop_last_batch);
  EXPECT_FALSE(
      loader_options(*r.t.engine, r.cfg, r.src.config, 16, {.shuffle = false, .source = ""}).shuffle);
}

TEST(OutputSizes, TheEnginesCheckpointAndTheBf16WeightsOnRankZero) {
  TinyRun r;
  const OutputSizes s = output_sizes(*r.t.engine, {});
  EXPECT_EQ(s.checkpoint, r.t.engine->checkpoint_bytes());
  EXPECT_GE(s.exported, std::uint64_t(r.src.config.num_parameters()) * 2);
  // Rank 0 alone writes the export.
  EXPECT_EQ(output_sizes(*r.t.engine, {.rank = 1, .world_size = 2}).exported, 0u);
}

}  // namespace
}  // namespace strata::session
