// strata/model/loss_mask.h: a token file's loss mask — the sidecar TOKENFILE.mask saying, token by token,
// whether the token counts when it is a target (supervised fine-tuning: a prompt's tokens do not, its
// answer's do). Read through a read-only memory map; TokenFile::open opens it when it is there.
//
// Example:
//   strata::model::write_token_file("sft.bin", tokens, strata::model::TokenType::u32);
//   strata::model::write_mask_file(strata::model::mask_path("sft.bin"), mask);  // one 0/1 byte per token
//   auto f = strata::model::TokenFile::open("sft.bin");                        // opens sft.bin.mask too
//   if (const strata::model::LossMask* m = f.mask())
//     std::printf("%zu of %zu tokens count\n", m->counted(), m->size());
//
// The format (scripts/tokenize_text.py writes it beside the token file): a header of 256 little-endian
// int32 — [0] magic 20261127, [1] version 1, [2] and [3] the token count as a little-endian uint64 (low 32
// bits in [2], high in [3]), the rest 0 — then one byte per token of the token file: 1 = the token counts
// when it is a target, 0 = it does not. A target that does not count is given to the model as -100
// (kIgnoreTarget), which the cross-entropy leaves out of its mean (transformers' labels = -100).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace strata::model {

inline constexpr std::int32_t kMaskMagic = 20261127;
inline constexpr std::int32_t kMaskVersion = 1;
inline constexpr std::size_t kMaskHeaderInts = 256;
// The target the model leaves out of the loss (any negative target is; this is transformers' value).
inline constexpr std::int32_t kIgnoreTarget = -100;

// Where the mask of the token file at `token_path` lives: token_path + ".mask".
std::string mask_path(const std::string& token_path);

class LossMask {
 public:
  // Opens and checks the mask at `path` of the token file `token_path` of `token_count` tokens, in one
  // pass over its bytes (counting the ones and taking the digest). ConfigError, naming both files, both
  // token counts and the fix (re-run scripts/tokenize_text.py, or remove the mask), when the header's magic
  // or version is not the above, the header's count or the file's size differs from the token file's
  // count, or a byte is neither 0 nor 1 (named with its position). IoError when it cannot be opened or
  // mapped.
  static LossMask open(const std::string& path, const std::string& token_path, std::size_t token_count);

  LossMask(LossMask&& o) noexcept;
  LossMask& operator=(LossMask&& o) noexcept;
  LossMask(const LossMask&) = delete;
  LossMask& operator=(const LossMask&) = delete;
  ~LossMask();

  const std::string& path() const { return path_; }
  std::size_t size() const { return count_; }       // bytes, = the token file's tokens
  std::size_t counted() const { return counted_; }  // bytes that are 1, over the whole file
  // FNV-1a over the bytes (never 0): tells one mask from another in a checkpoint's data position.
  std::uint64_t digest() const { return digest_; }
  bool counts(std::size_t i) const;  // token i counts when it is a target; i < size()
  // The bytes [begin, begin + n) that are 1; throws strata::Error when the range is out of bounds.
  std::size_t count(std::size_t begin, std::size_t n) const;
  const std::uint8_t* bytes() const { return bytes_; }  // (size()) 0 or 1 each

 private:
  LossMask() = default;
  std::string path_;
  void* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  const std::uint8_t* bytes_ = nullptr;  // (count_) into map_, past the header
  std::size_t count_ = 0, counted_ = 0;
  std::uint64_t digest_ = 0;
};

// Writes `mask` (one byte per token, each 0 or 1) in the format above: to path + ".tmp", then renamed, so
// that a reader never sees half a file. ConfigError for a byte other than 0 or 1; IoError when it cannot
// write.
void write_mask_file(const std::string& path, std::span<const std::uint8_t> mask);

}  // namespace strata::model
