// DeepSpeed's csv_monitor section: its three keys with DeepSpeed's defaults (monitor/config.py CSVConfig),
// read like every other key, and refused with the key named when mistyped. Then the files both front-ends
// write for it (session/csv_monitor.h) over an earlier run's: a new run replaces them, a resumed run keeps
// the rows up to its checkpoint's step and continues them (Note [Earlier runs' files]).
#include <filesystem>
#include <fstream>
#include <iterator>

#include "config_test_util.h"
#include "session/csv_monitor.h"

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

// ---- the files over an earlier run's (session/csv_monitor.h) ----

using session::CsvMonitor;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// `header`, then one row `step,<value text>` per step in [from, to] by `by`, values written as an
// earlier run might have (not %.17g), so that keeping a row byte for byte shows.
std::string rows(std::int64_t from, std::int64_t to, std::int64_t by, const std::string& tag) {
  std::string s;
  for (std::int64_t st = from; st <= to; st += by) s += std::to_string(st) + ",0.5" + tag + "e-1\n";
  return s;
}

// The step column of every row after the header.
std::vector<std::int64_t> steps_of(const std::string& text) {
  std::vector<std::int64_t> out;
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) out.push_back(std::stoll(line.substr(0, line.find(','))));
  return out;
}

bool tmp_files_left(const std::string& dir) {
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".tmp") return true;
  return false;
}

TEST(CsvMonitorFiles, NewRunReplacesAnEarlierRunsFilesAndLeavesOthersAlone) {
  test::ScratchDir dir("csv");
  const std::string loss = CsvMonitor::file_for(dir.path(), "Train/Samples/train_loss");
  const std::string eval = CsvMonitor::file_for(dir.path(), "Train/Samples/eval_loss");
  const std::string other = dir.file("notes.csv");
  testing::write_file(loss, "step,train_loss\n" + rows(4, 40, 4, "1"));
  testing::write_file(eval, "step,eval_loss\n" + rows(40, 40, 4, "2"));
  testing::write_file(other, "step,mine\n4,1\n");
  CsvMonitor mon(dir.path(), std::nullopt);
  // Every earlier file of the monitor's events is gone before the first step, the one this run will not
  // write included; a file that is not the monitor's is untouched.
  EXPECT_FALSE(std::filesystem::exists(loss));
  EXPECT_FALSE(std::filesystem::exists(eval));
  EXPECT_EQ(read_text(other), "step,mine\n4,1\n");
  mon.write("Train/Samples/train_loss", 4, 2.5);
  mon.write("Train/Samples/train_loss", 8, 2.25);
  EXPECT_EQ(read_text(loss), "step,train_loss\n4,2.5\n8,2.25\n");
}

TEST(CsvMonitorFiles, NewRunReplacesAnotherEventsFileAtItsFirstWrite) {
  test::ScratchDir dir("csv");
  const std::string f = CsvMonitor::file_for(dir.path(), "Eval/loss");
  testing::write_file(f, "step,loss\n" + rows(10, 30, 10, "3"));
  CsvMonitor mon(dir.path(), std::nullopt);
  EXPECT_TRUE(std::filesystem::exists(f));  // outside kEventPrefix: not looked for up front
  mon.write("Eval/loss", 10, 1.0);
  EXPECT_EQ(read_text(f), "step,loss\n10,1\n");
}

