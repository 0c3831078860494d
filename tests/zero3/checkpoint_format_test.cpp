// The checkpoint directory format: round trip, the latest pointer, atomic replacement, and every kind of
// damage detected on load.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "tests/common/scratch_dir.h"
#include "zero3/checkpoint.h"

namespace strata::zero3 {
namespace {

namespace fs = std::filesystem;
using strata::test::ScratchDir;

std::vector<float> ramp(std::size_t n, float base) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = base + float(i) * 0.5f;
  return v;
}

void save(const std::string& dir, const std::string& tag, float base, std::int64_t step) {
  CheckpointWriter w(dir, tag);
  auto a = ramp(1000, base), b = ramp(5, -base);
  w.add({.name = "chunk0.master", .dtype = "fp32", .bytes = a.size() * 4}, a.data());
  w.add({.name = "chunk1.master", .dtype = "fp32", .bytes = b.size() * 4}, b.data());
  w.commit({{"step", step}, {"client_state", {{"note", "hello"}}}});
}

void flip_byte(const std::string& path, std::uint64_t offset) {
  int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  unsigned char c = 0;
  ASSERT_EQ(::pread(fd, &c, 1, off_t(offset)), 1);
  c ^= 0x40;
  ASSERT_EQ(::pwrite(fd, &c, 1, off_t(offset)), 1);
  ::close(fd);
}

TEST(CheckpointFormat, RoundTripThroughLatest) {
  ScratchDir d("ckfmt-rt");
  save(d.path(), "global_step3", 1.0f, 3);
  EXPECT_EQ(latest_tag(d.path()), "global_step3");
  EXPECT_FALSE(fs::exists(d.file("global_step3.tmp")));
  CheckpointReader r(d.path());
  EXPECT_EQ(r.tag(), "global_step3");
  EXPECT_EQ(r.meta().at("step"), 3);
  EXPECT_EQ(r.meta().at("client_state").at("note"), "hello");
  EXPECT_EQ(r.meta().at("format"), kCheckpointFormat);
  std::vector<float> a(1000), b(5);
  r.read("chunk0.master", a.data(), 4000);
  r.read("chunk1.master", b.data(), 20);
  EXPECT_EQ(a, ramp(1000, 1.0f));
  EXPECT_EQ(b, ramp(5, -1.0f));
}

TEST(CheckpointFormat, NewerTagMovesLatestAndSameTagIsReplaced) {
  ScratchDir d("ckfmt-latest");
  save(d.path(), "global_step1", 1.0f, 1);
  save(d.path(), "global_step2", 2.0f, 2);
  EXPECT_EQ(latest_tag(d.path()), "global_step2");
  EXPECT_EQ(CheckpointReader(d.path(), "global_step1").meta().at("step"), 1);
  save(d.path(), "global_step2", 9.0f, 22);
  CheckpointReader r(d.path());
  EXPECT_EQ(r.meta().at("step"), 22);
  std::vector<float> a(1000);
  r.read("chunk0.master", a.data(), 4000);
  EXPECT_EQ(a[0], 9.0f);
  EXPECT_FALSE(fs::exists(d.file("global_step2.old")));
}

// A save killed part-way leaves TAG.tmp; the next save removes it (every .tmp of the directory).
TEST(CheckpointFormat, ThePartialDirectoryOfAKilledSaveGoesAtTheNextSave) {
  ScratchDir d("ckfmt-leftover");
  fs::create_directories(d.file("global_step7.tmp"));
  std::ofstream(d.file("global_step7.tmp/rank0.shard")) << "partial";
  save(d.path(), "global_step8", 1.0f, 8);
  EXPECT_FALSE(fs::exists(d.file("global_step7.tmp")));
  EXPECT_EQ(latest_tag(d.path()), "global_step8");
}

// A save over an existing tag moves the old one to TAG.old before the new one takes the name; killed in
// between, `latest` names TAG and only TAG.old holds it: loading finds it there.
TEST(CheckpointFormat, AnInterruptedReplacementLoadsTheOldCopy) {
  ScratchDir d("ckfmt-old");
  save(d.path(), "global_step2", 2.0f, 2);
  fs::rename(d.file("global_step2"), d.file("global_step2.old"));
  CheckpointReader r(d.path());
  EXPECT_EQ(r.meta().at("step"), 2);
  std::vector<float> a(1000);
  r.read("chunk0.master", a.data(), 4000);
  EXPECT_EQ(a, ramp(1000, 2.0f));
}

TEST(CheckpointFormat, AbandonedWriterLeavesNothingAndKeepsLatest) {
  ScratchDir d("ckfmt-abandon");
  save(d.path(), "global_step1", 1.0f, 1);
  {
    CheckpointWriter w(d.path(), "global_step2");
    float x = 1;
    w.add({.name = "t", .dtype = "fp32", .bytes = 4}, &x);
  }  // destroyed without commit (a crash or an exception while saving)
  EXPECT_FALSE(fs::exists(d.file("global_step2.tmp")));
  EXPECT_FALSE(fs::exists(d.file("global_step2")));
  EXPECT_EQ(latest_tag(d.path()), "global_step1");
}

TEST(CheckpointFormat, CorruptTensorIsDetected) {
  ScratchDir d("ckfmt-corrupt");
  save(d.path(), "global_step1", 1.0f, 1);
  CheckpointReader clean(d.path());
  const TensorRecord* rec = clean.find("chunk0.master");
  ASSERT_NE(rec, nullptr);
  flip_byte(d.file("global_step1/rank0.shard"), rec->offset + 100);
  CheckpointReader r(d.path());
  std::vector<float> a(1000), b(5);
  try {
    r.read("chunk0.master", a.data(), 4000);
    FAIL() << "a flipped byte was not detected";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("checksum mismatch in tensor chunk0.master"), std::string::npos)
        << e.what();
  }
  r.read("chunk1.master", b.data(), 20);  // the other tensor is intact and reads back
  EXPECT_EQ(b, ramp(5, -1.0f));
}

