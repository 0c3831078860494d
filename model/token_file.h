// strata/model/token_file.h: a file of token ids, read through a read-only memory map.
//
// Example:
//   strata::model::write_token_file("train.bin", tokens, strata::model::TokenType::u16);  // llm.c header
//   auto f = strata::model::TokenFile::open("train.bin");
//   std::vector<int32_t> window(f.size());
//   f.read(0, f.size(), window.data());
//   if (const strata::model::LossMask* m = f.mask()) ...     // train.bin.mask, when it is there
//   if (const strata::model::PackedDocs* d = f.docs()) ...   // train.bin.docs, when it is there
//
// Formats accepted by open():
//   - llm.c's .bin: a header of 256 little-endian int32 (magic, version, token count, 0...), then the
//     tokens. magic 20240520 / version 1: uint16 tokens (GPT-2); magic 20240801 / version 7: uint32 tokens
//     (llm.c's Llama-3 files). The token count in the header must match the file size.
//   - otherwise a flat array of little-endian uint16 or uint32 tokens, as `flat_type` says; the file size
//     must be a multiple of the token size.
// Beside either, an optional loss mask: TOKENFILE.mask (model/loss_mask.h), and optional document
// boundaries: TOKENFILE.docs (model/packed_docs.h), each opened and checked by open().
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "model/loss_mask.h"
#include "model/packed_docs.h"

namespace strata::model {

enum class TokenType { u16, u32 };

inline constexpr int32_t kLlmcMagicU16 = 20240520;
inline constexpr int32_t kLlmcVersionU16 = 1;
inline constexpr int32_t kLlmcMagicU32 = 20240801;
inline constexpr int32_t kLlmcVersionU32 = 7;
inline constexpr size_t kLlmcHeaderInts = 256;

class TokenFile {
 public:
  // Throws IoError (cannot open/map) or ConfigError (bad header, size not a multiple of the token size,
  // or no tokens) naming the path. When mask_path(path) exists it is opened too (LossMask::open: a
  // ConfigError when it does not go with this file); without one the file reads as before. So is
  // docs_path(path) (PackedDocs::open).
  static TokenFile open(const std::string& path, TokenType flat_type = TokenType::u16);

  TokenFile(TokenFile&& o) noexcept;
  TokenFile& operator=(TokenFile&& o) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile();

  const std::string& path() const { return path_; }
  size_t size() const { return count_; }  // tokens
  TokenType type() const { return type_; }
  bool has_llmc_header() const { return header_; }
  uint32_t at(size_t i) const;
  // The loss mask beside the file (null: none, every target counts).
  const LossMask* mask() const { return mask_ ? &*mask_ : nullptr; }
  // The document boundaries beside the file (null: none, documents are not kept apart).
  const PackedDocs* docs() const { return docs_ ? &*docs_ : nullptr; }
  // One pass over every token: the index of the first token >= `limit` (size() when none), and a digest
  // of the whole contents (FNV-1a over the token values), which tells one file's tokens from another's.
  struct Scan {
    size_t first_at_or_above = 0;
    uint64_t digest = 0;
  };
  Scan scan(uint64_t limit) const;
  // Copies tokens [begin, begin + count) into dst; throws strata::Error when the range is out of bounds.
  void read(size_t begin, size_t count, int32_t* dst) const;

 private:
  TokenFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const unsigned char* tokens_ = nullptr;
  size_t count_ = 0;
  TokenType type_ = TokenType::u16;
  bool header_ = false;
  std::optional<LossMask> mask_;
  std::optional<PackedDocs> docs_;
};

// Writes `bytes` to path + ".tmp", then renames it to `path`, so that a reader never sees half a file: how
// the token file and its sidecars (loss mask, document boundaries) are written. IoError when it cannot.
void write_file_replacing(const std::string& path, std::span<const unsigned char> bytes);

// Writes `tokens` as `type` (u16 refuses ids above 65535), with llm.c's header by default. Written to
// path + ".tmp" and renamed, so a reader never sees half a file. Throws IoError / ConfigError.
void write_token_file(const std::string& path, std::span<const uint32_t> tokens, TokenType type,
                      bool llmc_header = true);

}  // namespace strata::model
