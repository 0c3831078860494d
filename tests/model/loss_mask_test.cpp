// Loss masks (model/loss_mask.h): the sidecar TOKENFILE.mask read back as written, refused naming both files
// and both counts when it does not go with its token file, applied by the DataLoader as -100 targets
// (Note [Loss mask in batches]) and recorded in the data position; a token file without one reads as before.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/data_loader.h"
#include "model/loss_mask.h"
#include "model/token_file.h"
#include "model_test_util.h"

namespace strata::model {
namespace {

constexpr int T = 8;
constexpr std::size_t kTokens = T * 37 + 1;  // 37 samples of T = 8

// Token i is i, and mask byte i is 1 unless i % 3 == 0 (so every row has some of each).
class LossMaskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.file("sft.bin");
    std::vector<std::uint32_t> t(kTokens);
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = std::uint32_t(i);
    write_token_file(path_, t, TokenType::u32);
    mask_.resize(kTokens);
    for (std::size_t i = 0; i < kTokens; ++i) mask_[i] = i % 3 == 0 ? 0 : 1;
  }
  void write_mask() { write_mask_file(mask_path(path_), mask_); }
  // The ConfigError opening the token file gives (empty when it opens).
  std::string open_error() {
    try {
      TokenFile::open(path_);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  }
  // Overwrites int32 `index` of the mask's header.
  void patch_header(std::size_t index, std::int32_t value) {
    std::fstream f(mask_path(path_), std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(std::streamoff(index * 4));
    f.write(reinterpret_cast<const char*>(&value), 4);
  }

  test::ScratchDir dir_{"loss-mask"};
  std::string path_;
  std::vector<std::uint8_t> mask_;
};

TEST_F(LossMaskTest, WrittenMaskReadsBackWithItsCount) {
  write_mask();
  const TokenFile f = TokenFile::open(path_);
  const LossMask* m = f.mask();
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->path(), path_ + ".mask");
  ASSERT_EQ(m->size(), kTokens);
  std::size_t ones = 0;
  for (std::size_t i = 0; i < kTokens; ++i) {
    ASSERT_EQ(m->counts(i), mask_[i] == 1) << i;
    ones += mask_[i];
  }
  EXPECT_EQ(m->counted(), ones);
  EXPECT_EQ(m->count(1, T), std::size_t(std::count(mask_.begin() + 1, mask_.begin() + 1 + T, 1)));
  EXPECT_NE(m->digest(), 0u);
}

// The header by hand, as scripts/tokenize_text.py writes it: magic, version, the count as two uint32 halves.
TEST_F(LossMaskTest, HeaderIsTheFixedFormat) {
  write_mask();
  std::ifstream in(mask_path(path_), std::ios::binary);
  std::vector<std::int32_t> header(256);
  in.read(reinterpret_cast<char*>(header.data()), 1024);
  EXPECT_EQ(header[0], 20261127);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], std::int32_t(kTokens));
  EXPECT_EQ(header[3], 0);
  for (std::size_t i = 4; i < 256; ++i) EXPECT_EQ(header[i], 0) << i;
  std::vector<char> body(kTokens + 1);
  in.read(body.data(), std::streamsize(body.size()));
  EXPECT_EQ(std::size_t(in.gcount()), kTokens);  // one byte per token, nothing after
}

TEST_F(LossMaskTest, TokenFileWithoutMaskReadsAsBefore) {
  const TokenFile f = TokenFile::open(path_);
  EXPECT_EQ(f.mask(), nullptr);
  DataLoader dl(f, {.batch_size = 4, .seq_len = T, .seed = 1});
  const Batch b = dl.next();
  EXPECT_EQ(b.counted, std::int64_t(b.rows) * T);
  for (int r = 0; r < b.rows; ++r)
    for (int t = 0; t < T; ++t)
      EXPECT_EQ(b.targets[std::size_t(r * T + t)], b.sample_ids[std::size_t(r)] * T + t + 1);
  EXPECT_EQ(dl.counted_targets(), dl.sample_targets());
  EXPECT_EQ(dl.position().mask_digest, 0u);
}

// Target j of sample s is token s·T + 1 + j: -100 where that token's byte is 0; inputs untouched.
TEST_F(LossMaskTest, LoaderGivesMinus100WhereTheMaskIsZero) {
  write_mask();
  const TokenFile f = TokenFile::open(path_);
  DataLoader dl(f, {.batch_size = 4, .seq_len = T, .seed = 1});
  for (int k = 0; k < 3; ++k) {
    const Batch b = dl.next();
    std::int64_t counted = 0;
    for (int r = 0; r < b.rows; ++r)
      for (int j = 0; j < T; ++j) {
        const std::int64_t i = b.sample_ids[std::size_t(r)] * T + 1 + j;
        const std::int32_t want = mask_[std::size_t(i)] ? std::int32_t(i) : kIgnoreTarget;
        EXPECT_EQ(b.targets[std::size_t(r * T + j)], want) << "row " << r << " target " << j;
        EXPECT_EQ(b.inputs[std::size_t(r * T + j)], i - 1);
        counted += mask_[std::size_t(i)];
      }
    EXPECT_EQ(b.counted, counted);
    EXPECT_LT(b.counted, std::int64_t(b.rows) * T);
  }
  std::int64_t all = 0;
  for (std::size_t i = 1; i <= std::size_t(dl.sample_targets()); ++i) all += mask_[i];
  EXPECT_EQ(dl.counted_targets(), all);
}

