#include <gtest/gtest.h>
#include <cerrno>

#include "core/error.h"
#include "core/log.h"

namespace strata {

TEST(CheckMacro, ReportsFileLineStatementAndDetail) {
  try {
    int align = 4096;
    STRATA_CHECK(align == 512, "alignment is ", align);
    FAIL() << "no throw";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("error_test.cpp:"), std::string::npos) << m;
    EXPECT_NE(m.find("`align == 512`"), std::string::npos) << m;
    EXPECT_NE(m.find("alignment is 4096"), std::string::npos) << m;
  }
}

TEST(SysCheckMacro, RaisesIoErrorWithErrnoText) {
  errno = ENOENT;
  try {
    STRATA_SYS_CHECK(false, "open /nonexistent");
    FAIL() << "no throw";
  } catch (const IoError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("open /nonexistent"), std::string::npos) << m;
    EXPECT_NE(m.find("No such file or directory"), std::string::npos) << m;
  }
}

TEST(LogLevel, ParsesKnownNamesAndRejectsOthersNamingTheAllowedValues) {
  EXPECT_EQ(log::parse_level("debug"), log::Level::debug);
  EXPECT_EQ(log::parse_level("error"), log::Level::error);
  try {
    log::parse_level("loud");
    FAIL() << "no throw";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("debug, info, warn, error"), std::string::npos);
  }
}

TEST(FormatBytes, UsesBinaryUnitsAndKeepsExactCount) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536ull << 20), "1.50 GiB (1610612736 bytes)");
}

}  // namespace strata
