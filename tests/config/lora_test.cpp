// The strata.lora block: PEFT's key names and defaults, the adapters on only where the block is given,
// target_modules as PEFT reads it, and every value Strata does not compute refused by name.
#include "config_test_util.h"

namespace strata {
namespace {

using testing::contains;

// {"train_batch_size": 8, "strata": {"lora": <block>}}
nlohmann::json with_lora(const nlohmann::json& block) {
  return {{"train_batch_size", 8}, {"strata", {{"lora", block}}}};
}

Config parse_lora(const char* block) {
  return Config::parse(with_lora(nlohmann::json::parse(block)));
}

TEST(LoraBlock, AbsentLeavesAdaptersOffAndOutOfTheResolvedConfig) {
  Config c = Config::parse({{"train_batch_size", 8}});
  EXPECT_FALSE(c.strata.lora.enabled);
  EXPECT_FALSE(c.to_json()["strata"].contains("lora"));
  EXPECT_FALSE(contains(c.resolved_table(), "strata.lora"));
}

TEST(LoraBlock, NullLeavesAdaptersOff) {
  Config c = Config::parse(with_lora(nullptr));
  EXPECT_FALSE(c.strata.lora.enabled);
  EXPECT_TRUE(c.warnings().empty());
}

TEST(LoraBlock, DefaultsArePeftsDefaults) {
  Config c = parse_lora(R"({"target_modules": ["q_proj", "v_proj"]})");
  const StrataConfig::Lora& l = c.strata.lora;
  EXPECT_TRUE(l.enabled);
  EXPECT_EQ(l.r, 8);
  EXPECT_EQ(l.lora_alpha, 8);
  EXPECT_EQ(l.lora_dropout, 0);
  EXPECT_FALSE(l.use_rslora);
  EXPECT_TRUE(l.modules_to_save.empty());
  EXPECT_TRUE(l.init_lora_weights);
  EXPECT_EQ(l.base_dtype, "bf16");
  EXPECT_TRUE(l.double_quant);
  EXPECT_TRUE(l.adapter_dir.empty());
  EXPECT_EQ(c.source("strata.lora.r"), "default");
  EXPECT_TRUE(c.warnings().empty());
}

TEST(LoraBlock, ReadsEveryKey) {
  Config c = parse_lora(R"({"r": 16, "lora_alpha": 32, "lora_dropout": 0.05,
      "target_modules": ["q_proj", "model.layers.1.self_attn.k_proj"], "modules_to_save": ["lm_head"],
      "use_rslora": true, "init_lora_weights": false, "base_dtype": "nf4", "double_quant": false})");
  const StrataConfig::Lora& l = c.strata.lora;
  EXPECT_EQ(l.r, 16);
  EXPECT_EQ(l.lora_alpha, 32);
  EXPECT_EQ(l.lora_dropout, 0.05);
  EXPECT_EQ(l.target_modules, (std::vector<std::string>{"q_proj", "model.layers.1.self_attn.k_proj"}));
  EXPECT_FALSE(l.target_modules_regex);
  EXPECT_EQ(l.modules_to_save, std::vector<std::string>{"lm_head"});
  EXPECT_TRUE(l.use_rslora);
  EXPECT_FALSE(l.init_lora_weights);
  EXPECT_EQ(l.base_dtype, "nf4");
  EXPECT_FALSE(l.double_quant);
  EXPECT_EQ(c.source("strata.lora.r"), "file");
}

TEST(LoraBlock, AllLinearIsPeftsShorthandInAnyCase) {
  Config c = parse_lora(R"({"target_modules": "ALL-Linear"})");
  EXPECT_EQ(c.strata.lora.target_modules, std::vector<std::string>{"all-linear"});
  EXPECT_FALSE(c.strata.lora.target_modules_regex);
}

TEST(LoraBlock, AnotherStringIsAFullMatchRegex) {
  Config c = parse_lora(R"j({"target_modules": ".*\\.(q_proj|v_proj)"})j");
  EXPECT_EQ(c.strata.lora.target_modules, std::vector<std::string>{R"(.*\.(q_proj|v_proj))"});
  EXPECT_TRUE(c.strata.lora.target_modules_regex);
}

TEST(LoraBlock, PeftOptionsAtTheirDefaultsAreAccepted) {
  Config c = parse_lora(R"({"target_modules": ["q_proj"], "task_type": "CAUSAL_LM", "bias": "none",
      "use_dora": false, "fan_in_fan_out": false, "lora_bias": false, "layers_to_transform": null,
      "layers_pattern": null, "rank_pattern": {}, "alpha_pattern": {}, "init_lora_weights": true})");
  EXPECT_TRUE(c.strata.lora.enabled);
  EXPECT_TRUE(c.warnings().empty());
}

