// A checkpoint whose checksums match but whose contents are malformed — what a faulty writer, another
// program or a hand edit that recomputed the checksums leaves — is refused with IoError / ConfigError
// naming the file, never with json's exception types (`strata train --load` would print "internal
// error") and never by allocating what a size field claims. The inputs are those fuzz/checkpoint_fuzz
// found (fuzz/corpus/checkpoint/ holds them too).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/common/scratch_dir.h"
#include "zero3/checkpoint.h"
#include "zero3/checksum.h"

namespace strata::zero3 {
namespace {

using strata::test::ScratchDir;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void spill(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}
std::uint64_t get64(const std::string& s, std::size_t at) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + std::size_t(i)]);
  return v;
}
void put32(std::string& s, std::size_t at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) s[at + std::size_t(i)] = char(v >> (8 * i));
}
void put64(std::string& s, std::size_t at, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) s[at + std::size_t(i)] = char(v >> (8 * i));
}

// A one-tensor checkpoint in DIR/t.
class MalformedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    CheckpointWriter w(dir.path(), "t");
    const std::vector<float> a = {1, 2, 3, 4};
    w.add({.name = "chunk0.master", .dtype = "fp32", .bytes = 16}, a.data());
    w.commit({{"step", 1}});
  }
  std::string shard_path() const { return dir.file("t/rank0.shard"); }
  std::string meta_path() const { return dir.file("t/meta.json"); }

  // Replaces the shard's table with `table` (its text as written) and fixes both of the header's
  // checksums, as a faulty writer would have written them.
  void rewrite_table(const std::string& table) {
    std::string s = slurp(shard_path());
    const std::uint64_t toff = get64(s, 24);
    s.resize(toff);
    s += table;
    put64(s, 32, table.size());
    put32(s, 40, crc32c(table.data(), table.size()));
    put32(s, 44, crc32c(s.data(), 44));
    spill(shard_path(), s);
  }
  // Sets the header's table range (offset, bytes) and fixes the header checksum.
  void rewrite_table_range(std::uint64_t offset, std::uint64_t bytes) {
    std::string s = slurp(shard_path());
    put64(s, 24, offset);
    put64(s, 32, bytes);
    put32(s, 44, crc32c(s.data(), 44));
    spill(shard_path(), s);
  }
  // Replaces meta.json with `meta` plus its correct meta_crc32c.
  void rewrite_meta(nlohmann::json meta) {
    meta.erase("meta_crc32c");
    const std::string text = meta.dump();
    meta["meta_crc32c"] = crc32c(text.data(), text.size());
    spill(meta_path(), meta.dump());
  }
  nlohmann::json meta() const { return nlohmann::json::parse(slurp(meta_path())); }

  // The reader refuses with `E`, naming the file at fault.
  template <typename E>
  void expect_refused(const std::string& names) {
    try {
      CheckpointReader r(dir.path());
      FAIL() << "the malformed checkpoint was accepted";
    } catch (const E& e) {
      EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
    }
  }

  ScratchDir dir{"ckmalformed"};
};

TEST_F(MalformedCheckpoint, TheUntouchedCheckpointLoads) {
  CheckpointReader r(dir.path());
  std::vector<float> a(4);
  r.read("chunk0.master", a.data(), 16);
  EXPECT_EQ(a, (std::vector<float>{1, 2, 3, 4}));
}

TEST_F(MalformedCheckpoint, ATableEntryWithoutAFieldIsAnIoError) {
  rewrite_table(R"([{"name":"chunk0.master","dtype":"fp32","bytes":16,"offset":4096}])");  // no crc32c
  expect_refused<IoError>("rank0.shard: tensor table entry 0");
}

TEST_F(MalformedCheckpoint, ATableEntryOfTheWrongTypeIsAnIoError) {
  rewrite_table(R"([{"name":7,"dtype":"fp32","bytes":16,"offset":4096,"crc32c":0}])");
  expect_refused<IoError>("rank0.shard: tensor table entry 0");
  rewrite_table(R"([{"name":"a","dtype":"fp32","bytes":-16,"offset":4096,"crc32c":0}])");
  expect_refused<IoError>("rank0.shard: tensor table entry 0");
  rewrite_table(R"([{"name":"a","dtype":"fp32","bytes":16,"offset":4096,"crc32c":4294967296}])");
  expect_refused<IoError>("rank0.shard: tensor table entry 0");
  rewrite_table(R"([5])");
  expect_refused<IoError>("rank0.shard: tensor table entry 0");
}

TEST_F(MalformedCheckpoint, ATableThatIsNotAJsonArrayIsAnIoError) {
  rewrite_table(R"({"name":"chunk0.master"})");
  expect_refused<IoError>("rank0.shard: the tensor table is not a JSON array");
  rewrite_table("[{\"name\": ");
  expect_refused<IoError>("rank0.shard: the tensor table is not a JSON array");
}

TEST_F(MalformedCheckpoint, ATensorOutsideTheDataAreaIsRefusedOnLoad) {
  rewrite_table(R"([{"name":"a","dtype":"fp32","bytes":16,"offset":18446744073709551615,"crc32c":0}])");
  expect_refused<IoError>("lies outside the file's data area");
  rewrite_table(R"([{"name":"a","dtype":"fp32","bytes":16,"offset":0,"crc32c":0}])");  // over the header
  expect_refused<IoError>("lies outside the file's data area");
}

TEST_F(MalformedCheckpoint, ATableRangeOutsideTheFileIsRefusedBeforeAllocating) {
  rewrite_table_range(8192, std::uint64_t(1) << 32);  // 4 GiB claimed, a few KiB there
  expect_refused<IoError>("outside the");
  rewrite_table_range(std::uint64_t(1) << 62, 16);
  expect_refused<IoError>("outside the");
}

TEST_F(MalformedCheckpoint, MetadataFieldsOfTheWrongTypeAreConfigErrors) {
  nlohmann::json m = meta();
  m["format"] = 3;
  rewrite_meta(m);
  expect_refused<ConfigError>("meta.json is not a Strata checkpoint");
  m = meta();
  m["format"] = kCheckpointFormat;
  m["version"] = "1";
  rewrite_meta(m);
  expect_refused<ConfigError>("meta.json: the checkpoint format version is missing or not a whole number");
  m["version"] = 1e300;  // not converted to int (undefined behaviour), refused
  rewrite_meta(m);
  expect_refused<ConfigError>("meta.json: the checkpoint format version is missing or not a whole number");
}

TEST_F(MalformedCheckpoint, AMissingShardWithAnOddWorldSizeStillNamesTheFile) {
  nlohmann::json m = meta();
  m["world_size"] = "two";
  rewrite_meta(m);
  std::filesystem::remove(shard_path());
  expect_refused<IoError>("cannot open rank0.shard");
}

}  // namespace
}  // namespace strata::zero3
