// Token files (flat and llm.c headers), the byte tokenizer, and DistributedSampler-style batching.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "core/error.h"
#include "model/data_loader.h"
#include "model/token_file.h"
#include "model/tokenizer.h"
#include "model_test_util.h"

namespace strata::model {
namespace {

std::vector<uint32_t> iota_tokens(size_t n, uint32_t mod) {
  std::vector<uint32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = uint32_t((i * 2654435761u) % mod);
  return t;
}

void write_bytes(const std::string& path, const void* data, size_t n) {
  std::ofstream(path, std::ios::binary).write(static_cast<const char*>(data), std::streamsize(n));
}

struct FileCase {
  TokenType type;
  bool header;
};

class TokenFileTest : public ::testing::TestWithParam<FileCase> {};

TEST_P(TokenFileTest, WrittenTokensReadBackExactly) {
  const auto [type, header] = GetParam();
  std::vector<uint32_t> tokens = iota_tokens(1001, type == TokenType::u16 ? 65536u : 4000000000u);
  test::ScratchDir dir("model");
  std::string path = dir.file("tokens.bin");
  write_token_file(path, tokens, type, header);
  TokenFile f = TokenFile::open(path, type);
  EXPECT_EQ(f.has_llmc_header(), header);
  EXPECT_EQ(f.type(), type);
  ASSERT_EQ(f.size(), tokens.size());
  std::vector<int32_t> got(tokens.size());
  f.read(0, tokens.size(), got.data());
  for (size_t i = 0; i < tokens.size(); ++i) ASSERT_EQ(uint32_t(got[i]), tokens[i]) << i;
  EXPECT_EQ(f.at(1000), tokens[1000]);
  EXPECT_THROW(f.read(1000, 2, got.data()), Error);
}

INSTANTIATE_TEST_SUITE_P(Formats, TokenFileTest,
                         ::testing::Values(FileCase{TokenType::u16, true}, FileCase{TokenType::u16, false},
                                           FileCase{TokenType::u32, true}, FileCase{TokenType::u32, false}),
                         [](const auto& info) {
                           return std::string(info.param.type == TokenType::u16 ? "u16" : "u32") +
                                  (info.param.header ? "_llmc_header" : "_flat");
                         });

// A file laid out by hand as llm.c's writer does: 256 int32 header (magic, version, count), uint16 tokens.
TEST(TokenFile, ReadsAnLlmcFileWrittenByHand) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520, header[1] = 1, header[2] = 3;
  std::vector<uint16_t> toks = {50256, 7, 65535};
  test::ScratchDir dir("model");
  std::string path = dir.file("llmc_by_hand.bin");
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
    out.write(reinterpret_cast<const char*>(toks.data()), 6);
  }
  TokenFile f = TokenFile::open(path, TokenType::u32);  // the header wins over the flat type
  EXPECT_TRUE(f.has_llmc_header());
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f.at(0), 50256u);
  EXPECT_EQ(f.at(2), 65535u);
}

TEST(TokenFile, BadFilesAreRejectedNamingThePath) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520, header[1] = 1, header[2] = 10;  // claims 10 tokens, holds 2
  std::vector<uint16_t> toks = {1, 2};
  test::ScratchDir dir("model");
  std::string path = dir.file("llmc_truncated.bin");
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
    out.write(reinterpret_cast<const char*>(toks.data()), 4);
  }
  try {
    TokenFile::open(path);
    FAIL() << "no throw";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("header says 10 tokens"), std::string::npos) << e.what();
  }
  header[1] = 3;  // unknown version
  write_bytes(path, header.data(), 1024);
  EXPECT_THROW(TokenFile::open(path), ConfigError);

  std::string odd = dir.file("odd.bin");
  write_bytes(odd, "abc", 3);
  EXPECT_THROW(TokenFile::open(odd, TokenType::u16), ConfigError);
  EXPECT_THROW(TokenFile::open(dir.file("does_not_exist.bin")), IoError);
  std::vector<uint32_t> big = {70000};
  EXPECT_THROW(write_token_file(dir.file("big.bin"), big, TokenType::u16), ConfigError);
}