TEST(LoraBlock, RoundTripsThroughToJson) {
  for (const char* block :
       {R"({"target_modules": ["q_proj", "v_proj"], "modules_to_save": ["lm_head"],
                                "r": 4, "lora_alpha": 12.5, "base_dtype": "nf4"})",
        R"({"target_modules": "all-linear"})", R"({"target_modules": "model\\.layers\\.[0-3]\\..*_proj"})"}) {
    Config c = parse_lora(block);
    const nlohmann::json resolved = c.to_json();
    Config again = Config::parse(resolved);
    EXPECT_EQ(again.to_json(), resolved) << block;
    EXPECT_TRUE(again.strata.lora.enabled) << block;
    EXPECT_EQ(again.strata.lora.target_modules, c.strata.lora.target_modules) << block;
    EXPECT_EQ(again.strata.lora.target_modules_regex, c.strata.lora.target_modules_regex) << block;
    EXPECT_EQ(again.strata.lora.modules_to_save, c.strata.lora.modules_to_save) << block;
  }
}

struct BadBlock {
  const char* name;
  const char* block;  // the value of strata.lora
  std::vector<std::string> expect;
};

void PrintTo(const BadBlock& b, std::ostream* os) {
  *os << b.name;
}

class BadLoraBlocks : public ::testing::TestWithParam<BadBlock> {};

TEST_P(BadLoraBlocks, MessageNamesKeyValueAndWhy) {
  std::string msg = testing::parse_error(with_lora(nlohmann::json::parse(GetParam().block)));
  EXPECT_EQ(msg.rfind("config: ", 0), 0u) << msg;
  for (const auto& e : GetParam().expect)
    EXPECT_TRUE(contains(msg, e)) << "missing «" << e << "» in\n" << msg;
}

