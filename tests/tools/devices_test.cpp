// comm/devices.h: local rank -> device ordinal, with and without STRATA_LOCAL_DEVICES.
#include <gtest/gtest.h>

#include <cstdlib>

#include "comm/devices.h"
#include "core/error.h"

namespace strata::comm {
namespace {

// Sets STRATA_LOCAL_DEVICES for one test and restores the unset state after it.
class LocalDevices : public testing::Test {
 protected:
  void TearDown() override { ::unsetenv(kLocalDevicesEnv); }
  static void set(const char* v) { ::setenv(kLocalDevicesEnv, v, 1); }
  static std::string error(int base, int local_rank) {
    try {
      local_device_ordinal(base, local_rank);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  }
};

TEST_F(LocalDevices, UnsetIsBasePlusLocalRank) {
  ::unsetenv(kLocalDevicesEnv);
  EXPECT_EQ(local_device_ordinal(0, 0), 0);
  EXPECT_EQ(local_device_ordinal(2, 1), 3);
  set("");
  EXPECT_EQ(local_device_ordinal(1, 1), 2);
}

TEST_F(LocalDevices, ListedOrdinalPerLocalRank) {
  set("2,3");
  EXPECT_EQ(local_device_ordinal(0, 0), 2);
  EXPECT_EQ(local_device_ordinal(0, 1), 3);
  EXPECT_EQ(local_device_ordinal(5, 1), 3);  // the list replaces strata.device + local rank
  set("0,0");
  EXPECT_EQ(local_device_ordinal(0, 1), 0);  // two ranks may share a device
}

TEST_F(LocalDevices, TooFewEntries) {
  set("2,3");
  EXPECT_NE(error(0, 2).find("STRATA_LOCAL_DEVICES=\"2,3\" lists 2 device(s) but this is local rank 2"),
            std::string::npos);
}

TEST_F(LocalDevices, MalformedList) {
  for (const char* bad : {"1,", ",1", "a", "1,-2", "1;2", "0x1", " 1"}) {
    set(bad);
    const std::string msg = error(0, 0);
    EXPECT_NE(msg.find(std::string("STRATA_LOCAL_DEVICES=\"") + bad + "\""), std::string::npos)
        << bad << ": " << msg;
    EXPECT_NE(msg.find("is not a device ordinal"), std::string::npos) << msg;
  }
}

TEST(DeviceList, Parses) {
  EXPECT_EQ(parse_device_list("0", "x"), std::vector<int>{0});
  EXPECT_EQ(parse_device_list("3,1,7", "x"), (std::vector<int>{3, 1, 7}));
}

}  // namespace
}  // namespace strata::comm
