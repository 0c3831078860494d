// A scratch directory for one test: $STRATA_TEST_TMPDIR (or /tmp) / AREA / <suite>.<test>.<pid>, created
// empty and removed when the object goes away. Shared by the test folders (header only).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace strata::test {

class ScratchDir {
 public:
  explicit ScratchDir(const std::string& area) {
    const char* base = std::getenv("STRATA_TEST_TMPDIR");
    std::filesystem::path root = base && *base ? base : "/tmp";
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : area;
    for (char& c : name)
      if (c == '/') c = '_';
    path_ = root / area / (name + "." + std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  std::string str() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace strata::test