const BadBlock kBadBlocks[] = {
    {"TargetModulesMissing",
     R"({"r": 16})",
     {R"(strata.lora.target_modules: required in a strata.lora block; give PEFT's module names, e.g. ["q_proj", "v_proj"], or "all-linear")"}},
    {"EmptyBlockNeedsTargets", R"({})", {"strata.lora.target_modules: required in a strata.lora block"}},
    {"TargetModulesEmptyList",
     R"({"target_modules": []})",
     {"strata.lora.target_modules: [] is empty; allowed: "}},
    {"TargetModulesNotStrings",
     R"({"target_modules": ["q_proj", 3]})",
     {R"(strata.lora.target_modules: ["q_proj", 3] has an entry 3 that is not a non-empty string)"}},
    {"TargetModulesTwice",
     R"({"target_modules": ["q_proj", "q_proj"]})",
     {R"(strata.lora.target_modules: ["q_proj", "q_proj"] lists "q_proj" twice)"}},
    {"AllLinearInsideAList",
     R"({"target_modules": ["all-linear"]})",
     {R"(strata.lora.target_modules: ["all-linear"] lists "all-linear", which PEFT reads as a module name)",
      R"(write "target_modules": "all-linear" (a string))"}},
    {"TargetModulesBadRegex",
     R"({"target_modules": "(q_proj"})",
     {R"(strata.lora.target_modules: "(q_proj" is not a regular expression Strata can match)"}},
    {"RankZero",
     R"({"target_modules": "all-linear", "r": 0})",
     {"strata.lora.r: 0 is out of range; allowed: an integer >= 1"}},
    {"RankNotWhole",
     R"({"target_modules": "all-linear", "r": 2.5})",
     {"strata.lora.r: 2.5 is not a whole number; allowed: an integer >= 1"}},
    {"AlphaZero",
     R"({"target_modules": "all-linear", "lora_alpha": 0})",
     {"strata.lora.lora_alpha: 0 is out of range; allowed: a number > 0"}},
    {"DropoutOne",
     R"({"target_modules": "all-linear", "lora_dropout": 1})",
     {"strata.lora.lora_dropout: 1 is out of range; allowed: a number in [0, 1)"}},
    {"BaseDtypeUnknown",
     R"({"target_modules": "all-linear", "base_dtype": "fp8"})",
     {R"(strata.lora.base_dtype: "fp8" is not one of bf16, nf4)"}},
    {"ModulesToSaveAString",
     R"({"target_modules": "all-linear", "modules_to_save": "lm_head"})",
     {R"(strata.lora.modules_to_save: "lm_head" is not a list of strings)"}},
    {"AutoIsNotAccepted",
     R"({"target_modules": "all-linear", "r": "auto"})",
     {R"(strata.lora.r: "auto" is not an integer)"}},
    {"UnknownKeySuggestsNearest",
     R"({"target_modules": "all-linear", "lora_alhpa": 16})",
     {"strata.lora.lora_alhpa: unknown key; did you mean lora_alpha?"}},
    {"PeftMetadataIsNotABlockKey",
     R"({"target_modules": "all-linear", "peft_type": "LORA"})",
     {"strata.lora.peft_type: unknown key"}},
    {"BlockNotAnObject", R"(true)", {"strata.lora: true is not an object; expected a section with keys r, "}},
    {"UseDora",
     R"({"target_modules": "all-linear", "use_dora": true})",
     {"strata.lora.use_dora: true is not supported: DoRA is not computed; allowed: false"}},
    {"FanInFanOut",
     R"({"target_modules": "all-linear", "fan_in_fan_out": true})",
     {"strata.lora.fan_in_fan_out: true is not supported: weights stored (in, out)"}},
    {"BiasAll",
     R"({"target_modules": "all-linear", "bias": "all"})",
     {R"(strata.lora.bias: "all" is not supported: training the base's biases)", R"(allowed: "none")"}},
    {"LayersToTransform",
     R"({"target_modules": "all-linear", "layers_to_transform": [0, 1]})",
     {"strata.lora.layers_to_transform: [0, 1] is not supported: choosing layers by index is not computed"}},
    {"LayersPattern",
     R"({"target_modules": "all-linear", "layers_pattern": "layers"})",
     {R"(strata.lora.layers_pattern: "layers" is not supported: choosing layers by index)"}},
    {"RankPattern",
     R"({"target_modules": "all-linear", "rank_pattern": {"q_proj": 4}})",
     {"strata.lora.rank_pattern: {\"q_proj\":4} is not supported: per-module ranks are not computed"}},
    {"AlphaPattern",
     R"({"target_modules": "all-linear", "alpha_pattern": {"q_proj": 4}})",
     {"strata.lora.alpha_pattern: {\"q_proj\":4} is not supported: per-module alphas are not computed"}},
    {"LoraBias",
     R"({"target_modules": "all-linear", "lora_bias": true})",
     {"strata.lora.lora_bias: true is not supported: a bias on lora_B is not computed; allowed: false"}},
    {"InitGaussian",
     R"({"target_modules": "all-linear", "init_lora_weights": "gaussian"})",
     {R"(strata.lora.init_lora_weights: "gaussian" is not supported: PEFT's other initialisations)",
      "allowed: true or false"}},
    {"TaskTypeNotCausalLm",
     R"({"target_modules": "all-linear", "task_type": "SEQ_CLS"})",
     {R"(strata.lora.task_type: "SEQ_CLS" is not supported: Strata trains causal language models)"}},
    {"EveryProblemReportedTogether",
     R"({"target_modules": "all-linear", "use_dora": true, "r": 0})",
     {"2 problems:", "strata.lora.use_dora: true", "strata.lora.r: 0"}},
};

INSTANTIATE_TEST_SUITE_P(Config, BadLoraBlocks, ::testing::ValuesIn(kBadBlocks),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace strata
