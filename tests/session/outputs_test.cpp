// session::check_outputs and check_output_room (Note [Outputs up front] in session/session.cpp): every
// directory a run writes is created and probed, and a bad one refused with a message naming the output as
// the front-end's user gave it — the same function, so the same message, for strata train and
// strata.initialize.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "core/error.h"
#include "session/session.h"
#include "tests/common/scratch_dir.h"

namespace strata::session {
namespace {

namespace fs = std::filesystem;

// A directory that cannot be created, even by root: /proc takes no new entries.
constexpr const char* kUncreatable = "/proc/strata-session-test/out";

std::string refusal(const OutputPlan& plan) {
  try {
    check_outputs(plan);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

std::string room_refusal(const OutputPlan& plan, const OutputSizes& sizes, int local_ranks) {
  try {
    check_output_room(plan, sizes, local_ranks);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

void touch(const std::string& path) {
  std::ofstream(path) << "x";
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

TEST(CheckOutputs, CreatesEveryDirectoryTheRunWrites) {
  test::ScratchDir dir("session");
  const OutputPlan plan{
      .save = {dir.file("ckpt/a"), "--save"},
      .export_to = {dir.file("out/model.safetensors"), "--export"},
      .trace = dir.file("traces/run.memprof.jsonl"),
      .monitors = {{dir.file("csv/job"), "csv_monitor.output_path/job_name:"}, {"", "unused"}}};
  check_outputs(plan);
  for (const char* d : {"ckpt/a", "out", "traces", "csv/job"})
    EXPECT_TRUE(fs::is_directory(dir.file(d))) << d;
  EXPECT_FALSE(fs::exists(dir.file("out/model.safetensors")));  // the file itself is the export's to write
  EXPECT_FALSE(fs::exists(dir.file("traces/run.memprof.jsonl")));
  EXPECT_TRUE(fs::is_empty(dir.file("ckpt/a")));  // the probe leaves nothing behind
  check_outputs(plan);                            // existing directories pass again
}

TEST(CheckOutputs, AnEmptyPlanChecksNothing) {
  EXPECT_EQ(refusal({}), "");
}

// The message names the output as each front-end names it: strata train's flag, or the Python call's
// argument.
TEST(CheckOutputs, AnUncreatableDirectoryIsRefusedNamingTheOutput) {
  for (const char* what : {"--save", "engine.save_checkpoint(save_dir)"}) {
    const std::string m = refusal({.save = {kUncreatable, what}});
    EXPECT_TRUE(starts_with(m, std::string(what) + " " + kUncreatable + ": cannot create the directory ("))
        << m;
    EXPECT_NE(m.find("choose a writable location"), std::string::npos) << m;
  }
  const std::string m = refusal({.monitors = {{kUncreatable, "tensorboard.output_path/job_name:"}}});
  EXPECT_TRUE(
      starts_with(m, std::string("tensorboard.output_path/job_name: ") + kUncreatable + ": cannot create"))
      << m;
}

TEST(CheckOutputs, AFileWhereADirectoryGoesIsRefused) {
  test::ScratchDir dir("session");
  touch(dir.file("file"));
  EXPECT_EQ(refusal({.save = {dir.file("file"), "--save"}}),
            "--save " + dir.file("file") + " is a file; give a directory to write into");
  EXPECT_EQ(refusal({.export_to = {dir.file("file"), "engine.export(path)"}}),
            "engine.export(path) " + dir.file("file") +
                " is a file; give a directory for the model (or NAME.safetensors for one file)");
}

TEST(CheckOutputs, ASafetensorsExportChecksItsDirectory) {
  const std::string m =
      refusal({.export_to = {std::string(kUncreatable) + "/model.safetensors", "--export"}});
  EXPECT_TRUE(starts_with(m, std::string("--export's directory ") + kUncreatable + ": cannot create")) << m;
}

TEST(CheckOutputs, TheTraceNeedsAWritableDirectoryAndIsNotOne) {
  test::ScratchDir dir("session");
  const std::string m = refusal({.trace = std::string(kUncreatable) + "/run.jsonl"});
  EXPECT_TRUE(
      starts_with(m, std::string("strata.memprof.path's directory ") + kUncreatable + ": cannot create"))
      << m;
  EXPECT_EQ(refusal({.trace = dir.path()}), "strata.memprof.path " + dir.path() +
                                                " is a directory; give the trace file to write (e.g. "
                                                "run.memprof.jsonl)");
}

TEST(CheckOutputRoom, ACheckpointLargerThanTheFreeSpaceIsRefused) {
  test::ScratchDir dir("session");
  const std::uint64_t huge = std::numeric_limits<std::uint64_t>::max() / 4;
  const OutputPlan plan{.save = {dir.path(), "--save"}};
  const std::string one = room_refusal(plan, {.checkpoint = huge}, 1);
  EXPECT_TRUE(starts_with(one, "--save " + dir.path() + ": a checkpoint of this run takes " +
                                   format_bytes(huge) + " and the file system has "))
      << one;
  EXPECT_NE(one.find(" free; free space or choose another --save directory"), std::string::npos) << one;
  // Every rank on the machine writes its part at once: a quarter of the limit, four times over, is refused
  // too.
  const std::string four = room_refusal(plan, {.checkpoint = huge / 4 + 1}, 4);
  EXPECT_NE(four.find(" for the ranks on this machine and the file system has "), std::string::npos) << four;
  EXPECT_EQ(room_refusal(plan, {.checkpoint = 4096}, 4), "");
}

TEST(CheckOutputRoom, AnExportLargerThanTheFreeSpaceIsRefused) {
  test::ScratchDir dir("session");
  const std::uint64_t huge = std::numeric_limits<std::uint64_t>::max() / 4;
  for (const std::string& path : {dir.path(), dir.file("model.safetensors")}) {
    const std::string m = room_refusal({.export_to = {path, "--export"}}, {.exported = huge}, 1);
    EXPECT_TRUE(starts_with(m, "--export " + path + ": the exported model takes " + format_bytes(huge))) << m;
  }
  // A size for an output the plan does not have is not checked.
  EXPECT_EQ(room_refusal({.save = {dir.path(), "--save"}}, {.exported = huge}, 1), "");
  EXPECT_EQ(room_refusal({}, {.checkpoint = huge, .exported = huge}, 1), "");
}

}  // namespace
}  // namespace strata::session
