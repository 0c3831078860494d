// Each class of bad input gives a ConfigError that names the key path, the value and what is allowed.
#include "config_test_util.h"

namespace strata {
namespace {

struct BadInput {
  const char* name;
  const char* json;  // merged over {"train_batch_size": 8}
  std::vector<std::string> expect;
};

void PrintTo(const BadInput& b, std::ostream* os) {
  *os << b.name;
}

class BadInputs : public ::testing::TestWithParam<BadInput> {};

TEST_P(BadInputs, MessageNamesKeyValueAndAllowedSet) {
  nlohmann::json doc = {{"train_batch_size", 8}};
  doc.merge_patch(nlohmann::json::parse(GetParam().json));
  std::string msg = testing::parse_error(doc);
  EXPECT_EQ(msg.rfind("config: ", 0), 0u) << msg;  // the origin leads every message
  for (const auto& e : GetParam().expect)
    EXPECT_TRUE(testing::contains(msg, e)) << "missing «" << e << "» in\n" << msg;
}

const BadInput kBadInputs[] = {
    {"CosineScheduleWithNoStepsAfterWarmup",
     R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 100, "warmup_num_steps": 100}}})",
     {"scheduler.params.total_num_steps: 100 must be greater than warmup_num_steps (100) for "
      "WarmupCosineLR"}},
    {"CosineScheduleWithinTheTwoStepMinimumWarmup",
     R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 2, "warmup_num_steps": 1}}})",
     {"scheduler.params.total_num_steps: 2 must be greater than warmup_num_steps (1, which counts as 2"}},
    {"AioLimitsAllReportedAtOnce",
     R"({"aio": {"queue_depth": 4097, "intra_op_parallelism": 65}})",
     {"aio.queue_depth: 4097", "aio.intra_op_parallelism: 65"}},
    {"ChoiceNotAllowed",
     R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "gpu"}}})",
     {R"(zero_optimization.offload_optimizer.device: "gpu" is not one of none, cpu, nvme)"}},
    {"LossWeightingNotAllowed",
     R"({"strata": {"loss_weighting": "sequences"}})",
     {R"(strata.loss_weighting: "sequences" is not one of tokens, micro_batches)"}},
    {"DeepSpeedChoiceNotImplemented",
     R"({"optimizer": {"type": "OneBitAdam"}})",
     {R"(optimizer.type: "OneBitAdam" is a DeepSpeed choice Strata does not implement; one of Adam, AdamW, Adagrad, Lion)"}},
    {"ChoiceIsCaseSensitive",
     R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "CPU"}}})",
     {R"(zero_optimization.offload_param.device: "CPU" is not one of none, cpu, nvme (names are case-sensitive: "cpu"))"}},
    {"NotABoolean",
     R"({"fp16": {"enabled": "yes"}})",
     {R"(fp16.enabled: "yes" is not a boolean (true or false))"}},
    {"IntegerOutOfRange",
     R"({"zero_optimization": {"stage": 4}})",
     {"zero_optimization.stage: 4 is out of range; allowed: an integer from 0 to 3"}},
    {"IntegerNotWhole",
     R"({"steps_per_print": 2.5})",
     {"steps_per_print: 2.5 is not a whole number; allowed: an integer >= 1"}},
    {"IntegerGivenAsString",
     R"({"fp16": {"hysteresis": "2"}})",
     {R"(fp16.hysteresis: "2" is not an integer; allowed: an integer >= 1)"}},
    {"RealOutOfRange",
     R"({"optimizer": {"type": "Adam", "params": {"lr": -0.1}}})",
     {"optimizer.params.lr: -0.1 is out of range; allowed: a number >= 0"}},
    {"RealExclusiveBound",
     R"({"fp16": {"min_loss_scale": 0}})",
     {"fp16.min_loss_scale: 0 is out of range; allowed: a number > 0"}},
    {"PairOutOfRange",
     R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9, 1.0]}}})",
     {"optimizer.params.betas: [0.9, 1] is out of range; allowed: a pair [a, b] of numbers in [0, 1)"}},
    {"PairWrongShape",
     R"({"optimizer": {"type": "AdamW", "params": {"betas": 0.9}}})",
     {"optimizer.params.betas: 0.9 is not a pair"}},
    {"SizeUnknownUnit",
     R"({"aio": {"block_size": "1MX"}})",
     {R"(aio.block_size: "1MX" has an unknown unit "mx")", "\"2GiB\""}},
    {"SizeNotAMultiple",
     R"({"aio": {"block_size": 6000}})",
     {"aio.block_size: 6000 is not a multiple of 4096; allowed: a byte size >= 4096, a multiple of 4096"}},
    {"CountGivenInBytes",
     R"({"zero_optimization": {"reduce_bucket_size": "512MB"}})",
     {R"(zero_optimization.reduce_bucket_size: "512MB" is a count of elements, not bytes)"}},
    {"SizeNegative",
     R"({"strata": {"device_memory_cap": -1}})",
     {"strata.device_memory_cap: -1 is negative; allowed: a byte size >= 0"}},
    {"SizeNotWhole",
     R"({"strata": {"device_memory_cap": "1.0001KB"}})",
     {R"(strata.device_memory_cap: "1.0001KB" is not a whole number of bytes)"}},
    {"UnknownKeySuggestsNearest",
     R"({"zero_optimization": {"stage3_prefetch_bucket": 1000}})",
     {"zero_optimization.stage3_prefetch_bucket: unknown key; did you mean stage3_prefetch_bucket_size?"}},
    {"UnknownSectionSuggestsNearest",
     R"({"zero_optimisation": {"stage": 3}})",
     {"zero_optimisation: unknown key; did you mean zero_optimization?"}},
    {"UnknownKeyListsTheSection",
     R"({"fp16": {"qqqq": 1}})",
     {"fp16.qqqq: unknown key; known keys in fp16: enabled, auto_cast, loss_scale"}},
    {"SectionNotAnObject",
     R"({"fp16": true})",
     {"fp16: true is not an object; expected a section with keys enabled, auto_cast"}},
    {"AutoWhereNotAccepted",
     R"({"fp16": {"loss_scale": "auto"}})",
     {R"(fp16.loss_scale: "auto" is not a number; allowed: a number >= 0)"}},
    {"BothHalfPrecisions",
     R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})",
     {"fp16.enabled and bf16.enabled are both true"}},
    {"ParamOffloadNeedsStage3",
     R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})",
     {R"(zero_optimization.offload_param.device: "cpu" needs zero_optimization.stage 3 (stage is 2))"}},
    {"OptimizerNvmeNeedsStage3",
     R"({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "nvme"}}})",
     {R"(zero_optimization.offload_optimizer.device: "nvme" needs zero_optimization.stage 3 (stage is 1))"}},
    {"PartialOffloadNeedsStage3",
     R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}})",
     {"zero_optimization.offload_optimizer.ratio: 0.5 (partial offload) needs zero_optimization.stage 3"}},
    {"ParameterOfAnotherOptimizer",
     R"({"optimizer": {"type": "Adagrad", "params": {"betas": [0.9, 0.99]}}})",
     {R"(optimizer.params.betas: does not apply with optimizer.type "Adagrad"; it is a parameter of Adam, AdamW, Lion)"}},
    {"SchedulerNeedsTotalSteps",
     R"({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}})",
     {R"(scheduler.params.total_num_steps: required by scheduler.type "WarmupDecayLR")"}},
    {"SectionWithoutType",
     R"({"scheduler": {"params": {"warmup_num_steps": 10}}})",
     {R"(scheduler.type: required when a "scheduler" section is given; one of none, WarmupLR)"}},
    {"AliasAndTargetBothGiven",
     R"({"zero_optimization": {"stage": 2, "cpu_offload": true, "offload_optimizer": {"device": "cpu"}}})",
     {"zero_optimization.cpu_offload and zero_optimization.offload_optimizer.device are both given; keep "
      "only "
      "zero_optimization.offload_optimizer.device"}},
    {"FlagAliasNotABoolean",
     R"({"zero_optimization": {"stage": 2, "cpu_offload": 1}})",
     {"zero_optimization.cpu_offload: 1 is not a boolean (true or false)"}},
    {"AliasValueShownUnderTheAlias",
     R"({"aio": {"thread_count": "four"}})",
     {R"(aio.thread_count: "four" is not an integer)"}},
    {"EveryProblemReportedTogether",
     R"({"zero_optimization": {"stage": 7}, "fp16": {"enabled": 1}})",
     {"2 problems:", "zero_optimization.stage: 7 is out of range", "fp16.enabled: 1 is not a boolean"}},
};

INSTANTIATE_TEST_SUITE_P(Config, BadInputs, ::testing::ValuesIn(kBadInputs),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(BadDocument, TopLevelThatIsNotAnObjectIsRejected) {
  std::string msg = testing::parse_error(nlohmann::json::array({1, 2}));
  EXPECT_TRUE(testing::contains(msg, "config: the top level is [1, 2], not a JSON object")) << msg;
}

}  // namespace
}  // namespace strata