TEST(CheckpointFormat, CorruptHeaderOrTableIsDetected) {
  ScratchDir d("ckfmt-header");
  save(d.path(), "global_step1", 1.0f, 1);
  const std::string file = d.file("global_step1/rank0.shard");
  flip_byte(file, 13);  // inside the header
  EXPECT_THROW(CheckpointReader r(d.path()), IoError);
  flip_byte(file, 13);  // restore
  {
    CheckpointReader r(d.path());
    std::vector<float> a(1000);
    r.read("chunk0.master", a.data(), 4000);
    EXPECT_EQ(a, ramp(1000, 1.0f));
  }
  const std::uint64_t size = fs::file_size(file);
  flip_byte(file, size - 3);  // inside the table
  EXPECT_THROW(CheckpointReader r(d.path()), IoError);
}

TEST(CheckpointFormat, TruncatedFileIsDetected) {
  ScratchDir d("ckfmt-trunc");
  save(d.path(), "global_step1", 1.0f, 1);
  const std::string file = d.file("global_step1/rank0.shard");
  fs::resize_file(file, 5000);
  EXPECT_THROW(CheckpointReader r(d.path()), IoError);
}

TEST(CheckpointFormat, MissingOrForeignDirectoryIsAClearError) {
  ScratchDir d("ckfmt-missing");
  EXPECT_THROW(CheckpointReader r(d.file("nope")), IoError);
  EXPECT_THROW(CheckpointReader r(d.path()), IoError);  // no latest
  fs::create_directories(d.file("t1"));
  std::ofstream(d.file("t1/meta.json")) << R"({"format": "something else"})";
  EXPECT_THROW(CheckpointReader r(d.path(), "t1"), ConfigError);
  EXPECT_THROW(CheckpointWriter w(d.path(), "bad/tag"), ConfigError);
}

TEST(CheckpointFormat, WrongSizeOrNameIsAnError) {
  ScratchDir d("ckfmt-size");
  save(d.path(), "global_step1", 1.0f, 1);
  CheckpointReader r(d.path());
  std::vector<float> a(1001);
  EXPECT_THROW(r.read("chunk0.master", a.data(), 4004), IoError);
  EXPECT_THROW(r.read("chunk9.master", a.data(), 4000), IoError);
}

}  // namespace
}  // namespace strata::zero3
