// docs/config.md is generated from the schema and must match it; the example configs in configs/ load.
#include "config_test_util.h"

namespace strata {
namespace {

TEST(ConfigDocs, MarkdownMatchesTheSchema) {
  std::ifstream in(testing::source_path("docs/config.md"));
  ASSERT_TRUE(in.good()) << "docs/config.md is missing; generate it: build/tests/config/strata_config_doc > "
                            "docs/config.md";
  std::stringstream text;
  text << in.rdbuf();
  std::string want = config_reference_markdown();
  if (text.str() == want) return;
  std::istringstream have_lines(text.str()), want_lines(want);
  std::string h, w;
  int line = 0;
  while (true) {
    bool more_h = bool(std::getline(have_lines, h)), more_w = bool(std::getline(want_lines, w));
    ++line;
    if (h != w || more_h != more_w) break;
  }
  FAIL() << "docs/config.md is out of step with the config schema (first difference at line " << line
         << ")\n  file:      " << h << "\n  generated: " << w
         << "\nRegenerate it: build/tests/config/strata_config_doc > docs/config.md";
}

void expect_documented(const std::string& md, const nlohmann::json& section, const std::string& prefix) {
  for (const auto& item : section.items()) {
    std::string key = prefix.empty() ? item.key() : prefix + "." + item.key();
    if (item.value().is_object())
      expect_documented(md, item.value(), key);
    else
      EXPECT_TRUE(testing::contains(md, "| `" + key + "` |")) << key << " is not in the reference";
  }
}

TEST(ConfigDocs, EveryResolvedKeyIsDocumented) {
  nlohmann::json doc = {
      {"train_batch_size", 8},
      {"scheduler",
       {{"type", "WarmupCosineLR"}, {"params", {{"total_num_steps", 10}, {"warmup_num_steps", 2}}}}}};
  expect_documented(config_reference_markdown(), Config::parse(doc).to_json(), "");
}

class ExampleConfigs : public ::testing::TestWithParam<const char*> {};

TEST_P(ExampleConfigs, LoadWithoutWarnings) {
  nlohmann::json doc = testing::read_json(testing::source_path(std::string("configs/") + GetParam()));
  test::ScratchDir dir("config");
  const std::string& swap = dir.path();
  for (const char* off : {"offload_param", "offload_optimizer"})
    if (doc["zero_optimization"].contains(off) && doc["zero_optimization"][off]["device"] == "nvme")
      doc["zero_optimization"][off]["nvme_path"] = swap;  // the examples name /local_nvme
  // The stock configs leave the schedule's length to the run (Note [Loud auto] in config/config.cpp).
  Config c = Config::parse(doc, {}, 1, GetParam(), {.total_steps = 100, .from = "--steps 100"});
  EXPECT_TRUE(c.warnings().empty());
  EXPECT_EQ(c.zero_optimization.stage, 3);
  EXPECT_EQ(c.scheduler.total_num_steps, 100);
  EXPECT_TRUE(testing::contains(testing::parse_error(doc), "the run's length is not known here"));
  // DeepSpeed's own schema (DeepSpeedZeroConfig) types these as integers and refuses "50M": the stock
  // configs give sizes as numbers, so that they load in DeepSpeed too (Strata also reads "50M" from users).
  for (const char* size : {"stage3_prefetch_bucket_size", "stage3_max_live_parameters",
                           "stage3_max_reuse_distance", "stage3_param_persistence_threshold",
                           "sub_group_size", "reduce_bucket_size", "allgather_bucket_size"})
    if (doc["zero_optimization"].contains(size)) {
      EXPECT_TRUE(doc["zero_optimization"][size].is_number()) << size;
    }
}

INSTANTIATE_TEST_SUITE_P(Config, ExampleConfigs,
                         ::testing::Values("zero3_none.json", "zero3_cpu.json", "zero3_nvme.json",
                                           "demo_cpu.json", "qlora.json"),
                         [](const auto& info) {
                           std::string n = info.param;
                           return n.substr(0, n.find('.'));
                         });

}  // namespace
}  // namespace strata
