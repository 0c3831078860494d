// Sizes: integers, exact floats and strings with SI (10^3) or IEC (2^10) multipliers, never rounded.
#include "config_test_util.h"

namespace strata {
namespace {

struct SizeCase {
  const char* text;
  std::uint64_t bytes;
};

class ByteSizeStrings : public ::testing::TestWithParam<SizeCase> {};

TEST_P(ByteSizeStrings, ParseExactly) {
  EXPECT_EQ(parse_byte_size(GetParam().text), GetParam().bytes);
}

const SizeCase kSizes[] = {
    {"1048576", 1048576ull},
    {"5e8", 500000000ull},
    {"512MB", 512000000ull},
    {"512 MB", 512000000ull},
    {"2GiB", 2147483648ull},
    {"2gib", 2147483648ull},
    {"1.5G", 1500000000ull},
    {"1.5GiB", 1610612736ull},
    {"64Ki", 65536ull},
    {"4KiB", 4096ull},
    {"0.5KiB", 512ull},
    {"1.50e3", 1500ull},
    {"3T", 3000000000000ull},
    {"16B", 16ull},
    {"0", 0ull},
    {"18446744073709551615", 18446744073709551615ull},
};

INSTANTIATE_TEST_SUITE_P(Config, ByteSizeStrings, ::testing::ValuesIn(kSizes));

struct BadSize {
  const char* text;
  const char* why;
};

class BadByteSizeStrings : public ::testing::TestWithParam<BadSize> {};

TEST_P(BadByteSizeStrings, AreRejectedWithTheReason) {
  try {
    parse_byte_size(GetParam().text, "strata.device_memory_cap");
    FAIL() << "accepted " << GetParam().text;
  } catch (const ConfigError& e) {
    std::string msg = e.what();
    EXPECT_TRUE(testing::contains(msg, std::string("strata.device_memory_cap: \"") + GetParam().text + "\""));
    EXPECT_TRUE(testing::contains(msg, GetParam().why)) << msg;
    EXPECT_TRUE(testing::contains(msg, "\"2GiB\" (2^30)")) << msg;  // what is allowed
  }
}

const BadSize kBadSizes[] = {
    {"1.0001KB", "is not a whole number of bytes"},
    {"0.3", "is not a whole number of bytes"},
    {"-1MB", "is negative"},
    {"12 parsecs", "has an unknown unit \"parsecs\""},
    {"MB", "is not a size"},
    {"1e", "has an unknown unit \"e\""},
    {"18446744073709551616", "is too large"},
    {"20EiB", "has an unknown unit"},
    {"1 2", "is not a size"},
};

INSTANTIATE_TEST_SUITE_P(Config, BadByteSizeStrings, ::testing::ValuesIn(kBadSizes));

TEST(SizeKeys, AcceptNumbersFloatsAndStrings) {
  nlohmann::json doc = {{"train_batch_size", 8},
                        {"aio", {{"block_size", "8MiB"}}},
                        {"strata", {{"device_memory_cap", 2.5e9}}},
                        {"zero_optimization", {{"sub_group_size", "100M"}, {"reduce_bucket_size", 2e8}}}};
  Config c = Config::parse(doc);
  EXPECT_EQ(c.aio.block_size, 8u << 20);
  EXPECT_EQ(c.strata.device_memory_cap, 2500000000u);
  EXPECT_EQ(c.zero_optimization.sub_group_size, 100000000u);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 200000000u);
}

TEST(SizeKeys, IntegerKeysAcceptExactFloats) {
  Config c = Config::parse({{"train_batch_size", 8.0}, {"zero_optimization", {{"stage", 3.0}}}});
  EXPECT_EQ(c.train_batch_size, 8);
  EXPECT_EQ(c.zero_optimization.stage, 3);
}

// A document built in C++ from int holds signed integers; positive ones are sizes like any other, and
// only a value below zero is called negative.
TEST(SizeKeys, SignedIntegersFromCppAreSizes) {
  nlohmann::json doc = {
      {"train_batch_size", 8},
      {"zero_optimization", {{"stage", 3}, {"stage3_prefetch_bucket_size", std::int64_t(426496)}}}};
  ASSERT_TRUE(doc["zero_optimization"]["stage3_prefetch_bucket_size"].is_number_integer());
  ASSERT_FALSE(doc["zero_optimization"]["stage3_prefetch_bucket_size"].is_number_unsigned());
  EXPECT_EQ(Config::parse(doc).zero_optimization.stage3_prefetch_bucket_size, 426496u);
  doc["zero_optimization"]["stage3_prefetch_bucket_size"] = std::int64_t(-1);
  try {
    Config::parse(doc);
    FAIL() << "-1 accepted";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(testing::contains(e.what(), "is negative")) << e.what();
  }
}

}  // namespace
}  // namespace strata
