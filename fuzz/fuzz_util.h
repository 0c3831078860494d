// strata/fuzz/fuzz_util.h: what the libFuzzer targets under fuzz/ share.
//
// Example (one target, fuzz/token_file_fuzz.cpp):
//   extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
//     const std::string path = strata::fuzz::write_input("tokens.bin", data, size);
//     strata::fuzz::expect_strata_errors("token_file", [&] { strata::model::TokenFile::open(path); });
//     return 0;
//   }
//
// The readers under test take paths, so each input is written to a scratch directory first (under
// /dev/shm when there is one: no disk I/O per input). The contract checked is the project's: a damaged
// or hostile file makes the reader throw a strata::Error subclass (ConfigError, IoError) whose message
// names the file. Anything else is a finding: a crash, a sanitizer report, an exception of another type
// (the user would see "internal error: [json.exception...]"), or a broken invariant the target asserts
// with strata::fuzz::fail().
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <typeinfo>

#include "core/error.h"
#include "core/log.h"

namespace strata::fuzz {

// A broken invariant: print it and abort, so libFuzzer saves the input as a crash.
[[noreturn]] inline void fail(std::string_view target, std::string_view what) {
  std::fprintf(stderr, "fuzz %.*s: %.*s\n", int(target.size()), target.data(), int(what.size()), what.data());
  std::fflush(stderr);
  std::abort();
}

// This process's scratch directory, created on first use and removed at exit.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    std::string base = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
    if (const char* t = std::getenv("STRATA_FUZZ_TMPDIR"); t && *t) base = t;
    std::string templ = base + "/strata-fuzz-XXXXXX";
    if (!::mkdtemp(templ.data())) fail("setup", "cannot create a scratch directory under " + base);
    // Warnings about damaged inputs are expected by the thousand; keep the fuzzer's output readable.
    strata::log::set_level(strata::log::Level::error);
    static const std::string copy = templ;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(copy, ec);
    });
    return templ;
  }();
  return dir;
}

// Writes bytes to `rel` (a path under the scratch directory, parent folders created) and returns the
// full path.
inline std::string write_file(const std::string& rel, const void* data, std::size_t size) {
  const std::filesystem::path path = std::filesystem::path(scratch_dir()) / rel;
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), std::streamsize(size));
  out.close();
  if (!out) fail("setup", "cannot write " + path.string());
  return path.string();
}
inline std::string write_input(const std::string& rel, const std::uint8_t* data, std::size_t size) {
  return write_file(rel, data, size);
}

// Runs `body`; a strata::Error is the expected way to refuse bad input, any other exception a finding.
template <typename F>
void expect_strata_errors(std::string_view target, F&& body) {
  try {
    body();
  } catch (const strata::Error&) {
    // Refused with the project's error type: fine.
  } catch (const std::exception& e) {
    fail(target,
         std::string("unexpected exception ") + typeid(e).name() + " (not a strata::Error): " + e.what());
  }
}

}  // namespace strata::fuzz
