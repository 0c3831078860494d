// DeepSpeed keys Strata knowingly does not implement: one warning each, value not read.
#include "config_test_util.h"

namespace strata {
namespace {

TEST(IgnoredKeys, EachWarnsOnceAndIsNotValidated) {
  nlohmann::json doc = {{"train_batch_size", 8},
                        {"comet", {{"enabled", true}, {"project", "x"}}},
                        {"flops_profiler", {{"enabled", "not even a bool"}}},
                        {"comms_logger", {{"enabled", true}}},
                        {"zero_optimization", {{"stage", 3}, {"zero_quantized_weights", true}}}};
  Config c = Config::parse(doc);
  ASSERT_EQ(c.warnings().size(), 4u);
  for (const char* key : {"comet: ignored", "flops_profiler: ignored", "comms_logger: ignored",
                          "zero_optimization.zero_quantized_weights: ignored; ZeRO++"})
    EXPECT_TRUE(testing::any_contains(c.warnings(), key)) << key;
}

// wandb would be a monitor that never writes: asking for it is refused, naming what does write.
TEST(IgnoredKeys, WandbEnabledIsRefusedNamingTheMonitorsThatWrite) {
  const std::string msg =
      testing::parse_error({{"train_batch_size", 8}, {"wandb", {{"enabled", true}, {"project", "x"}}}});
  EXPECT_NE(msg.find("wandb: not supported"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tensorboard"), std::string::npos) << msg;
  EXPECT_NE(msg.find("csv_monitor"), std::string::npos) << msg;
}

// A stock config disables what it does not use ("tensorboard": {"enabled": false}); that asks for nothing
// Strata lacks, so it gives no warning. Enabled, or with anything but a boolean false, it still warns.
TEST(IgnoredKeys, DisabledOnesAreSilent) {
  nlohmann::json doc = {{"train_batch_size", 8},
                        {"tensorboard", {{"enabled", false}, {"output_path", "logs/"}}},
                        {"flops_profiler", {{"enabled", false}}},
                        {"prescale_gradients", false},
                        {"wandb", nullptr},
                        {"zero_optimization", {{"stage", 3}, {"zero_quantized_weights", false}}}};
  EXPECT_TRUE(Config::parse(doc).warnings().empty());
  doc["comms_logger"] = {{"enabled", "false"}};
  doc["zero_optimization"]["zero_hpz_partition_size"] = 1;
  Config c = Config::parse(doc);
  ASSERT_EQ(c.warnings().size(), 2u);
  EXPECT_TRUE(testing::any_contains(c.warnings(), "comms_logger: ignored"));
  EXPECT_TRUE(testing::any_contains(c.warnings(), "zero_hpz_partition_size: ignored"));
}

}  // namespace
}  // namespace strata
