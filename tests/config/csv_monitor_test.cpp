// DeepSpeed's csv_monitor section: its three keys with DeepSpeed's defaults (monitor/config.py CSVConfig),
// read like every other key, and refused with the key named when mistyped.
#include "config_test_util.h"

namespace strata {
namespace {

TEST(CsvMonitor, LeftOutTakesDeepSpeedsDefaults) {
  Config c = Config::parse({{"train_batch_size", 8}});
  EXPECT_FALSE(c.csv_monitor.enabled);
  EXPECT_EQ(c.csv_monitor.output_path, "");
  EXPECT_EQ(c.csv_monitor.job_name, "DeepSpeedJobName");
  EXPECT_EQ(c.source("csv_monitor.job_name"), "default");
}

TEST(CsvMonitor, SectionIsReadWithoutWarnings) {
  Config c = Config::parse(
      {{"train_batch_size", 8},
       {"csv_monitor", {{"enabled", true}, {"output_path", "logs/"}, {"job_name", "llama-run"}}}});
  EXPECT_TRUE(c.csv_monitor.enabled);
  EXPECT_EQ(c.csv_monitor.output_path, "logs/");
  EXPECT_EQ(c.csv_monitor.job_name, "llama-run");
  EXPECT_EQ(c.source("csv_monitor.enabled"), "file");
  EXPECT_TRUE(c.warnings().empty()) << c.warnings()[0];
}

TEST(CsvMonitor, EnabledAloneKeepsTheOtherDefaults) {
  Config c = Config::parse({{"train_batch_size", 8}, {"csv_monitor", {{"enabled", true}}}});
  EXPECT_TRUE(c.csv_monitor.enabled);
  EXPECT_EQ(c.csv_monitor.output_path, "");
  EXPECT_EQ(c.csv_monitor.job_name, "DeepSpeedJobName");
}

TEST(CsvMonitor, ResolvedDocumentParsesBackToTheSameSettings) {
  Config c =
      Config::parse({{"train_batch_size", 8}, {"csv_monitor", {{"enabled", true}, {"job_name", "run 7"}}}});
  Config back = Config::parse(c.to_json());
  EXPECT_TRUE(back.csv_monitor.enabled);
  EXPECT_EQ(back.csv_monitor.output_path, "");
  EXPECT_EQ(back.csv_monitor.job_name, "run 7");
}

TEST(CsvMonitor, WrongTypesAreRefusedNamingTheKey) {
  const std::pair<nlohmann::json, std::string> cases[] = {
      {{{"enabled", "yes"}}, R"(csv_monitor.enabled: "yes" is not a boolean (true or false))"},
      {{{"output_path", 5}}, "csv_monitor.output_path: 5 is not a string"},
      {{{"job_name", true}}, "csv_monitor.job_name: true is not a string"},
  };
  for (const auto& [section, expect] : cases) {
    const std::string err = testing::parse_error({{"train_batch_size", 8}, {"csv_monitor", section}});
    EXPECT_TRUE(testing::contains(err, expect)) << err;
  }
}

TEST(CsvMonitor, UnknownKeyInTheSectionSuggestsTheNearest) {
  const std::string err =
      testing::parse_error({{"train_batch_size", 8}, {"csv_monitor", {{"outputpath", "logs"}}}});
  EXPECT_TRUE(testing::contains(err, "csv_monitor.outputpath: unknown key; did you mean output_path?"))
      << err;
}

}  // namespace
}  // namespace strata
