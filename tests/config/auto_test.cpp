// "auto" values and command-line overrides (Hugging Face's DeepSpeed integration rules).
#include <functional>

#include "config_test_util.h"

namespace strata {
namespace {

using testing::fixture_path;

nlohmann::json adamw_auto() {
  return {{"train_batch_size", 8},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", "auto"}, {"weight_decay", "auto"}}}}},
          {"gradient_clipping", "auto"}};
}

// Note [Loud auto]: what Hugging Face's integration fills in from TrainingArguments' defaults.
TEST(AutoValues, WithoutOverridesTakeTransformersDefaults) {
  Config c = Config::parse(adamw_auto());
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 5e-5);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.0);
  EXPECT_EQ(c.source("optimizer.params.lr"), "auto→transformers' default");
}

bool reports(const Config& c, const std::string& start) {
  for (const std::string& line : c.auto_report())
    if (line.rfind(start, 0) == 0) return true;
  return false;
}

// Hugging Face's canonical ZeRO-3 template with nothing on the command line: bf16, clipping, the
// learning rate, no warmup, and every "auto" key named with its value and reason.
TEST(AutoValues, TheHfTemplateTrainsInBf16WithClippingAndSaysSo) {
  Config c = Config::load(fixture_path("hf_zero3_auto.json"), {{"hidden_size", 64}});
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 5e-5);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_max_lr, 5e-5);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 0);
  const nlohmann::json file = testing::read_json(fixture_path("hf_zero3_auto.json"));
  std::vector<std::string> autos;
  std::function<void(const nlohmann::json&, const std::string&)> walk = [&](const nlohmann::json& j,
                                                                            const std::string& at) {
    for (const auto& [k, v] : j.items()) {
      const std::string path = at.empty() ? k : at + "." + k;
      if (v.is_object()) walk(v, path);
      if (v == "auto") autos.push_back(path);
    }
  };
  walk(file, "");
  ASSERT_GE(autos.size(), 15u);
  for (const std::string& key : autos) EXPECT_TRUE(reports(c, key + " = ")) << key;
  EXPECT_TRUE(reports(c, "bf16.enabled = true: every Strata backend computes bf16"));
  EXPECT_TRUE(reports(c, "gradient_clipping = 1: transformers' default max_grad_norm"));
  EXPECT_TRUE(reports(c, "zero_optimization.reduce_bucket_size = 4096: hidden_size² with hidden_size 64"));
  EXPECT_TRUE(reports(c, "train_micro_batch_size_per_gpu = 1: nothing sets the batch"));
}

TEST(AutoValues, KeysTheFileSetsAreNotReported) {
  nlohmann::json doc = adamw_auto();
  doc["optimizer"]["params"]["lr"] = 1e-4;
  Config c = Config::parse(doc);
  EXPECT_FALSE(reports(c, "optimizer.params.lr"));
  EXPECT_TRUE(reports(c, "optimizer.params.weight_decay = 0: the default"));
}