TEST(ByteTokenizer, AnyBytesRoundTrip) {
  std::string text = "héllo, wörld\n";
  text.push_back('\0');
  text.push_back(char(0xFF));
  std::vector<uint32_t> ids = ByteTokenizer::encode(text);
  ASSERT_EQ(ids.size(), text.size());
  EXPECT_EQ(ids[0], uint32_t('h'));
  EXPECT_EQ(ids.back(), 255u);
  EXPECT_EQ(ByteTokenizer::decode(ids), text);
  std::vector<uint32_t> bad = {65, 256};
  EXPECT_THROW(ByteTokenizer::decode(bad), Error);
}

TEST(ByteTokenizer, TextFileBecomesAnLlmcTokenFile) {
  test::ScratchDir dir("model");
  std::string txt = dir.file("tok.txt"), bin = dir.file("tok.bin");
  std::string text = testing::grammar_text(5000, 1);
  write_bytes(txt, text.data(), text.size());
  EXPECT_EQ(ByteTokenizer::text_file_to_tokens(txt, bin), text.size());
  TokenFile f = TokenFile::open(bin);
  EXPECT_TRUE(f.has_llmc_header());
  std::vector<int32_t> got(f.size());
  f.read(0, f.size(), got.data());
  std::vector<uint32_t> ids(got.begin(), got.end());
  EXPECT_EQ(ByteTokenizer::decode(ids), text);
}

// A token file whose token i is i (mod 65536): a sample's first input token is sample_id * T.
class SamplerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.file("sampler.bin");
    std::vector<uint32_t> t(n_tokens_);
    for (size_t i = 0; i < t.size(); ++i) t[i] = uint32_t(i);
    write_token_file(path_, t, TokenType::u32);
  }
  test::ScratchDir dir_{"model"};
  std::string path_;
  size_t n_tokens_ = 8 * 37 + 1;  // 37 samples of T = 8
};

TEST_F(SamplerTest, BatchesAreConsecutiveWindowsOfTheirSamples) {
  TokenFile f = TokenFile::open(path_);
  DataLoader dl(f, {.batch_size = 4, .seq_len = 8, .seed = 1});
  EXPECT_EQ(dl.num_samples(), 37);
  Batch b = dl.next();
  ASSERT_EQ(b.rows, 4);
  for (int r = 0; r < b.rows; ++r)
    for (int t = 0; t < 8; ++t) {
      EXPECT_EQ(b.inputs[size_t(r) * 8 + t], b.sample_ids[size_t(r)] * 8 + t);
      EXPECT_EQ(b.targets[size_t(r) * 8 + t], b.sample_ids[size_t(r)] * 8 + t + 1);
    }
}

TEST_F(SamplerTest, EveryRankSeesItsShareAndTogetherEverySampleOncePerEpoch) {
  TokenFile f = TokenFile::open(path_);
  for (int world : {1, 2, 4, 5}) {
    std::map<int64_t, int> seen;
    int64_t total = 0;
    for (int rank = 0; rank < world; ++rank) {
      DataLoader dl(f, {.batch_size = 3, .seq_len = 8, .rank = rank, .world = world, .seed = 7});
      EXPECT_EQ(dl.samples_per_rank(), (37 + world - 1) / world);
      for (int64_t b = 0; b < dl.batches_per_epoch(); ++b) {
        Batch batch = dl.next();
        EXPECT_EQ(batch.epoch, 0);
        for (int64_t s : batch.sample_ids) ++seen[s], ++total;
      }
    }
    // Padded by wrap-around to ceil(37 / world) * world, as DistributedSampler does.
    EXPECT_EQ(total, (37 + world - 1) / world * world) << "world " << world;
    EXPECT_EQ(seen.size(), 37u) << "world " << world;
    int repeats = 0;
    for (const auto& [s, n] : seen) repeats += n - 1;
    EXPECT_EQ(repeats, total - 37) << "world " << world;
  }
}

TEST_F(SamplerTest, RanksShareOnePermutationDealtRoundRobin) {
  TokenFile f = TokenFile::open(path_);
  const int world = 4;
  DataLoader r0(f, {.batch_size = 1, .seq_len = 8, .rank = 0, .world = world, .seed = 11});
  std::vector<std::vector<int64_t>> per_rank;
  for (int r = 0; r < world; ++r) {
    DataLoader dl(f, {.batch_size = 1, .seq_len = 8, .rank = r, .world = world, .seed = 11});
    per_rank.push_back(dl.epoch_samples(2));
  }
  // Interleave the ranks' lists: the first 37 entries are a permutation of all samples, the rest wrap to
  // its beginning.
  std::vector<int64_t> merged;
  for (size_t i = 0; i < per_rank[0].size(); ++i)
    for (int r = 0; r < world; ++r) merged.push_back(per_rank[size_t(r)][i]);
  std::vector<int64_t> perm(merged.begin(), merged.begin() + 37), sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 37; ++i) ASSERT_EQ(sorted[size_t(i)], i);
  for (size_t i = 37; i < merged.size(); ++i) EXPECT_EQ(merged[i], perm[i - 37]);
}

