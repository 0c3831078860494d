// CRC-32C: the standard check value, the hardware path against the portable one, and running sums.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "zero3/checksum.h"

namespace strata::zero3 {
namespace {

TEST(Crc32c, StandardCheckValue) {
  const char* s = "123456789";
  EXPECT_EQ(crc32c(s, 9), 0xE3069283u);
  EXPECT_EQ(crc32c_portable(s, 9), 0xE3069283u);
  EXPECT_EQ(crc32c(s, 0), 0u);
}

TEST(Crc32c, FastPathMatchesPortableAtEveryLengthAndAlignment) {
  std::mt19937 rng(7);
  std::vector<unsigned char> buf(4096 + 16);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (std::size_t off = 0; off < 8; ++off)
    for (std::size_t n : {0, 1, 7, 8, 9, 63, 64, 65, 1000, 4096})
      EXPECT_EQ(crc32c(buf.data() + off, n), crc32c_portable(buf.data() + off, n)) << off << " " << n;
}

TEST(Crc32c, RunningSumEqualsWhole) {
  std::vector<unsigned char> buf(10000);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 31 + 7);
  const std::uint32_t whole = crc32c(buf.data(), buf.size());
  const std::uint32_t parts = crc32c(buf.data() + 3333, buf.size() - 3333, crc32c(buf.data(), 3333));
  EXPECT_EQ(whole, parts);
}

}  // namespace
}  // namespace strata::zero3
