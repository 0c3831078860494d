// Fuzzes the token-file reader (model/token_file.h): TokenFile::open on the input as a flat uint16 and as
// a flat uint32 file (an llm.c header, when the input starts with one, decides for itself), every token
// read back, and a DataLoader over it with a vocabulary check, as `strata train --data` does.
//
// Input: the file's bytes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "model/data_loader.h"
#include "model/token_file.h"

namespace {

using namespace strata::model;

constexpr std::string_view kTarget = "token_file";

void run(const std::string& path, TokenType flat) {
  TokenFile f = TokenFile::open(path, flat);
  if (f.size() == 0) strata::fuzz::fail(kTarget, "open() accepted a file with no tokens");
  const std::size_t n = std::min<std::size_t>(f.size(), 4096);
  std::vector<std::int32_t> window(n);
  f.read(0, n, window.data());
  for (std::size_t i = 0; i < n; ++i)
    if (std::uint32_t(window[i]) != f.at(i)) strata::fuzz::fail(kTarget, "read() and at() disagree");
  f.read(f.size() - 1, 1, window.data());
  const TokenFile::Scan s = f.scan(256);
  if (s.first_at_or_above > f.size()) strata::fuzz::fail(kTarget, "scan() points past the end");
  // Reading past the end must be refused, not done.
  try {
    f.read(f.size(), 1, window.data());
    strata::fuzz::fail(kTarget, "read() past the end was not refused");
  } catch (const strata::Error&) {
  }
  DataLoader loader(f, {.batch_size = 2, .seq_len = 4, .seed = 7, .vocab_size = 256});
  for (int i = 0; i < 3; ++i) {
    Batch b = loader.next();
    for (std::int32_t t : b.inputs)
      if (t < 0 || t >= 256)
        strata::fuzz::fail(kTarget, "the loader returned a token outside the vocabulary");
  }
  loader.set_position(loader.position());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = strata::fuzz::write_input("tokens.bin", data, size);
  strata::fuzz::expect_strata_errors(kTarget, [&] { run(path, TokenType::u16); });
  strata::fuzz::expect_strata_errors(kTarget, [&] { run(path, TokenType::u32); });
  return 0;
}
