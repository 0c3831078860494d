// Alternative and deprecated DeepSpeed spellings map to the key they stand for; deprecated ones warn once.
#include "config_test_util.h"

namespace strata {
namespace {

using testing::any_contains;

Config parse_with(nlohmann::json zero) {
  return Config::parse({{"train_batch_size", 8}, {"zero_optimization", std::move(zero)}});
}

TEST(Aliases, CpuOffloadParamTrueOffloadsParameters) {
  Config c = parse_with({{"stage", 3}, {"cpu_offload_param", true}});
  EXPECT_EQ(c.zero_optimization.offload_param.device, OffloadDevice::cpu);
  EXPECT_EQ(c.source("zero_optimization.offload_param.device"), "alias zero_optimization.cpu_offload_param");
  EXPECT_TRUE(any_contains(c.warnings(), "zero_optimization.cpu_offload_param: deprecated"));
}

TEST(Aliases, CpuOffloadFalseLeavesTheOptimizerOnTheDevice) {
  Config c = parse_with({{"stage", 2}, {"cpu_offload", false}});
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, OffloadDevice::none);
  EXPECT_EQ(c.warnings().size(), 1u);  // still deprecated
}

TEST(Aliases, CpuOffloadUsePinMemoryPinsBothOffloads) {
  Config c = parse_with({{"stage", 3},
                         {"cpu_offload", true},
                         {"cpu_offload_param", true},
                         {"cpu_offload_use_pin_memory", true}});
  EXPECT_TRUE(c.zero_optimization.offload_param.pin_memory);
  EXPECT_TRUE(c.zero_optimization.offload_optimizer.pin_memory);
  EXPECT_EQ(c.warnings().size(), 3u);
}

TEST(Aliases, ThreadCountBecomesIntraOpParallelism) {
  Config c = Config::parse({{"train_batch_size", 8}, {"aio", {{"thread_count", 4}}}});
  EXPECT_EQ(c.aio.intra_op_parallelism, 4);
  EXPECT_TRUE(any_contains(c.warnings(), "aio.thread_count: deprecated; use aio.intra_op_parallelism"));
}

TEST(Aliases, Fp16GatherSpellingIsDeprecated) {
  Config c = parse_with({{"stage", 3}, {"stage3_gather_fp16_weights_on_model_save", true}});
  EXPECT_TRUE(c.zero_optimization.stage3_gather_16bit_weights_on_model_save);
  EXPECT_EQ(c.warnings().size(), 1u);
}

TEST(Aliases, DeepSpeedFieldNamesWorkWithoutWarning) {
  Config c = parse_with({{"stage", 3}, {"prefetch_bucket_size", "auto"}, {"max_live_parameters", 3e8}});
  EXPECT_EQ(c.zero_optimization.stage3_max_live_parameters, 300000000u);
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 50000000u);  // "auto" with no hidden_size
  EXPECT_TRUE(c.warnings().empty());
}

TEST(Aliases, BfloatSixteenSectionIsTheOldNameOfBf16) {
  Config c = Config::parse({{"train_batch_size", 8}, {"bfloat16", {{"enabled", true}}}});
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_EQ(c.source("bf16.enabled"), "alias bfloat16");
}

TEST(Aliases, BooleanZeroOptimizationIsStageOne) {
  Config c = Config::parse({{"train_batch_size", 8}, {"zero_optimization", true}});
  EXPECT_EQ(c.zero_optimization.stage, 1);
  EXPECT_TRUE(any_contains(c.warnings(), "zero_optimization: true is deprecated"));
}

}  // namespace
}  // namespace strata
