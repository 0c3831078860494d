// Helpers shared by the zero3 tests: a scratch directory under STRATA_TEST_TMPDIR.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace strata::zero3::test {

// A fresh directory for one test, removed when the object goes away.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name) {
    const char* root = std::getenv("STRATA_TEST_TMPDIR");
    std::filesystem::path base = root && *root ? root : std::filesystem::temp_directory_path().string();
    path_ = (base / ("zero3-" + name + "-" + std::to_string(::getpid()))).string();
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& leaf) const { return path_ + "/" + leaf; }

 private:
  std::string path_;
};

}  // namespace strata::zero3::test
