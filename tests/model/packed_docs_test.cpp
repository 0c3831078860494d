// Document boundaries (model/packed_docs.h): the sidecar TOKENFILE.docs read back as written, refused
// naming both files and the fix when it does not go with its token file, applied by the DataLoader as
// positions restarting per document and row and -100 at a document's first token (Note [Packed
// documents]), recorded in the data position, and refused by the model when positions are not documents'.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/data_loader.h"
#include "model/packed_docs.h"
#include "model/token_file.h"
#include "model_test_util.h"

namespace strata::model {
namespace {

constexpr int T = 8;
constexpr std::size_t kTokens = T * 10 + 1;  // 10 samples of T = 8

// Token i is i; documents start at 0, 3, 4, 16 (a row's first token), 20 and 50.
class PackedDocsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.file("packed.bin");
    std::vector<std::uint32_t> t(kTokens);
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = std::uint32_t(i);
    write_token_file(path_, t, TokenType::u32);
  }
  void write_docs() { write_docs_file(docs_path(path_), starts_, kTokens); }
  std::string open_error() {
    try {
      TokenFile::open(path_);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  }
  // Overwrites `bytes` at `offset` of the sidecar.
  void patch(std::size_t offset, const void* bytes, std::size_t n) {
    std::fstream f(docs_path(path_), std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(std::streamoff(offset));
    f.write(static_cast<const char*>(bytes), std::streamsize(n));
  }
  void patch_i32(std::size_t index, std::int32_t v) { patch(index * 4, &v, 4); }
  void patch_start(std::size_t doc, std::uint64_t v) { patch(kDocsHeaderInts * 4 + 8 * doc, &v, 8); }
  void expect_refused(const std::string& says) {
    const std::string m = open_error();
    EXPECT_NE(m.find(says), std::string::npos) << m;
    EXPECT_NE(m.find(path_ + ".docs"), std::string::npos) << m;  // both files named, and the fix
    EXPECT_NE(m.find("token file " + path_), std::string::npos) << m;
    EXPECT_NE(m.find("tokenize_text.py"), std::string::npos) << m;
  }

  test::ScratchDir dir_{"packed-docs"};
  std::string path_;
  std::vector<std::uint64_t> starts_ = {0, 3, 4, 16, 20, 50};
};

TEST_F(PackedDocsTest, WrittenBoundariesReadBack) {
  write_docs();
  const TokenFile f = TokenFile::open(path_);
  ASSERT_NE(f.docs(), nullptr);
  EXPECT_EQ(f.docs()->size(), starts_.size());
  EXPECT_EQ(std::vector<std::uint64_t>(f.docs()->starts().begin(), f.docs()->starts().end()), starts_);
  EXPECT_TRUE(f.docs()->starts_at(4));
  EXPECT_FALSE(f.docs()->starts_at(5));
  EXPECT_EQ(f.docs()->count(3, 14), 3u);  // 3, 4, 16
  // Positions from token 2: 2 (document 0, but the row starts there), 0 (3), 0 (4), 1, 2, ...
  std::vector<std::int32_t> pos(6);
  f.docs()->positions(2, 6, pos.data());
  EXPECT_EQ(pos, (std::vector<std::int32_t>{0, 0, 0, 1, 2, 3}));
  // The header: magic, version, the token count and the document count as little-endian uint64.
  std::ifstream in(docs_path(path_), std::ios::binary);
  std::int32_t head[6];
  in.read(reinterpret_cast<char*>(head), sizeof head);
  EXPECT_EQ(head[0], kDocsMagic);
  EXPECT_EQ(head[1], kDocsVersion);
  EXPECT_EQ(head[2], std::int32_t(kTokens));
  EXPECT_EQ(head[3], 0);
  EXPECT_EQ(head[4], std::int32_t(starts_.size()));
  EXPECT_EQ(head[5], 0);
  EXPECT_EQ(std::filesystem::file_size(docs_path(path_)), kDocsHeaderInts * 4 + 8 * starts_.size());
}

TEST_F(PackedDocsTest, TokenFileWithoutThemReadsAsBefore) {
  const TokenFile f = TokenFile::open(path_);
  EXPECT_EQ(f.docs(), nullptr);
  DataLoader d(f, {.batch_size = 2, .seq_len = T, .shuffle = false});
  const Batch b = d.next();
  EXPECT_TRUE(b.positions.empty());
  EXPECT_EQ(b.counted, 2 * T);
}

TEST_F(PackedDocsTest, LoaderGivesPositionsPerDocumentAndMinus100AtDocumentStarts) {
  write_docs();
  const TokenFile f = TokenFile::open(path_);
  DataLoader d(f, {.batch_size = 3, .seq_len = T, .shuffle = false});
  const Batch b = d.next();  // samples 0, 1, 2: tokens 0..24
  ASSERT_EQ(b.positions.size(), std::size_t(3 * T));
  // Row 0, tokens 0..7: documents from 0, 3, 4. Row 1, tokens 8..15: the document from 4 goes on, but the
  // row starts at 0. Row 2, tokens 16..23: documents from 16 and 20.
  EXPECT_EQ(std::vector<std::int32_t>(b.positions.begin(), b.positions.begin() + T),
            (std::vector<std::int32_t>{0, 1, 2, 0, 0, 1, 2, 3}));
  EXPECT_EQ(std::vector<std::int32_t>(b.positions.begin() + T, b.positions.begin() + 2 * T),
            (std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(std::vector<std::int32_t>(b.positions.begin() + 2 * T, b.positions.end()),
            (std::vector<std::int32_t>{0, 1, 2, 3, 0, 1, 2, 3}));
  // Target j of row s is token s*T + 1 + j: -100 where that token starts a document (3, 4, 16, 20).
  std::vector<std::int32_t> want(3 * T);
  for (int j = 0; j < 3 * T; ++j) {
    const int token = j + 1;
    want[std::size_t(j)] = token == 3 || token == 4 || token == 16 || token == 20 ? kIgnoreTarget : token;
  }
  EXPECT_EQ(b.targets, want);
  EXPECT_EQ(b.counted, 3 * T - 4);
  // The file's counted targets leave out every document start past token 0 within the samples.
  EXPECT_EQ(d.counted_targets(), d.sample_targets() - 5);
}

TEST_F(PackedDocsTest, PositionOfOtherBoundariesIsRefused) {
  write_docs();
  const DataOptions o{.batch_size = 2, .seq_len = T, .seed = 3};
  DataPosition pos;
  {
    const TokenFile f = TokenFile::open(path_);
    DataLoader a(f, o);
    a.next();
    pos = a.position();
    EXPECT_EQ(pos.docs_digest, f.docs()->digest());
    EXPECT_EQ(DataPosition::from_json(pos.to_json()).docs_digest, pos.docs_digest);
    DataLoader same(f, o);
    same.set_position(pos);
  }
  starts_[2] = 5;  // other boundaries, the same count
  write_docs();
  {
    const TokenFile f = TokenFile::open(path_);
    DataLoader b(f, o);
    try {
      b.set_position(pos);
      FAIL() << "a position over other document boundaries was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("document boundaries"), std::string::npos) << e.what();
    }
  }
  std::filesystem::remove(docs_path(path_));
  const TokenFile f = TokenFile::open(path_);
  DataLoader c(f, o);
  EXPECT_THROW(c.set_position(pos), ConfigError);
  nlohmann::json old = c.position().to_json();  // a position saved before the sidecar existed
  old.erase("docs_digest");
  c.set_position(DataPosition::from_json(old));
}

TEST_F(PackedDocsTest, BoundariesOfAnotherFileAreRefusedNamingBothFiles) {
  write_docs_file(docs_path(path_), starts_, kTokens + 5);
  expect_refused("token count differs");
}

TEST_F(PackedDocsTest, BadMagicOrVersionIsRefused) {
  write_docs();
  patch_i32(0, 1234);
  expect_refused("magic 1234");
  write_docs();
  patch_i32(1, 9);
  expect_refused("version 9");
}

TEST_F(PackedDocsTest, TruncatedOrPaddedFileIsRefused) {
  write_docs();
  std::filesystem::resize_file(docs_path(path_), kDocsHeaderInts * 4 + 8 * starts_.size() - 8);
  expect_refused("documents, but");
  std::filesystem::resize_file(docs_path(path_), 100);
  expect_refused("shorter than the 1024-byte header");
}

TEST_F(PackedDocsTest, StartsOutOfOrderOrPastTheTokensAreRefusedByIndex) {
  write_docs();
  patch_start(3, 4);
  expect_refused("document 3 starts at token 4, not after document 2's start 4");
  write_docs();
  patch_start(0, 1);
  expect_refused("document 0 starts at token 1");
  write_docs();
  patch_start(5, kTokens);
  expect_refused("document 5 starts at token 81, past the file's last token 80");
  EXPECT_THROW(write_docs_file(dir_.file("bad.docs"), std::vector<std::uint64_t>{0, 2, 2}, 10), ConfigError);
  EXPECT_THROW(write_docs_file(dir_.file("bad.docs"), std::vector<std::uint64_t>{1}, 10), ConfigError);
}

TEST(DocumentPositions, ThatAreNotDocumentsAreRefusedNamingWhere) {
  const std::vector<std::int32_t> good = {0, 1, 2, 0, 1, 0, 0, 1};
  EXPECT_NO_THROW(check_document_positions(good.data(), 2, 4, "test"));
  const auto refused = [](std::vector<std::int32_t> pos, const std::string& says) {
    try {
      check_document_positions(pos.data(), 2, 4, "test");
      ADD_FAILURE() << "accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused({0, 1, 3, 0, 0, 1, 2, 3}, "position_ids[0, 2] is 3 after 1");
  refused({0, 1, 2, 3, 0, 1, 2, 4}, "position_ids[1, 3] is 4 after 2");
  refused({0, 1, 2, 3, -1, 0, 1, 2}, "position_ids[1, 0] is -1");
  refused({4, 5, 6, 7, 0, 1, 2, 3}, "position_ids[0, 0] is 4");  // past the rotary tables' T rows
}

}  // namespace
}  // namespace strata::model