// The mask changes targets only: the samples, their order and the sharding are those without it.
TEST_F(LossMaskTest, SamplesAndShardingDoNotDependOnTheMask) {
  const TokenFile plain = TokenFile::open(path_);
  write_mask();
  const TokenFile masked = TokenFile::open(path_);
  for (int rank : {0, 1, 2}) {
    const DataOptions o{.batch_size = 3, .seq_len = T, .rank = rank, .world = 3, .seed = 5};
    DataLoader a(plain, o), b(masked, o);
    for (int k = 0; k < 6; ++k) {
      const Batch x = a.next(), y = b.next();
      EXPECT_EQ(x.sample_ids, y.sample_ids);
      EXPECT_EQ(x.inputs, y.inputs);
    }
  }
}

TEST_F(LossMaskTest, MaskOfAnotherLengthIsRefusedNamingBothFiles) {
  mask_.pop_back();
  write_mask();
  const std::string e = open_error();
  EXPECT_NE(e.find(path_ + ".mask (header: " + std::to_string(kTokens - 1) + " tokens)"), std::string::npos)
      << e;
  EXPECT_NE(e.find("token file " + path_ + " (" + std::to_string(kTokens) + " tokens)"), std::string::npos)
      << e;
  EXPECT_NE(e.find("scripts/tokenize_text.py"), std::string::npos) << e;
}

// The header's count right but the bytes cut short (a truncated copy): refused too.
TEST_F(LossMaskTest, TruncatedMaskIsRefused) {
  write_mask();
  std::filesystem::resize_file(mask_path(path_), 1024 + kTokens - 5);
  const std::string e = open_error();
  EXPECT_NE(e.find("holds " + std::to_string(kTokens - 5) + " mask bytes"), std::string::npos) << e;
  EXPECT_NE(e.find(path_ + " (" + std::to_string(kTokens) + " tokens)"), std::string::npos) << e;
}

TEST_F(LossMaskTest, BadMagicOrVersionIsRefusedNamingBothFiles) {
  write_mask();
  patch_header(0, 20240520);  // a token file's magic
  std::string e = open_error();
  EXPECT_NE(e.find("magic 20240520 is not a loss mask's (20261127)"), std::string::npos) << e;
  EXPECT_NE(e.find(path_ + ".mask"), std::string::npos) << e;
  EXPECT_NE(e.find("token file " + path_), std::string::npos) << e;
  write_mask();
  patch_header(1, 2);
  e = open_error();
  EXPECT_NE(e.find("version 2"), std::string::npos) << e;
  EXPECT_NE(e.find("scripts/tokenize_text.py"), std::string::npos) << e;
}

// Found in the scan at open, named with its position, before any batch.
TEST_F(LossMaskTest, ByteOtherThanZeroOrOneIsRefused) {
  write_mask();
  {
    std::fstream f(mask_path(path_), std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(1024 + 100);
    f.put(char(2));
  }
  const std::string e = open_error();
  EXPECT_NE(e.find("byte 100 (token 100) is 2"), std::string::npos) << e;
  EXPECT_NE(e.find("token file " + path_), std::string::npos) << e;
  EXPECT_THROW(write_mask_file(dir_.file("bad.mask"), std::vector<std::uint8_t>{0, 1, 7}), ConfigError);
}

// The position records the mask: resuming over another mask, or over none, is refused; the same mask is
// accepted.
TEST_F(LossMaskTest, PositionOfAnotherMaskIsRefused) {
  write_mask();
  const DataOptions o{.batch_size = 4, .seq_len = T, .seed = 2};
  DataPosition pos;
  {
    const TokenFile f = TokenFile::open(path_);
    DataLoader a(f, o);
    a.next();
    pos = a.position();
    EXPECT_EQ(pos.mask_digest, f.mask()->digest());
    EXPECT_EQ(DataPosition::from_json(pos.to_json()).mask_digest, pos.mask_digest);
    DataLoader same(f, o);
    same.set_position(pos);
  }
  mask_[5] ^= 1;  // another mask, the same length
  write_mask();
  {
    const TokenFile f = TokenFile::open(path_);
    DataLoader b(f, o);
    try {
      b.set_position(pos);
      FAIL() << "a position over another mask was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("loss mask"), std::string::npos) << e.what();
    }
  }
  std::filesystem::remove(mask_path(path_));
  const TokenFile f = TokenFile::open(path_);
  DataLoader c(f, o);
  EXPECT_THROW(c.set_position(pos), ConfigError);
  // A position saved before masks existed has no mask_digest: it is one without a mask.
  nlohmann::json old = c.position().to_json();
  old.erase("mask_digest");
  c.set_position(DataPosition::from_json(old));
}

}  // namespace
}  // namespace strata::model