TEST_F(SamplerTest, RankSamplesIsTheLoadersOrder) {
  TokenFile f = TokenFile::open(path_);
  for (bool drop_last : {false, true})
    for (int r = 0; r < 3; ++r) {
      DataLoader dl(
          f, {.batch_size = 2, .seq_len = 8, .rank = r, .world = 3, .seed = 9, .drop_last = drop_last});
      for (int64_t e : {0, 4})
        EXPECT_EQ(rank_samples(dl.num_samples(), r, 3, 9, e, /*shuffle=*/true, drop_last),
                  dl.epoch_samples(e));
    }
}

TEST_F(SamplerTest, RankSamplesRefusesBadArguments) {
  EXPECT_THROW(rank_samples(10, 2, 2, 0, 0, true, false), ConfigError);   // rank outside [0, world)
  EXPECT_THROW(rank_samples(10, 0, 0, 0, 0, true, false), ConfigError);   // world 0
  EXPECT_THROW(rank_samples(10, 0, 1, 0, -1, true, false), ConfigError);  // negative epoch
  EXPECT_THROW(rank_samples(1, 0, 2, 0, 0, true, true), ConfigError);     // drop_last leaves none
}

TEST_F(SamplerTest, ShuffleDependsOnSeedAndEpochOnly) {
  TokenFile f = TokenFile::open(path_);
  DataLoader a(f, {.batch_size = 2, .seq_len = 8, .seed = 5}),
      b(f, {.batch_size = 7, .seq_len = 8, .seed = 5});
  DataLoader c(f, {.batch_size = 2, .seq_len = 8, .seed = 6});
  EXPECT_EQ(a.epoch_samples(0), b.epoch_samples(0));
  EXPECT_NE(a.epoch_samples(0), a.epoch_samples(1));
  EXPECT_NE(a.epoch_samples(0), c.epoch_samples(0));
  DataLoader ordered(f, {.batch_size = 2, .seq_len = 8, .shuffle = false});
  std::vector<int64_t> in_order(37);
  std::iota(in_order.begin(), in_order.end(), 0);
  EXPECT_EQ(ordered.epoch_samples(3), in_order);
}

TEST_F(SamplerTest, DropLastTruncatesToAMultipleOfWorld) {
  TokenFile f = TokenFile::open(path_);
  std::set<int64_t> seen;
  for (int rank = 0; rank < 4; ++rank) {
    DataLoader dl(f,
                  {.batch_size = 100, .seq_len = 8, .rank = rank, .world = 4, .seed = 2, .drop_last = true});
    EXPECT_EQ(dl.samples_per_rank(), 9);
    for (int64_t s : dl.epoch_samples(0)) EXPECT_TRUE(seen.insert(s).second) << "sample " << s << " twice";
  }
  EXPECT_EQ(seen.size(), 36u);
}

