// strata/model/tokenizer.h: a byte-level tokenizer — token id = byte value, vocabulary 256.
//
// Example:
//   auto ids = strata::model::ByteTokenizer::encode("hello");          // {104, 101, 108, 108, 111}
//   strata::model::ByteTokenizer::text_file_to_tokens("book.txt", "book.bin");  // llm.c .bin, uint16
//   std::string back = strata::model::ByteTokenizer::decode(ids);
//
// Any text (any bytes, UTF-8 or not) round-trips exactly. Use it with a model whose vocab_size >= 256
// (the tiny and 10m presets).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace strata::model {

struct ByteTokenizer {
  static constexpr int64_t kVocabSize = 256;

  static std::vector<uint32_t> encode(std::string_view text);
  // Throws strata::Error naming the position when an id is not a byte (>= 256).
  static std::string decode(std::span<const uint32_t> ids);
  // Reads `text_path` whole and writes its bytes as an llm.c uint16 token file; returns the token count.
  // Throws IoError naming the path that failed.
  static size_t text_file_to_tokens(const std::string& text_path, const std::string& token_path);
};

}  // namespace strata::model
