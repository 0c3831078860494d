// --include / --exclude (DeepSpeed's "host1:0,1@host2" syntax) applied to a pool of hosts and slots.
#include <gtest/gtest.h>

#include "core/error.h"
#include "tools/launch_plan.h"

namespace strata::cli {
namespace {

const std::vector<HostSlots> kPool = {{"a", {0, 1, 2, 3}}, {"b", {0, 1}}, {"c", {0, 1, 2}}};

std::string config_error(const std::vector<HostSlots>& pool, const std::string& spec, bool include) {
  try {
    include ? include_hosts(pool, spec) : exclude_hosts(pool, spec);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Include, HostsAndSlotsInPoolOrder) {
  const std::vector<HostSlots> want = {{"a", {1, 3}}, {"c", {0, 1, 2}}};
  EXPECT_EQ(include_hosts(kPool, "c@a:3,1"), want);
}

TEST(Include, DuplicateSlotsCollapse) {
  const std::vector<HostSlots> want = {{"b", {1}}};
  EXPECT_EQ(include_hosts(kPool, "b:1,1"), want);
}

TEST(Exclude, HostsAndSlots) {
  const std::vector<HostSlots> want = {{"a", {0, 2}}, {"c", {0, 1, 2}}};
  EXPECT_EQ(exclude_hosts(kPool, "a:1,3@b"), want);
}

TEST(Exclude, EveryHostLeavesNothing) {
  EXPECT_TRUE(exclude_hosts(kPool, "a@b@c").empty());
}

TEST(Filter, UnknownHostListsThePool) {
  for (bool include : {true, false}) {
    const std::string msg = config_error(kPool, "a:0@d:1", include);
    EXPECT_NE(msg.find("host \"d\" is not in the pool"), std::string::npos) << msg;
    EXPECT_NE(msg.find("b (slots 0,1)"), std::string::npos) << msg;
  }
}

TEST(Filter, UnknownSlotListsTheHostsSlots) {
  const std::string msg = config_error(kPool, "b:0,2", true);
  EXPECT_NE(msg.find("--include \"b:0,2\": host \"b\" has no slot 2; its slots are 0,1"), std::string::npos)
      << msg;
}

TEST(Filter, LocalhostSlotHintsAtHostfile) {
  const std::string msg = config_error({{"localhost", {0}}}, "localhost:0,1", true);
  EXPECT_NE(msg.find("has no slot 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("localhost slots=N"), std::string::npos) << msg;
}

TEST(Filter, BadSyntax) {
  for (const char* bad : {"", "a:", "a:x", "a:0,,1", "a:-1", ":0", "a@", "a:0;1"}) {
    const std::string msg = config_error(kPool, bad, false);
    EXPECT_NE(msg.find("--exclude \"" + std::string(bad) + "\""), std::string::npos) << bad << ": " << msg;
  }
  const std::string msg = config_error(kPool, "a:x", true);
  EXPECT_NE(msg.find("expected host[:slot,slot...] items separated by '@'"), std::string::npos) << msg;
}

}  // namespace
}  // namespace strata::cli
