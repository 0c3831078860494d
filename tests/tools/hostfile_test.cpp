// The hostfile parser (DeepSpeed's `hostname slots=N` format) and its errors.
#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "tests/common/scratch_dir.h"
#include "tools/launch_plan.h"

namespace strata::cli {
namespace {

// The ConfigError message `f` throws ("" when it throws nothing).
template <typename F>
std::string config_error(F f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Hostfile, LinesCommentsAndBlanks) {
  const auto hosts = parse_hostfile(
      "# the cluster\n"
      "worker-1 slots=4\n"
      "\n"
      "  worker-2\tslots=2   # the small one\n"
      "10.0.0.3 slots=1\r\n",
      "hosts");
  const std::vector<HostSlots> want = {{"worker-1", {0, 1, 2, 3}}, {"worker-2", {0, 1}}, {"10.0.0.3", {0}}};
  EXPECT_EQ(hosts, want);
}

TEST(Hostfile, BadLinesNameTheLine) {
  for (const char* bad :
       {"worker-1", "worker-1 slots=", "worker-1 slots=0", "worker-1 slots=x", "worker-1 slots=-2",
        "worker-1 4", "worker-1 slots=2 max_slots=4", "worker-1 slot=2"}) {
    const std::string msg =
        config_error([&] { parse_hostfile(std::string("a slots=1\n") + bad + "\n", "hf"); });
    EXPECT_NE(msg.find("hostfile hf line 2"), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find("hostname slots=N"), std::string::npos) << msg;
  }
}

TEST(Hostfile, HostListedTwice) {
  const std::string msg = config_error([] { parse_hostfile("a slots=1\nb slots=2\na slots=3\n", "hf"); });
  EXPECT_NE(msg.find("line 3: host \"a\" is listed twice"), std::string::npos) << msg;
}

TEST(Hostfile, NoHost) {
  const std::string msg = config_error([] { parse_hostfile("# nothing\n\n", "hf"); });
  EXPECT_NE(msg.find("hostfile hf lists no host"), std::string::npos) << msg;
}

TEST(Hostfile, ReadsAFile) {
  test::ScratchDir dir("tools");
  const std::string path = dir.file("hostfile");
  std::ofstream(path) << "localhost slots=3\n";
  const std::vector<HostSlots> want = {{"localhost", {0, 1, 2}}};
  EXPECT_EQ(read_hostfile(path), want);
}

TEST(Hostfile, MissingFile) {
  test::ScratchDir dir("tools");
  const std::string path = dir.file("absent");
  const std::string msg = config_error([&] { read_hostfile(path); });
  EXPECT_NE(msg.find("--hostfile " + path + ": cannot read it"), std::string::npos) << msg;
}

}  // namespace
}  // namespace strata::cli