TEST_F(SamplerTest, LastBatchIsShortUnlessDropped) {
  TokenFile f = TokenFile::open(path_);
  DataLoader keep(f, {.batch_size = 10, .seq_len = 8, .seed = 1});
  EXPECT_EQ(keep.batches_per_epoch(), 4);
  std::vector<int> rows;
  for (int i = 0; i < 5; ++i) rows.push_back(keep.next().rows);
  EXPECT_EQ(rows, (std::vector<int>{10, 10, 10, 7, 10}));
  DataLoader drop(f, {.batch_size = 10, .seq_len = 8, .seed = 1, .drop_last_batch = true});
  EXPECT_EQ(drop.batches_per_epoch(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(drop.next().epoch, 0);
  Batch b = drop.next();
  EXPECT_EQ(b.epoch, 1);
  EXPECT_EQ(b.rows, 10);
}

// set_epoch(e) starts epoch e on every rank: its first batch is the head of that epoch's list, and the
// batches after it are those of a loader that ran through the epochs before.
TEST_F(SamplerTest, SetEpochStartsThatEpochsBatchesOnEveryRank) {
  TokenFile f = TokenFile::open(path_);
  for (int rank = 0; rank < 3; ++rank) {
    const DataOptions o{.batch_size = 4, .seq_len = 8, .rank = rank, .world = 3, .seed = 5};
    DataLoader ran(f, o), jumped(f, o);
    while (ran.next().epoch < 2) {
    }  // consumed epoch 2's first batch
    const std::vector<int64_t> second = ran.next().sample_ids;
    const std::vector<int64_t> order = ran.epoch_samples(2);
    jumped.next();  // part-way through epoch 0
    jumped.set_epoch(2);
    EXPECT_EQ(jumped.next().sample_ids, std::vector<int64_t>(order.begin(), order.begin() + 4))
        << "rank " << rank;
    EXPECT_EQ(jumped.position().epoch, 2);
    EXPECT_EQ(jumped.next().sample_ids, second) << "rank " << rank;
  }
  DataLoader dl(f, {.batch_size = 4, .seq_len = 8, .seed = 5});
  EXPECT_THROW(dl.set_epoch(-1), ConfigError);
}

TEST_F(SamplerTest, RestoredPositionContinuesWithTheSameBatches) {
  TokenFile f = TokenFile::open(path_);
  DataOptions o{.batch_size = 5, .seq_len = 8, .rank = 1, .world = 2, .seed = 9};
  DataLoader a(f, o);
  for (int i = 0; i < 6; ++i) a.next();  // crosses into epoch 1 (19 samples per rank, 4 batches)
  nlohmann::json saved = a.position().to_json();
  std::vector<std::vector<int64_t>> want;
  for (int i = 0; i < 7; ++i) want.push_back(a.next().sample_ids);
  DataLoader b(f, o);
  b.set_position(DataPosition::from_json(saved));
  for (int i = 0; i < 7; ++i) EXPECT_EQ(b.next().sample_ids, want[size_t(i)]) << "batch " << i;

  DataLoader other_seed(f, {.batch_size = 5, .seq_len = 8, .rank = 1, .world = 2, .seed = 10});
  EXPECT_THROW(other_seed.set_position(DataPosition::from_json(saved)), ConfigError);
  EXPECT_THROW(DataPosition::from_json(nlohmann::json{{"seed", 1}}), ConfigError);
}

// Found when the loader is made (the whole file is scanned), not at the batch that holds the token.
TEST_F(SamplerTest, TokensOutsideTheVocabularyAreReportedBeforeAnyBatch) {
  TokenFile f = TokenFile::open(path_);
  try {
    DataLoader dl(f, {.batch_size = 2, .seq_len = 8, .seed = 1, .vocab_size = 100});
    FAIL() << "no throw";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("token 100 is 100, outside the model's vocabulary of 100"),
              std::string::npos)
        << e.what();
  }
}

// A position saved over one token file is refused over another (other length, or same length and other
// tokens), naming both.
TEST_F(SamplerTest, APositionOfAnotherTokenFileIsRefused) {
  TokenFile f = TokenFile::open(path_);
  const DataOptions o{.batch_size = 4, .seq_len = 8, .seed = 2};
  DataLoader a(f, o);
  a.next();
  const DataPosition pos = a.position();
  std::vector<uint32_t> t(n_tokens_);
  for (size_t i = 0; i < t.size(); ++i) t[i] = uint32_t(i ^ 1);  // the same length, other tokens
  const std::string other = dir_.file("sampler-other.bin");
  write_token_file(other, t, TokenType::u32);
  TokenFile g = TokenFile::open(other);
  DataLoader b(g, o);
  try {
    b.set_position(pos);
    FAIL() << "a position of another file was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("saved over another token file"), std::string::npos) << e.what();
  }
  DataLoader same(f, o);
  same.set_position(pos);  // the same file: accepted
  EXPECT_EQ(same.next().sample_ids, a.next().sample_ids);
}

TEST_F(SamplerTest, TooLittleDataIsAConfigError) {
  TokenFile f = TokenFile::open(path_);
  EXPECT_THROW(DataLoader(f, {.batch_size = 1, .seq_len = 1000}), ConfigError);
  EXPECT_THROW(DataLoader(f, {.batch_size = 1, .seq_len = 8, .rank = 2, .world = 2}), ConfigError);
}

}  // namespace
}  // namespace strata::model
