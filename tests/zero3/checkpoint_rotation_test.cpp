// checkpoint.keep_last (Note [Checkpoint rotation] in zero3/checkpoint.h): the newest complete checkpoints
// are kept, never the one `latest` names, and nothing that is not a complete checkpoint is touched.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/common/scratch_dir.h"
#include "zero3/checkpoint.h"

namespace strata::zero3 {
namespace {

namespace fs = std::filesystem;

// A committed checkpoint of one tensor at `step`, tagged `tag`; DIR/latest then names it.
void save(const std::string& dir, const std::string& tag, std::int64_t step) {
  CheckpointWriter w(dir, tag);
  const float x[4] = {1, 2, 3, float(step)};
  w.add({.name = "t", .dtype = "fp32", .bytes = sizeof x}, x);
  w.commit({{"step", step}});
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(CheckpointRotation, KeepsTheNewestAndRemovesTheOldestByStep) {
  test::ScratchDir d("rotation-newest");
  const std::string dir = d.path() + "/ckpt";
  for (std::int64_t step : {10, 20, 30, 40}) {
    save(dir, step_tag(step), step);
    rotate_checkpoints(dir, 2);
  }
  EXPECT_EQ(entries(dir), (std::vector<std::string>{"global_step30", "global_step40", "latest"}));
  CheckpointReader r(dir);
  EXPECT_EQ(r.meta().at("step"), 40);
}

// A run resumed with --load-tag from an older step and saved there: `latest` names a checkpoint older
// than others, and it stays.
TEST(CheckpointRotation, NeverRemovesTheCheckpointLatestNames) {
  test::ScratchDir d("rotation-latest");
  const std::string dir = d.path() + "/ckpt";
  save(dir, "b", 200);
  save(dir, "c", 300);
  save(dir, "a", 100);  // latest -> a
  EXPECT_EQ(rotate_checkpoints(dir, 1), std::vector<std::string>{"b"});
  EXPECT_EQ(entries(dir), (std::vector<std::string>{"a", "c", "latest"}));
}

// Directories being written or moved aside, others' files and a checkpoint of another format stay; a
// leftover of an interrupted removal goes.
TEST(CheckpointRotation, TouchesOnlyCompleteCheckpointsAndRemovalLeftovers) {
  test::ScratchDir d("rotation-others");
  const std::string dir = d.path() + "/ckpt";
  save(dir, "global_step1", 1);
  save(dir, "global_step2", 2);
  for (const char* other : {"global_step3.tmp", "global_step0.old", "notes", "global_step9.removing"})
    fs::create_directories(dir + "/" + other);
  fs::create_directories(dir + "/foreign");
  std::ofstream(dir + "/foreign/meta.json") << R"({"format": "another", "step": 0})";
  std::ofstream(dir + "/README") << "kept\n";
  EXPECT_EQ(rotate_checkpoints(dir, 1), std::vector<std::string>{"global_step1"});
  EXPECT_EQ(entries(dir), (std::vector<std::string>{"README", "foreign", "global_step0.old", "global_step2",
                                                    "global_step3.tmp", "latest", "notes"}));
  EXPECT_TRUE(rotate_checkpoints(dir, 0).empty()) << "keep_last 0 keeps all";
}

}  // namespace
}  // namespace strata::zero3
