// PEFT's adapter_config.json: a file PEFT 0.21.2 wrote parses to its values, peft_adapter_config writes
// what PEFT writes, the two round-trip, and PEFT options Strata does not compute are refused by name with
// the strata.lora block's words.
#include "config/lora_peft.h"
#include "config_test_util.h"

namespace strata {
namespace {

using testing::contains;

// Written by PEFT 0.21.2 (transformers 5.24.0): get_peft_model(LlamaForCausalLM(tiny config),
// LoraConfig(r=4, lora_alpha=16, lora_dropout=0.1, target_modules=["q_proj", "v_proj", "down_proj"],
// modules_to_save=["lm_head"], bias="none", task_type="CAUSAL_LM", use_rslora=True)).save_pretrained(dir),
// verbatim (the base was built from a config, so base_model_name_or_path is null).
constexpr const char* kPeft0212AdapterConfig = R"({
  "alora_invocation_tokens": null,
  "alpha_pattern": {},
  "arrow_config": null,
  "auto_mapping": null,
  "base_model_name_or_path": null,
  "bias": "none",
  "corda_config": null,
  "ensure_weight_tying": false,
  "eva_config": null,
  "exclude_modules": null,
  "fan_in_fan_out": false,
  "inference_mode": true,
  "init_lora_weights": true,
  "kasa_config": null,
  "layer_replication": null,
  "layers_pattern": null,
  "layers_to_transform": null,
  "loftq_config": {},
  "lora_alpha": 16,
  "lora_bias": false,
  "lora_dropout": 0.1,
  "lora_ga_config": null,
  "megatron_config": null,
  "megatron_core": "megatron.core",
  "modules_to_save": [
    "lm_head"
  ],
  "monteclora_config": null,
  "peft_type": "LORA",
  "peft_version": "0.21.2",
  "qalora_group_size": 16,
  "r": 4,
  "rank_pattern": {},
  "revision": null,
  "target_modules": [
    "v_proj",
    "q_proj",
    "down_proj"
  ],
  "target_parameters": null,
  "task_type": "CAUSAL_LM",
  "trainable_token_indices": null,
  "use_bdlora": null,
  "use_dora": false,
  "use_qalora": false,
  "use_rslora": true,
  "velora_config": null
})";

const std::vector<std::string> kRealTargets = {"v_proj", "q_proj", "down_proj"};

nlohmann::json real_file() {
  return nlohmann::json::parse(kPeft0212AdapterConfig);
}

