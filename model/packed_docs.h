// strata/model/packed_docs.h: a token file's document boundaries — the sidecar TOKENFILE.docs saying where
// each packed document starts, so that a training row holding several of them keeps them apart (attention
// within each document only, rotary positions restarting per document: Note [Packed documents]).
// TokenFile::open opens it when it is there.
//
// Example:
//   strata::model::write_token_file("sft.bin", tokens, strata::model::TokenType::u32);
//   strata::model::write_docs_file(strata::model::docs_path("sft.bin"), {0, 120, 385}, tokens.size());
//   auto f = strata::model::TokenFile::open("sft.bin");          // opens sft.bin.docs too
//   if (const strata::model::PackedDocs* d = f.docs()) {
//     std::vector<int32_t> pos(T);
//     d->positions(s * T, T, pos.data());                        // row s's position_ids
//   }
//
// The format (scripts/tokenize_text.py writes it beside the token file when it packs): a header of 256
// little-endian int32 — [0] magic 20261204, [1] version 1, [2] and [3] the token count as a little-endian
// uint64 (low 32 bits in [2], high in [3]), [4] and [5] the document count likewise, the rest 0 — then one
// little-endian uint64 per document: the index of its first token in the token file. The first is 0, each
// is larger than the one before, and all are below the token count.
//
// Note [Packed documents]: the loader's row s is the window of T + 1 tokens from s*T (Note [Samples and
// sharding]); its positions are what transformers' DataCollatorWithFlattening gives each example,
// position_ids restarting at 0 at every document start in the row — and at the row's first token, whose
// document may have begun in the row before (a row is a sample of its own: what came before it is not in
// it). The target of a row's token j is token s*T + 1 + j; where that token starts a document, the target is
// kIgnoreTarget, as DataCollatorWithFlattening sets the first label of every example to -100 (the last
// token of one document does not learn to predict the next document's first). So each document's loss in a
// packed row is its loss alone, and the model runs the mask and positions of kernels/cpu's Note [Document
// masks].
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace strata::model {

inline constexpr std::int32_t kDocsMagic = 20261204;
inline constexpr std::int32_t kDocsVersion = 1;
inline constexpr std::size_t kDocsHeaderInts = 256;

// Where the document boundaries of the token file at `token_path` live: token_path + ".docs".
std::string docs_path(const std::string& token_path);

class PackedDocs {
 public:
  // Reads and checks the sidecar at `path` of the token file `token_path` of `token_count` tokens.
  // ConfigError, naming both files, both token counts and the fix (re-run scripts/tokenize_text.py, or
  // remove the sidecar), when the header's magic or version is not the above, its token count differs
  // from the token file's, the file's size is not the header's document count of offsets, or an offset is
  // out of order or past the tokens (named with its index). IoError when it cannot be read.
  static PackedDocs open(const std::string& path, const std::string& token_path, std::size_t token_count);

  const std::string& path() const { return path_; }
  std::size_t size() const { return starts_.size(); }  // documents
  std::span<const std::uint64_t> starts() const { return starts_; }
  // FNV-1a over the offsets (never 0): tells one sidecar from another in a checkpoint's data position.
  std::uint64_t digest() const { return digest_; }
  // Whether token i starts a document.
  bool starts_at(std::uint64_t i) const;
  // Writes the positions of tokens [begin, begin + n) as a row from `begin` (Note [Packed documents]):
  // pos[j] = begin + j minus the start of its document, or minus begin where that start is before begin.
  // Throws strata::Error when the range is past the tokens.
  void positions(std::uint64_t begin, std::size_t n, std::int32_t* pos) const;
  // The tokens in [begin, begin + n) that start a document.
  std::size_t count(std::uint64_t begin, std::size_t n) const;

 private:
  PackedDocs() = default;
  std::string path_;
  std::vector<std::uint64_t> starts_;  // (documents) increasing, starts_[0] == 0
  std::uint64_t tokens_ = 0, digest_ = 0;
};

// Refuses positions (B, T) that are not packed documents' (kernels/cpu's Note [Document masks]): each must
// be 0 (a document starts) or one more than the one before it in its row, and below T (the rotary
// tables' rows). ConfigError naming `who`, the row and column and what is allowed.
void check_document_positions(const std::int32_t* positions, int B, int T, const char* who);

// Writes the document starts `starts` of a token file of `token_count` tokens in the format above: to
// path + ".tmp", then renamed. ConfigError for starts that do not begin at 0, are not increasing or reach
// token_count; IoError when it cannot write.
void write_docs_file(const std::string& path, std::span<const std::uint64_t> starts,
                     std::uint64_t token_count);

}  // namespace strata::model
