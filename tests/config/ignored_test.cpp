// DeepSpeed keys Strata knowingly does not implement: one warning each, value not read.
#include "config_test_util.h"

namespace strata {
namespace {

TEST(IgnoredKeys, EachWarnsOnceAndIsNotValidated) {
  nlohmann::json doc = {{"train_batch_size", 8},
                        {"wandb", {{"enabled", true}, {"project", "x"}}},
                        {"flops_profiler", {{"enabled", "not even a bool"}}},
                        {"comms_logger", {{"enabled", true}}},
                        {"zero_optimization", {{"stage", 3}, {"zero_quantized_weights", true}}}};
  Config c = Config::parse(doc);
  ASSERT_EQ(c.warnings().size(), 4u);
  for (const char* key : {"wandb: ignored", "flops_profiler: ignored", "comms_logger: ignored",
                          "zero_optimization.zero_quantized_weights: ignored; ZeRO++"})
    EXPECT_TRUE(testing::any_contains(c.warnings(), key)) << key;
}

TEST(IgnoredKeys, ActivationCheckpointingSaysWhy) {
  Config c = Config::parse(
      {{"train_batch_size", 8}, {"activation_checkpointing", {{"partition_activations", true}}}});
  ASSERT_EQ(c.warnings().size(), 1u);
  EXPECT_TRUE(testing::contains(c.warnings()[0], "always recomputes each transformer block"))
      << c.warnings()[0];
}

}  // namespace
}  // namespace strata
