// AioOptions: DeepSpeed's defaults, validation messages, backend names, and the config JSON.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "nvme/options.h"

namespace strata::nvme {
namespace {

TEST(AioOptions, DefaultsAreDeepSpeeds) {
  AioOptions o;
  EXPECT_EQ(o.block_size, 1048576u);
  EXPECT_EQ(o.queue_depth, 8);
  EXPECT_EQ(o.intra_op_parallelism, 1);
  EXPECT_FALSE(o.single_submit);
  EXPECT_TRUE(o.overlap_events);
  EXPECT_TRUE(o.use_direct);
  EXPECT_EQ(o.backend, Backend::auto_select);
  EXPECT_NO_THROW(o.validate());
}

TEST(AioOptions, OutOfRangeValuesNameTheKeyAndTheValue) {
  auto message = [](AioOptions o) {
    try {
      o.validate();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  AioOptions o;
  o.block_size = 1000;
  EXPECT_NE(message(o).find("aio.block_size: 1000"), std::string::npos) << message(o);
  o = {};
  o.queue_depth = 0;
  EXPECT_NE(message(o).find("aio.queue_depth: 0"), std::string::npos) << message(o);
  o = {};
  o.intra_op_parallelism = 65;
  EXPECT_NE(message(o).find("aio.intra_op_parallelism: 65"), std::string::npos) << message(o);
  o = {};
  o.backend = Backend::libaio;
  o.sqpoll = true;
  EXPECT_NE(message(o).find("strata.aio.sqpoll"), std::string::npos) << message(o);
}

TEST(AioOptions, BackendNamesParseAndUnknownOnesListTheAllowedValues) {
  for (Backend b : {Backend::auto_select, Backend::io_uring, Backend::libaio, Backend::psync})
    EXPECT_EQ(parse_backend(to_string(b)), b);
  try {
    parse_backend("spdk");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("strata.aio.backend"), std::string::npos) << m;
    EXPECT_NE(m.find("auto, io_uring, libaio, psync"), std::string::npos) << m;
  }
}

TEST(AioOptions, ConfigJsonHasTheDeepSpeedKeysAndTheBackend) {
  AioOptions o;
  o.backend = Backend::io_uring;
  o.queue_depth = 32;
  auto j = nlohmann::json::parse(o.to_config_json());
  EXPECT_EQ(j["aio"]["block_size"], 1048576);
  EXPECT_EQ(j["aio"]["queue_depth"], 32);
  EXPECT_EQ(j["aio"]["intra_op_parallelism"], 1);
  EXPECT_EQ(j["aio"]["single_submit"], false);
  EXPECT_EQ(j["aio"]["overlap_events"], true);
  EXPECT_EQ(j["strata"]["aio"]["backend"], "io_uring");
}

}  // namespace
}  // namespace strata::nvme
