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

}  // namespace
}  // namespace strata