// The ConfigError message lora_from_peft raises for `doc`, or "" (and a failure) when it accepts it.
std::string peft_error(const nlohmann::json& doc) {
  try {
    lora_from_peft(doc, "adapter/adapter_config.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << doc.dump();
  return "";
}

// The real file with `patch` merged over it (a null in the patch removes the key).
nlohmann::json real_file_with(const char* patch) {
  nlohmann::json doc = real_file();
  doc.merge_patch(nlohmann::json::parse(patch));
  return doc;
}

StrataConfig::Lora some_lora() {
  StrataConfig::Lora l;
  l.enabled = true;
  l.r = 16;
  l.lora_alpha = 32;
  l.lora_dropout = 0.05;
  l.target_modules = {"q_proj", "v_proj"};
  l.modules_to_save = {"lm_head", "embed_tokens"};
  l.use_rslora = true;
  return l;
}

TEST(PeftAdapterConfig, FileWrittenByPeft0212ParsesToItsValues) {
  StrataConfig::Lora l = lora_from_peft(real_file(), "adapter_config.json");
  EXPECT_TRUE(l.enabled);
  EXPECT_EQ(l.r, 4);
  EXPECT_EQ(l.lora_alpha, 16);
  EXPECT_EQ(l.lora_dropout, 0.1);
  EXPECT_EQ(l.target_modules, kRealTargets);
  EXPECT_FALSE(l.target_modules_regex);
  EXPECT_EQ(l.modules_to_save, std::vector<std::string>{"lm_head"});
  EXPECT_TRUE(l.use_rslora);
  EXPECT_TRUE(l.init_lora_weights);
  EXPECT_EQ(l.base_dtype, "bf16");  // not PEFT's: the block's default
}

TEST(PeftAdapterConfig, WritesWhatPeft0212WritesForTheSameSettings) {
  StrataConfig::Lora l;
  l.r = 4;
  l.lora_alpha = 16;
  l.lora_dropout = 0.1;
  l.modules_to_save = {"lm_head"};
  l.use_rslora = true;
  EXPECT_EQ(peft_adapter_config(l, "", kRealTargets), real_file());
}

TEST(PeftAdapterConfig, NamesTheBaseAndLeavesModulesToSaveNullWhenNone) {
  StrataConfig::Lora l = some_lora();
  l.modules_to_save.clear();
  nlohmann::json j = peft_adapter_config(l, "meta-llama/Llama-3.2-1B", {"model.layers.0.self_attn.q_proj"});
  EXPECT_EQ(j["base_model_name_or_path"], "meta-llama/Llama-3.2-1B");
  EXPECT_TRUE(j["modules_to_save"].is_null());
  EXPECT_EQ(j["target_modules"], nlohmann::json::array({"model.layers.0.self_attn.q_proj"}));
  EXPECT_EQ(j["peft_type"], "LORA");
  EXPECT_EQ(j["task_type"], "CAUSAL_LM");
  EXPECT_EQ(j["bias"], "none");
  EXPECT_EQ(j["peft_version"], kPeftFormatVersion);
}

TEST(PeftAdapterConfig, RoundTripsThroughPeftAdapterConfig) {
  StrataConfig::Lora l = some_lora();
  l.lora_alpha = 12.5;  // not whole: written as a float
  l.init_lora_weights = false;
  StrataConfig::Lora back = lora_from_peft(peft_adapter_config(l, "base", l.target_modules), "written");
  EXPECT_TRUE(back.enabled);
  EXPECT_EQ(back.r, l.r);
  EXPECT_EQ(back.lora_alpha, l.lora_alpha);
  EXPECT_EQ(back.lora_dropout, l.lora_dropout);
  EXPECT_EQ(back.target_modules, l.target_modules);
  EXPECT_EQ(back.target_modules_regex, false);
  EXPECT_EQ(back.modules_to_save, l.modules_to_save);
  EXPECT_EQ(back.use_rslora, l.use_rslora);
  EXPECT_EQ(back.init_lora_weights, l.init_lora_weights);
}

TEST(PeftAdapterConfig, TargetModulesStringIsAllLinearOrARegex) {
  StrataConfig::Lora all = lora_from_peft(real_file_with(R"({"target_modules": "all-linear"})"), "f");
  EXPECT_EQ(all.target_modules, std::vector<std::string>{"all-linear"});
  EXPECT_FALSE(all.target_modules_regex);
  StrataConfig::Lora re = lora_from_peft(real_file_with(R"({"target_modules": ".*\\.q_proj"})"), "f");
  EXPECT_EQ(re.target_modules, std::vector<std::string>{R"(.*\.q_proj)"});
  EXPECT_TRUE(re.target_modules_regex);
}

TEST(PeftAdapterConfig, FieldsNewerPeftVersionsAddAreIgnored) {
  StrataConfig::Lora l = lora_from_peft(real_file_with(R"({"some_field_of_peft_0_30": {"x": 1}})"), "f");
  EXPECT_EQ(l.r, 4);
}

TEST(PeftAdapterConfig, NullTaskTypeIsAccepted) {
  EXPECT_EQ(lora_from_peft(real_file_with(R"({"task_type": null})"), "f").r, 4);
}

TEST(PeftAdapterConfig, OtherPeftTypeIsRefused) {
  std::string msg = peft_error(real_file_with(R"({"peft_type": "IA3"})"));
  EXPECT_TRUE(contains(
      msg,
      R"(adapter/adapter_config.json: peft_type: "IA3" is not supported: Strata reads LoRA adapters only; allowed: "LORA")"))
      << msg;
}

TEST(PeftAdapterConfig, MissingPeftTypeIsRefused) {
  nlohmann::json doc = real_file();
  doc.erase("peft_type");
  EXPECT_TRUE(contains(peft_error(doc), "peft_type: missing")) << peft_error(doc);
}

TEST(PeftAdapterConfig, MissingTargetModulesIsRefused) {
  nlohmann::json doc = real_file();
  doc.erase("target_modules");
  std::string msg = peft_error(doc);
  EXPECT_TRUE(contains(
      msg,
      R"(target_modules: missing; give PEFT's module names, e.g. ["q_proj", "v_proj"], or "all-linear")"))
      << msg;
}

TEST(PeftAdapterConfig, ValueOutOfRangeNamesTheField) {
  std::string msg = peft_error(real_file_with(R"({"r": 0})"));
  EXPECT_TRUE(contains(msg, "adapter/adapter_config.json: r: 0 is out of range; allowed: an integer >= 1"))
      << msg;
}

TEST(PeftAdapterConfig, TopLevelThatIsNotAnObjectIsRefused) {
  EXPECT_TRUE(contains(peft_error(nlohmann::json::array()), "not a JSON object"));
}

TEST(PeftAdapterConfig, EveryProblemReportedTogether) {
  std::string msg = peft_error(real_file_with(R"({"use_dora": true, "lora_dropout": 1.5})"));
  EXPECT_TRUE(contains(msg, "2 problems:")) << msg;
  EXPECT_TRUE(contains(msg, "use_dora: true is not supported")) << msg;
  EXPECT_TRUE(contains(msg, "lora_dropout: 1.5 is out of range")) << msg;
}

struct Refused {
  const char* field;
  const char* value;  // JSON
  const char* reason;
};

void PrintTo(const Refused& r, std::ostream* os) {
  *os << r.field;
}

class RefusedPeftOptions : public ::testing::TestWithParam<Refused> {};

// The file's message names the field and the reason, in the words the strata.lora block uses.
TEST_P(RefusedPeftOptions, NamedWithTheBlocksReason) {
  const Refused& p = GetParam();
  const nlohmann::json value = nlohmann::json::parse(p.value);
  nlohmann::json doc = real_file();
  doc[p.field] = value;
  const std::string msg = peft_error(doc);
  const std::string said =
      detail::cat(p.field, ": ", testing::contains(p.value, "{") ? value.dump() : p.value,
                  " is not supported: ", p.reason);
  EXPECT_TRUE(contains(msg, "adapter/adapter_config.json: " + said)) << msg;
  if (std::string(p.field) == "peft_type") return;  // adapter_config.json only
  const std::string block =
      testing::parse_error({{"train_batch_size", 8},
                            {"strata", {{"lora", {{"target_modules", "all-linear"}, {p.field, value}}}}}});
  EXPECT_TRUE(contains(block, "strata.lora." + said)) << block;
  EXPECT_EQ(msg.substr(msg.find(said)), block.substr(block.find(said)));
}

const Refused kRefused[] = {
    {"use_dora", "true", "DoRA is not computed"},
    {"fan_in_fan_out", "true", "weights stored (in, out)"},
    {"bias", R"("lora_only")", "training the base's biases"},
    {"layers_to_transform", "[0]", "choosing layers by index is not computed"},
    {"layers_pattern", R"("h")", "choosing layers by index is not computed"},
    {"rank_pattern", R"({"q_proj": 8})", "per-module ranks are not computed"},
    {"alpha_pattern", R"({"q_proj": 8})", "per-module alphas are not computed"},
    {"lora_bias", "true", "a bias on lora_B is not computed"},
    {"init_lora_weights", R"("pissa")", "PEFT's other initialisations"},
    {"task_type", R"("SEQ_CLS")", "Strata trains causal language models"},
    {"exclude_modules", R"(["o_proj"])", "excluding modules is not computed"},
    {"target_parameters", R"(["experts.gate_up_proj"])", "adapting parameters"},
    {"trainable_token_indices", "[1, 2]", "training chosen rows of the embedding is not computed"},
    {"layer_replication", "[[0, 2]]", "layer replication is not computed"},
    {"megatron_config", R"({"x": 1})", "Megatron's parallel linear layers are not computed"},
    {"use_qalora", "true", "QALoRA is not computed"},
    {"alora_invocation_tokens", "[5]", "Activated LoRA (aLoRA) is not computed"},
    {"velora_config", R"({"x": 1})", "VeLoRA is not computed"},
    {"monteclora_config", R"({"x": 1})", "MonteCLoRA is not computed"},
    {"use_bdlora", R"({"x": 1})", "block-diagonal LoRA (BD-LoRA) is not computed"},
    {"arrow_config", R"({"x": 1})", "Arrow routing is not computed"},
    {"kasa_config", R"({"x": 1})", "KaSA is not computed"},
    {"peft_type", R"("PREFIX_TUNING")", "Strata reads LoRA adapters only"},
};

INSTANTIATE_TEST_SUITE_P(Config, RefusedPeftOptions, ::testing::ValuesIn(kRefused),
                         [](const auto& info) { return std::string(info.param.field); });

}  // namespace
}  // namespace strata
