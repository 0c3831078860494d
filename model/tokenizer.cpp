#include "model/tokenizer.h"

#include <cerrno>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "model/token_file.h"

namespace strata::model {

std::vector<uint32_t> ByteTokenizer::encode(std::string_view text) {
  std::vector<uint32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(std::span<const uint32_t> ids) {
  std::string s(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= kVocabSize)
      throw Error(detail::cat("ByteTokenizer::decode: id ", ids[i], " at position ", i,
                              " is not a byte (the byte tokenizer's vocabulary is 0..255)"));
    s[i] = static_cast<char>(ids[i]);
  }
  return s;
}

size_t ByteTokenizer::text_file_to_tokens(const std::string& text_path, const std::string& token_path) {
  std::ifstream in(text_path, std::ios::binary);
  if (!in) detail::throw_sys(__FILE__, __LINE__, "open", errno, "text file " + text_path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) detail::throw_sys(__FILE__, __LINE__, "read", errno, "text file " + text_path);
  std::vector<uint32_t> ids = encode(text);
  write_token_file(token_path, ids, TokenType::u16, true);
  return ids.size();
}

}  // namespace strata::model
