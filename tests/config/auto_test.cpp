// "auto" values and command-line overrides (Hugging Face's DeepSpeed integration rules).
#include "config_test_util.h"

namespace strata {
namespace {

using testing::fixture_path;

nlohmann::json adamw_auto() {
  return {{"train_batch_size", 8},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", "auto"}, {"weight_decay", "auto"}}}}},
          {"gradient_clipping", "auto"}};
}

TEST(AutoValues, WithoutOverridesTakeTheDefaults) {
  Config c = Config::parse(adamw_auto());
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 0.0);
  EXPECT_EQ(c.source("optimizer.params.lr"), "auto→default");
}

// offload_optimizer.ratio "auto" is the engine's choice (it measures): flagged, 1 until then, and written
// back as "auto" so that the resolved config reads the same.
TEST(AutoValues, OffloadRatioAutoIsLeftToTheEngine) {
  const nlohmann::json doc = {
      {"train_batch_size", 8},
      {"zero_optimization", {{"stage", 3}, {"offload_optimizer", {{"device", "cpu"}, {"ratio", "auto"}}}}}};
  Config c = Config::parse(doc);
  EXPECT_TRUE(c.zero_optimization.offload_optimizer.ratio_auto);
  EXPECT_DOUBLE_EQ(c.zero_optimization.offload_optimizer.ratio, 1.0);
  EXPECT_EQ(c.source("zero_optimization.offload_optimizer.ratio"), "auto→measured at start-up");
  const nlohmann::json out = c.to_json();
  EXPECT_EQ(out["zero_optimization"]["offload_optimizer"]["ratio"], "auto");
  const std::string table = c.resolved_table();
  const std::size_t row = table.find("zero_optimization.offload_optimizer.ratio ");
  ASSERT_NE(row, std::string::npos) << table;
  const std::string line = table.substr(row, table.find('\n', row) - row);
  EXPECT_NE(line.find(" auto "), std::string::npos) << line;
  EXPECT_TRUE(Config::parse(out).zero_optimization.offload_optimizer.ratio_auto);
  EXPECT_FALSE(
      Config::parse(nlohmann::json{{"train_batch_size", 8}}).zero_optimization.offload_optimizer.ratio_auto);
}

TEST(AutoValues, AllBatchSizesAutoWithNothingElseIsMicroBatchOne) {
  Config c = Config::load(fixture_path("hf_zero3_auto.json"), {}, 4);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 1);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.train_batch_size, 4);
}

TEST(AutoValues, HiddenSizeRulesFallBackToDefaultsWhenUnknown) {
  Config c = Config::load(fixture_path("hf_zero3_auto.json"));
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500000000u);
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 50000000u);
  EXPECT_EQ(c.zero_optimization.stage3_param_persistence_threshold, 100000u);
  EXPECT_EQ(c.source("zero_optimization.reduce_bucket_size"), "auto→default (no hidden_size)");
}

TEST(AutoValues, WarmupPeakFollowsTheOptimizerLearningRate) {
  nlohmann::json doc = adamw_auto();
  doc["optimizer"]["params"]["lr"] = 2e-4;
  doc["scheduler"] = {{"type", "WarmupLR"}, {"params", {{"warmup_max_lr", "auto"}}}};
  Config c = Config::parse(doc);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_max_lr, 2e-4);
  EXPECT_EQ(c.source("scheduler.params.warmup_max_lr"), "auto→optimizer.params.lr");
}

TEST(AutoValues, TotalStepsAutoNeedsTheOverride) {
  std::string msg;
  try {
    Config::load(fixture_path("hf_zero2_auto_decay.json"));
  } catch (const ConfigError& e) {
    msg = e.what();
  }
  EXPECT_TRUE(
      testing::contains(msg, "scheduler.params.total_num_steps: \"auto\" needs the total_steps override"))
      << msg;
  Config c =
      Config::load(fixture_path("hf_zero2_auto_decay.json"), {{"total_steps", 5000}, {"warmup_steps", 50}});
  EXPECT_EQ(c.scheduler.total_num_steps, 5000);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 50);
}

TEST(Overrides, FillKeysTheFileLeavesOut) {
  Config c = Config::parse({{"train_batch_size", 8}}, {{"lr", 5e-4}});
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 5e-4);
  EXPECT_EQ(c.source("optimizer.params.lr"), "override lr");
}

TEST(Overrides, ContradictingAnExplicitValueIsAnError) {
  nlohmann::json doc = adamw_auto();
  doc["optimizer"]["params"]["lr"] = 1e-4;
  std::string msg = testing::parse_error(doc, {{"lr", 3e-4}});
  EXPECT_TRUE(
      testing::contains(msg,
                        "optimizer.params.lr: the file sets 0.0001 but the command line (override lr) "
                        "gives 0.0003"))
      << msg;
}

TEST(Overrides, AgreeingWithAnExplicitValueIsFine) {
  nlohmann::json doc = adamw_auto();
  doc["optimizer"]["params"]["lr"] = 1e-4;
  Config c = Config::parse(doc, {{"lr", 1e-4}});
  EXPECT_EQ(c.source("optimizer.params.lr"), "file");
}

TEST(Overrides, UnknownNameSuggestsTheNearest) {
  std::string msg = testing::parse_error(adamw_auto(), {{"micro_bach", 4}});
  EXPECT_TRUE(testing::contains(msg, "override micro_bach: unknown; did you mean micro_batch?")) << msg;
}

TEST(Overrides, ValueOfTheWrongTypeNamesTheOverride) {
  std::string msg = testing::parse_error(adamw_auto(), {{"lr", "fast"}});
  EXPECT_TRUE(testing::contains(msg, "override lr (for optimizer.params.lr): \"fast\" is not a number"))
      << msg;
}

TEST(Overrides, OneThatSetsNothingInForceWarns) {
  Config c = Config::parse(adamw_auto(), {{"warmup_steps", 10}});
  EXPECT_TRUE(testing::any_contains(c.warnings(), "override warmup_steps: not used"));
}

}  // namespace
}  // namespace strata
