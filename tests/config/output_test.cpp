// The resolved config: the printed table and to_json(), which parses back to the same values.
#include "config_test_util.h"

namespace strata {
namespace {

using testing::fixture_path;

TEST(ResolvedTable, ListsEveryKeyInForceWithItsSource) {
  Config c = Config::load(fixture_path("hf_zero3_auto.json"), {{"lr", 3e-4}, {"hidden_size", 1024}});
  std::string t = c.resolved_table();
  EXPECT_TRUE(testing::contains(t, "resolved config (world_size 1)")) << t;
  auto row = [&](const std::string& key) {
    auto at = t.find("\n" + key + " ");
    EXPECT_NE(at, std::string::npos) << key << " missing from\n" << t;
    return at == std::string::npos ? std::string() : t.substr(at + 1, t.find('\n', at + 1) - at - 1);
  };
  EXPECT_TRUE(testing::contains(row("optimizer.params.lr"), "0.0003")) << t;
  EXPECT_TRUE(testing::contains(row("optimizer.params.lr"), "auto→override lr")) << t;
  EXPECT_TRUE(testing::contains(row("zero_optimization.reduce_bucket_size"), "1048576")) << t;
  EXPECT_TRUE(testing::contains(row("zero_optimization.stage"), "file")) << t;
  EXPECT_TRUE(testing::contains(row("aio.queue_depth"), "default")) << t;
  EXPECT_TRUE(testing::contains(row("gradient_accumulation_steps"), "auto→inferred")) << t;
  EXPECT_FALSE(testing::contains(t, "scheduler.params.total_num_steps")) << "WarmupLR has no total_num_steps";
}

TEST(ResolvedJson, ParsesBackToTheSameConfig) {
  Config a = Config::load(fixture_path("zero3_cpu_offload.json"), {}, 2);
  Config b = Config::parse(a.to_json(), {}, 2);
  EXPECT_EQ(a.to_json(), b.to_json());
  EXPECT_EQ(b.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(b.gradient_accumulation_steps, 4);
  EXPECT_EQ(b.scheduler.total_num_steps, 10000);
}

TEST(ResolvedJson, HoldsOnlyKeysInForce) {
  Config c = Config::load(fixture_path("bf16_zero3_cosine.json"), {}, 8);
  nlohmann::json j = c.to_json();
  EXPECT_EQ(j["optimizer"]["type"], "Lion");
  EXPECT_FALSE(j["optimizer"]["params"].contains("eps"));
  EXPECT_FALSE(j["scheduler"]["params"].contains("warmup_max_lr"));
  EXPECT_EQ(j["scheduler"]["params"]["total_num_steps"], 20000);
}

TEST(ConfigSource, UnknownKeyIsAnError) {
  Config c = Config::parse({{"train_batch_size", 8}});
  EXPECT_THROW(c.source("zero_optimization.stage4"), ConfigError);
}

}  // namespace
}  // namespace strata
