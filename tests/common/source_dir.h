// The one place the test suites find the data files they read: config fixtures, configs/, docs/,
// tests/reference/data (header only).
//
// Example:
//   std::ifstream in(test::source_path("configs/demo_cpu.json"));
//
// The data root is, first found wins:
//   1. $STRATA_SOURCE_DIR, when set and not empty;
//   2. src/ beside the folder the test binary is in (bin/test_x -> ../src), when it holds configs/: the
//      layout of the GPU bundle (scripts/gpu-bundle.sh), which is unpacked anywhere;
//   3. the source tree the binary was built from (STRATA_SOURCE_DIR, compiled in by the test's CMakeLists).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#ifndef STRATA_SOURCE_DIR
#error "define STRATA_SOURCE_DIR for this test target (target_compile_definitions in its CMakeLists.txt)"
#endif

namespace strata::test {

// The folder of the running executable (/proc/self/exe), or "" when it cannot be read.
inline std::filesystem::path executable_dir() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path() : exe.parent_path();
}

// The data root, resolved once per process (see the top of this file).
inline const std::string& source_dir() {
  static const std::string root = [] {
    if (const char* env = std::getenv("STRATA_SOURCE_DIR"); env && *env) return std::string(env);
    if (const std::filesystem::path dir = executable_dir(); !dir.empty()) {
      const std::filesystem::path bundled = dir.parent_path() / "src";
      std::error_code ec;
      if (std::filesystem::is_directory(bundled / "configs", ec)) return bundled.string();
    }
    return std::string(STRATA_SOURCE_DIR);
  }();
  return root;
}

// source_dir() / rel, e.g. source_path("tests/config/fixtures/a.json").
inline std::string source_path(const std::string& rel) {
  return source_dir() + "/" + rel;
}

}  // namespace strata::test