TEST(CsvMonitorFiles, ResumeDropsRowsPastTheStepKeepsTheRestByteForByteAndAppendsAfter) {
  test::ScratchDir dir("csv");
  const std::string loss = CsvMonitor::file_for(dir.path(), "Train/Samples/train_loss");
  const std::string lr = CsvMonitor::file_for(dir.path(), "Train/Samples/lr");
  const std::string kept_loss = "step,train_loss\n" + rows(4, 20, 4, "0000000000000000055511151231257827");
  const std::string kept_lr = "step,lr\n" + rows(4, 20, 4, "7");
  testing::write_file(loss, kept_loss + rows(24, 40, 4, "1"));
  testing::write_file(lr, kept_lr + rows(24, 40, 4, "7"));
  CsvMonitor mon(dir.path(), 20);
  // Both files are trimmed before the first step, the one this run has not written yet too.
  EXPECT_EQ(read_text(loss), kept_loss);
  EXPECT_EQ(read_text(lr), kept_lr);
  EXPECT_FALSE(tmp_files_left(dir.path()));
  mon.write("Train/Samples/train_loss", 24, 3.0);
  mon.write("Train/Samples/train_loss", 28, 2.75);
  EXPECT_EQ(read_text(loss), kept_loss + "24,3\n28,2.75\n");
  const std::vector<std::int64_t> steps = steps_of(read_text(loss));
  EXPECT_TRUE(std::is_sorted(steps.begin(), steps.end(), std::less_equal<>())) << read_text(loss);
}

TEST(CsvMonitorFiles, ResumeWithTheFilesMissingStartsThemWithTheirHeader) {
  test::ScratchDir dir("csv");
  CsvMonitor mon(dir.path(), 80);
  mon.write("Train/Samples/grad_norm", 84, 0.125);
  mon.write("Train/Samples/grad_norm", 88, 0.25);
  EXPECT_EQ(read_text(CsvMonitor::file_for(dir.path(), "Train/Samples/grad_norm")),
            "step,grad_norm\n84,0.125\n88,0.25\n");
}

TEST(CsvMonitorFiles, ResumeAtTheLastRowLeavesTheFileAsItWas) {
  test::ScratchDir dir("csv");
  const std::string f = CsvMonitor::file_for(dir.path(), "Train/Samples/lr");
  const std::string text = "step,lr\n" + rows(4, 40, 4, "9");
  testing::write_file(f, text);
  const auto before = std::filesystem::last_write_time(f);
  CsvMonitor mon(dir.path(), 40);
  EXPECT_EQ(read_text(f), text);
  EXPECT_EQ(std::filesystem::last_write_time(f), before);
}

TEST(CsvMonitorFiles, ResumeOverAFileThatGoesBackKeepsTheLaterRunsRows) {
  // An earlier run wrote 4..40; a run resumed from step 20 appended 24..40 (DeepSpeed's append, or Strata
  // before the trim); now a resume from the second run's step 28.
  test::ScratchDir dir("csv");
  const std::string f = CsvMonitor::file_for(dir.path(), "Train/Samples/train_loss");
  testing::write_file(f,
                      "step,train_loss\n" + rows(4, 40, 4, "1") + "step,train_loss\n" + rows(24, 40, 4, "2"));
  CsvMonitor mon(dir.path(), 28);
  EXPECT_EQ(read_text(f), "step,train_loss\n" + rows(4, 20, 4, "1") + rows(24, 28, 4, "2"));
}

TEST(CsvMonitorFiles, ResumeDropsATornLastLine) {
  // A run killed in the middle of a row: the partial row would otherwise join the next one.
  test::ScratchDir dir("csv");
  const std::string f = CsvMonitor::file_for(dir.path(), "Train/Samples/lr");
  const std::string kept = "step,lr\n" + rows(4, 12, 4, "5");
  testing::write_file(f, kept + "16,0.12");
  CsvMonitor mon(dir.path(), 40);
  EXPECT_EQ(read_text(f), kept);
  mon.write("Train/Samples/lr", 44, 0.5);
  EXPECT_EQ(read_text(f), kept + "44,0.5\n");
}

TEST(CsvMonitorFiles, ResumeTrimsAnotherEventsFileAtItsFirstWrite) {
  test::ScratchDir dir("csv");
  const std::string f = CsvMonitor::file_for(dir.path(), "Eval/loss");
  const std::string kept = "step,loss\n" + rows(10, 20, 10, "4");
  testing::write_file(f, kept + rows(30, 50, 10, "4"));
  CsvMonitor mon(dir.path(), 20);
  mon.write("Eval/loss", 30, 1.5);
  EXPECT_EQ(read_text(f), kept + "30,1.5\n");
}

}  // namespace
}  // namespace strata
