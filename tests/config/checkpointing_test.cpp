// strata.checkpoint_activations (true / false / "auto") and DeepSpeed's activation_checkpointing section:
// what each value reads as, and what is refused.
#include "config_test_util.h"

namespace strata {
namespace {

using CK = StrataConfig::Checkpointing;

CK mode(const nlohmann::json& value) {
  return Config::parse({{"train_batch_size", 8}, {"strata", {{"checkpoint_activations", value}}}})
      .strata.checkpoint_activations;
}

TEST(Checkpointing, DefaultsToAuto) {
  EXPECT_EQ(Config::parse({{"train_batch_size", 8}}).strata.checkpoint_activations, CK::automatic);
}

TEST(Checkpointing, TakesJsonBooleansAndTheirNames) {
  EXPECT_EQ(mode(true), CK::on);
  EXPECT_EQ(mode(false), CK::off);
  EXPECT_EQ(mode("true"), CK::on);
  EXPECT_EQ(mode("false"), CK::off);
  EXPECT_EQ(mode("auto"), CK::automatic);
}

TEST(Checkpointing, RefusesOtherValuesNamingTheKey) {
  const std::string e =
      testing::parse_error({{"train_batch_size", 8}, {"strata", {{"checkpoint_activations", "sometimes"}}}});
  EXPECT_TRUE(testing::contains(e, "strata.checkpoint_activations")) << e;
  EXPECT_TRUE(testing::contains(e, "auto, true, false")) << e;
  EXPECT_FALSE(
      testing::parse_error({{"train_batch_size", 8}, {"strata", {{"checkpoint_activations", 1}}}}).empty());
}

TEST(Checkpointing, RoundTripsThroughToJson) {
  for (const nlohmann::json& v : {nlohmann::json(true), nlohmann::json(false), nlohmann::json("auto")}) {
    const Config a = Config::parse({{"train_batch_size", 8}, {"strata", {{"checkpoint_activations", v}}}});
    EXPECT_EQ(Config::parse(a.to_json()).strata.checkpoint_activations, a.strata.checkpoint_activations);
  }
}

TEST(ActivationCheckpointingSection, DeepSpeedsKeysAreReadWithoutWarnings) {
  const Config c = Config::parse({{"train_batch_size", 8},
                                  {"activation_checkpointing",
                                   {{"partition_activations", true},
                                    {"contiguous_memory_optimization", true},
                                    {"number_checkpoints", 4},
                                    {"synchronize_checkpoint_boundary", true},
                                    {"profile", true}}}});
  EXPECT_TRUE(c.warnings().empty()) << c.warnings()[0];
  EXPECT_TRUE(c.activation_checkpointing.partition_activations);
  EXPECT_EQ(c.activation_checkpointing.number_checkpoints, 4);
}

TEST(ActivationCheckpointingSection, CpuCheckpointingReadsTrueFalseAndAuto) {
  using Cpu = ActivationCheckpointingConfig::CpuCheckpointing;
  const auto parsed = [](nlohmann::json v) {
    const Config c =
        Config::parse({{"train_batch_size", 8}, {"activation_checkpointing", {{"cpu_checkpointing", v}}}});
    EXPECT_TRUE(c.warnings().empty()) << c.warnings()[0];
    return c.activation_checkpointing.cpu_checkpointing;
  };
  EXPECT_EQ(parsed(true), Cpu::on);
  EXPECT_EQ(parsed(false), Cpu::off);
  EXPECT_EQ(parsed("auto"), Cpu::automatic);
  EXPECT_EQ(Config::parse({{"train_batch_size", 8}}).activation_checkpointing.cpu_checkpointing, Cpu::off);
  EXPECT_TRUE(
      testing::contains(testing::parse_error({{"train_batch_size", 8},
                                              {"activation_checkpointing", {{"cpu_checkpointing", 2}}}}),
                        "activation_checkpointing.cpu_checkpointing"));
}

TEST(ActivationCheckpointingSection, BadValuesAndUnknownKeysAreRefused) {
  EXPECT_TRUE(
      testing::contains(testing::parse_error({{"train_batch_size", 8},
                                              {"activation_checkpointing", {{"number_checkpoints", -1}}}}),
                        "activation_checkpointing.number_checkpoints"));
  EXPECT_TRUE(testing::contains(
      testing::parse_error(
          {{"train_batch_size", 8}, {"activation_checkpointing", {{"partition_activation", true}}}}),
      "partition_activations"));  // the nearest known key is suggested
}

}  // namespace
}  // namespace strata
