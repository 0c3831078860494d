// The one scratch-directory helper of the test suites (header only).
//
// Example:
//   test::ScratchDir dir("nvme");                   // empty, named after the running test
//   write_file(dir.file("a.bin"), bytes);           // $STRATA_TEST_TMPDIR/nvme.Suite.Test.<pid>/a.bin
//   Config::parse(doc_with_nvme_path(dir.path()));  // ... and removed, with its contents, at scope exit
//
// ctest sets STRATA_TEST_TMPDIR to <build>/test-tmp; run by hand, a binary uses /tmp.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace strata::test {

// $STRATA_TEST_TMPDIR, or /tmp when it is unset or empty.
inline std::filesystem::path scratch_root() {
  const char* base = std::getenv("STRATA_TEST_TMPDIR");
  return base && *base ? base : "/tmp";
}

// A fresh directory for one test: scratch_root() / <area>.<suite>.<test>.<pid> ('/' of parameterised names
// become '_'), created empty and removed with its contents when the object goes away. Outside a test
// (a static, a program without GoogleTest's main) it is <area>.<pid>. `area` keeps two directories of one
// test apart and says which suite left a directory behind after a crash.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& area) {
    std::string name = area;
    if (const auto* info = ::testing::UnitTest::GetInstance()->current_test_info())
      name += std::string(".") + info->test_suite_name() + "." + info->name();
    for (char& c : name)
      if (c == '/') c = '_';
    path_ = (scratch_root() / (name + "." + std::to_string(::getpid()))).string();
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace strata::test