TEST(AutoValues, PrecisionAutoStaysOffBesideAnExplicitFp16) {
  Config c = Config::parse(
      {{"train_batch_size", 8}, {"fp16", {{"enabled", true}}}, {"bf16", {{"enabled", "auto"}}}});
  EXPECT_FALSE(c.bf16.enabled);
  EXPECT_TRUE(reports(c, "bf16.enabled = false: fp16.enabled is on"));
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

// offload_param.device and offload_optimizer.device "auto": the engine chooses (Note [Placement auto] in
// zero3/engine_auto.cpp); the config shows "auto" and says so, and gives "auto" back in its JSON.
TEST(AutoValues, OffloadDevicesAutoAreLeftToTheEngine) {
  const nlohmann::json doc = {{"train_batch_size", 8},
                              {"zero_optimization",
                               {{"stage", 3},
                                {"offload_param", {{"device", "auto"}}},
                                {"offload_optimizer", {{"device", "auto"}, {"ratio", "auto"}}}}}};
  Config c = Config::parse(doc);
  EXPECT_TRUE(c.zero_optimization.offload_param.device_auto);
  EXPECT_TRUE(c.zero_optimization.offload_optimizer.device_auto);
  EXPECT_EQ(c.source("zero_optimization.offload_param.device"), "auto→chosen at start-up");
  const nlohmann::json out = c.to_json();
  EXPECT_EQ(out["zero_optimization"]["offload_param"]["device"], "auto");
  EXPECT_EQ(out["zero_optimization"]["offload_optimizer"]["device"], "auto");
  bool said = false;
  for (const std::string& line : c.auto_report())
    said |= line.rfind("zero_optimization.offload_optimizer.device = auto: the engine plans every placement",
                       0) == 0;
  EXPECT_TRUE(said);
  EXPECT_TRUE(Config::parse(out).zero_optimization.offload_param.device_auto);
  // Below stage 3 parameters are not offloaded: "auto" keeps them on the device, and says so.
  const Config two =
      Config::parse({{"train_batch_size", 8},
                     {"zero_optimization", {{"stage", 2}, {"offload_param", {{"device", "auto"}}}}}});
  ASSERT_EQ(two.warnings().size(), 1u);
  EXPECT_NE(two.warnings()[0].find("considers \"none\" only below stage 3"), std::string::npos)
      << two.warnings()[0];
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

TEST(AutoValues, TotalStepsAutoNeedsTheRunOrTheOverride) {
  std::string msg;
  try {
    Config::load(fixture_path("hf_zero2_auto_decay.json"));
  } catch (const ConfigError& e) {
    msg = e.what();
  }
  EXPECT_TRUE(testing::contains(msg, "scheduler.params.total_num_steps \"auto\": required by scheduler.type"))
      << msg;
  EXPECT_TRUE(testing::contains(msg, "--steps, --max-steps or --epochs")) << msg;
  Config c =
      Config::load(fixture_path("hf_zero2_auto_decay.json"), {{"total_steps", 5000}, {"warmup_steps", 50}});
  EXPECT_EQ(c.scheduler.total_num_steps, 5000);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 50);
}

// Note [Loud auto]: the schedule's length is the run's.
TEST(RunLength, AutoTotalTakesTheRunsSteps) {
  Config c = Config::load(fixture_path("hf_zero2_auto_decay.json"), {}, 1,
                          {.total_steps = 30, .from = "--steps 30"});
  EXPECT_EQ(c.scheduler.total_num_steps, 30);
  EXPECT_EQ(c.source("scheduler.params.total_num_steps"), "auto→run (--steps 30)");
  EXPECT_TRUE(reports(c, "scheduler.params.total_num_steps = 30: the run's length, --steps 30"));
  EXPECT_EQ(c.scheduler.warmup_num_steps, 0);
}

nlohmann::json cosine(nlohmann::json params) {
  return {{"train_batch_size", 8},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
          {"scheduler", {{"type", "WarmupCosineLR"}, {"params", std::move(params)}}}};
}

TEST(RunLength, ATotalTheFileLeavesOutTakesTheRunsSteps) {
  Config c = Config::parse(cosine({{"warmup_num_steps", 5}}), {}, 1, "config",
                           {.total_steps = 40, .from = "--max-steps 40"});
  EXPECT_EQ(c.scheduler.total_num_steps, 40);
  EXPECT_TRUE(reports(
      c, "scheduler.params.total_num_steps = 40: the run's length, --max-steps 40 (the file leaves it out)"));
}

TEST(RunLength, ADifferentTotalInTheFileIsKeptWithAWarning) {
  Config c = Config::parse(cosine({{"warmup_num_steps", 5}, {"total_num_steps", 10000}}), {}, 1, "config",
                           {.total_steps = 30, .from = "--steps 30"});
  EXPECT_EQ(c.scheduler.total_num_steps, 10000);
  EXPECT_TRUE(
      testing::any_contains(c.warnings(),
                            "scheduler.params.total_num_steps: the file sets 10000 but the run trains to "
                            "step 30 (--steps 30)"));
}

// A run shorter than a cosine's warmup still trains, whether --steps or the total_steps override (Python's
// length of the run) gave the "auto" total; a total the file sets is the user's and stays refused.
TEST(RunLength, AShortRunStretchesTheCosinePastItsEnd) {
  nlohmann::json doc = cosine({{"warmup_num_steps", "auto"}, {"total_num_steps", "auto"}});
  const Config by_run = Config::parse(doc, {}, 1, "config", {.total_steps = 2, .from = "--steps 2"});
  const Config by_override = Config::parse(doc, {{"total_steps", 2}});
  EXPECT_EQ(by_run.scheduler.total_num_steps, 3);
  EXPECT_EQ(by_override.scheduler.total_num_steps, 3);
  EXPECT_TRUE(reports(by_override,
                      "scheduler.params.total_num_steps = 3: given as override total_steps; raised to 3"));
  doc["scheduler"]["params"]["total_num_steps"] = 2;
  EXPECT_TRUE(testing::contains(testing::parse_error(doc),
                                "total_num_steps: 2 must be greater than warmup_num_steps"));
}

TEST(RunLength, EpochsCountOptimizerStepsAsTransformersDoes) {
  // 7 micro-batches an epoch with accumulation 2: 3 steps an epoch (the rest is dropped), 2.5 epochs: 8.
  RunFacts run{.epochs = 2.5,
               .micro_batches_per_epoch = [](std::int64_t mb) { return 14 / mb; },
               .from = "--epochs 2.5"};
  EXPECT_EQ(run_total_steps(run, 2, 2), 8);
  EXPECT_EQ(run_total_steps(run, 14, 2), 3);  // at least one step an epoch
  // train_batch_size 8 at micro batch 2: accumulation 4, so 7 / 4 = 1 step an epoch, ceil(2.5) in all.
  Config c = Config::parse(cosine({{"warmup_num_steps", 1}}), {{"micro_batch", 2}}, 1, "config", run);
  EXPECT_EQ(c.scheduler.total_num_steps, 3);
}

TEST(RunLength, WarmupRatioTakesItsShareOfTheSchedule) {
  nlohmann::json doc = cosine({{"warmup_num_steps", "auto"}, {"total_num_steps", "auto"}});
  doc["strata"] = {{"warmup_ratio", 0.05}};
  Config c = Config::parse(doc, {}, 1, "config", {.total_steps = 30, .from = "--steps 30"});
  EXPECT_EQ(c.scheduler.warmup_num_steps, 2);  // ceil(1.5)
  EXPECT_TRUE(reports(c, "scheduler.params.warmup_num_steps = 2: ceil(strata.warmup_ratio 0.05 × 30 steps)"));
  doc["scheduler"]["params"]["warmup_num_steps"] = 10;
  EXPECT_TRUE(testing::contains(testing::parse_error(doc),
                                "strata.warmup_ratio: 0.05 and scheduler.params.warmup_num_steps 10"));
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
