// Loading a file: a missing file, a directory and malformed JSON are ConfigErrors that name the file.
#include "config_test_util.h"

namespace strata {
namespace {

std::string load_error(const std::string& path) {
  try {
    Config::load(path);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "loaded " << path;
  return "";
}

TEST(ConfigFile, MissingFileNamesThePathAndTheReason) {
  test::ScratchDir dir("config");
  std::string path = dir.file("nope.json");
  std::string msg = load_error(path);
  EXPECT_TRUE(testing::contains(msg, path + ": cannot read the config file")) << msg;
  EXPECT_TRUE(testing::contains(msg, "No such file or directory")) << msg;
}

TEST(ConfigFile, DirectoryIsNotAConfigFile) {
  test::ScratchDir dir("config");
  std::string msg = load_error(dir.path());
  EXPECT_TRUE(testing::contains(msg, dir.path() + ": is a directory, not a JSON config file")) << msg;
}

TEST(ConfigFile, MalformedJsonReportsLineAndColumn) {
  test::ScratchDir dir("config");
  std::string path = dir.file("bad.json");
  testing::write_file(path, "{\n  \"train_batch_size\": 8,\n  \"fp16\": {\"enabled\": true,}\n}\n");
  std::string msg = load_error(path);
  EXPECT_TRUE(testing::contains(msg, path + ": malformed JSON: parse error at line 3, column")) << msg;
  EXPECT_FALSE(testing::contains(msg, "[json.exception")) << msg;
}

// A number too large for a double is the JSON library's out_of_range, not a parse error, and comes first
// when the syntax error follows it (found by fuzz/config_fuzz: fuzz/corpus/config/number_overflow.json).
TEST(ConfigFile, ANumberTooLargeForADoubleIsMalformedJson) {
  test::ScratchDir dir("config");
  std::string path = dir.file("huge.json");
  testing::write_file(path, "{\"aio\": {\"queue_depth\": 1e999}, \"train_batch_size\": [[[\n");
  std::string msg = load_error(path);
  EXPECT_TRUE(testing::contains(msg, path + ": malformed JSON: number overflow parsing '1e999'")) << msg;
}

TEST(ConfigFile, ErrorsInsideTheFileArePrefixedWithItsPath) {
  test::ScratchDir dir("config");
  std::string path = dir.file("stage.json");
  testing::write_file(path, R"({"train_batch_size": 8, "zero_optimization": {"stage": "three"}})");
  std::string msg = load_error(path);
  EXPECT_EQ(msg.rfind(path + ": zero_optimization.stage: \"three\" is not an integer", 0), 0u) << msg;
}

}  // namespace
}  // namespace strata
