// An nvme offload needs an existing, writable nvme_path (one directory, or a list of them, one per drive);
// both offloads are checked the same way.
#include <sys/stat.h>
#include <unistd.h>

#include "config_test_util.h"

namespace strata {
namespace {

// Which offload section the test body exercises.
class NvmePath : public ::testing::TestWithParam<const char*> {
 protected:
  nlohmann::json doc(const nlohmann::json& path) const {
    nlohmann::json off = {{"device", "nvme"}};
    if (!path.is_null()) off["nvme_path"] = path;
    return {{"train_batch_size", 8}, {"zero_optimization", {{"stage", 3}, {GetParam(), off}}}};
  }
  std::string key() const { return std::string("zero_optimization.") + GetParam() + ".nvme_path"; }
  std::vector<std::string> paths(const Config& c) const {
    return std::string(GetParam()) == "offload_param" ? c.zero_optimization.offload_param.nvme_paths
                                                      : c.zero_optimization.offload_optimizer.nvme_paths;
  }
};

TEST_P(NvmePath, WritableDirectoryIsAccepted) {
  test::ScratchDir scratch("config");
  const std::string& dir = scratch.path();
  Config c = Config::parse(doc(dir));
  EXPECT_EQ(paths(c), std::vector<std::string>{dir});
}

TEST_P(NvmePath, AListOfDirectoriesIsKeptInOrderAndPrintedBack) {
  test::ScratchDir a("config-a"), b("config-b");
  Config c = Config::parse(doc(nlohmann::json::array({b.path(), a.path()})));
  EXPECT_EQ(paths(c), (std::vector<std::string>{b.path(), a.path()}));
  EXPECT_EQ(c.to_json()["zero_optimization"][GetParam()]["nvme_path"],
            nlohmann::json::array({b.path(), a.path()}));
  Config one = Config::parse(doc(a.path()));
  EXPECT_EQ(one.to_json()["zero_optimization"][GetParam()]["nvme_path"], a.path());  // DeepSpeed's string
}

TEST_P(NvmePath, EveryDirectoryOfAListIsChecked) {
  test::ScratchDir scratch("config");
  const std::string missing = scratch.file("not/here");
  std::string msg = testing::parse_error(doc(nlohmann::json::array({scratch.path(), missing})));
  EXPECT_TRUE(testing::contains(msg, key() + ": \"" + missing + "\" does not exist")) << msg;
}

TEST_P(NvmePath, ADirectoryListedTwiceIsRefused) {
  test::ScratchDir scratch("config");
  std::string msg = testing::parse_error(doc(nlohmann::json::array({scratch.path(), scratch.path()})));
  EXPECT_TRUE(testing::contains(msg, key())) << msg;
  EXPECT_TRUE(testing::contains(msg, "lists \"" + scratch.path() + "\" twice")) << msg;
}

TEST_P(NvmePath, AnEmptyListOrEntryIsRefused) {
  test::ScratchDir scratch("config");
  EXPECT_TRUE(testing::contains(testing::parse_error(doc(nlohmann::json::array())), key())) << key();
  std::string msg = testing::parse_error(doc(nlohmann::json::array({scratch.path(), ""})));
  EXPECT_TRUE(testing::contains(msg, "not a non-empty string")) << msg;
}

TEST_P(NvmePath, MissingKeyIsRequired) {
  std::string msg = testing::parse_error(doc(nullptr));
  EXPECT_TRUE(testing::contains(
      msg, key() + ": required when zero_optimization." + GetParam() + ".device is \"nvme\""))
      << msg;
}

TEST_P(NvmePath, NonexistentDirectoryIsNamed) {
  test::ScratchDir scratch("config");
  std::string dir = scratch.file("not/here");
  std::string msg = testing::parse_error(doc(dir));
  EXPECT_TRUE(testing::contains(msg, key() + ": \"" + dir + "\" does not exist")) << msg;
}

TEST_P(NvmePath, RegularFileIsNotADirectory) {
  test::ScratchDir scratch("config");
  std::string file = scratch.file("swap");
  testing::write_file(file, "x");
  std::string msg = testing::parse_error(doc(file));
  EXPECT_TRUE(testing::contains(msg, key() + ": \"" + file + "\" is not a directory")) << msg;
}

TEST_P(NvmePath, PathBelowAFileCannotBeUsed) {
  test::ScratchDir scratch("config");
  std::string file = scratch.file("swap");
  testing::write_file(file, "x");
  std::string msg = testing::parse_error(doc(file + "/dir"));
  EXPECT_TRUE(testing::contains(msg, key() + ": \"" + file + "/dir\" cannot be used")) << msg;
  EXPECT_TRUE(testing::contains(msg, "Not a directory")) << msg;
}

TEST_P(NvmePath, ReadOnlyDirectoryIsNotWritable) {
  if (::geteuid() == 0) GTEST_SKIP() << "running as root: permission bits do not deny root writes";
  test::ScratchDir scratch("config");
  const std::string& dir = scratch.path();
  ASSERT_EQ(::chmod(dir.c_str(), 0555), 0);
  std::string msg = testing::parse_error(doc(dir));
  ::chmod(dir.c_str(), 0755);
  EXPECT_TRUE(testing::contains(msg, key() + ": \"" + dir + "\" is not writable")) << msg;
}

INSTANTIATE_TEST_SUITE_P(Config, NvmePath, ::testing::Values("offload_param", "offload_optimizer"));

}  // namespace
}  // namespace strata
