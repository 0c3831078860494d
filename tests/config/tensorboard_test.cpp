// DeepSpeed's tensorboard section: its three keys with DeepSpeed's defaults (monitor/config.py
// TensorBoardConfig), read like every other key. Then the event file both front-ends write for it
// (session/tensorboard_monitor.h), read back here record by record: every record's lengths and CRCs, the
// version event first, then each scalar's tag, step and value (Note [Event files]).
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

#include "config_test_util.h"
#include "session/tensorboard_monitor.h"
#include "tests/common/scratch_dir.h"

namespace strata {
namespace {

using session::TensorBoardMonitor;

TEST(TensorBoard, LeftOutTakesDeepSpeedsDefaults) {
  Config c = Config::parse({{"train_batch_size", 8}});
  EXPECT_FALSE(c.tensorboard.enabled);
  EXPECT_EQ(c.tensorboard.output_path, "");
  EXPECT_EQ(c.tensorboard.job_name, "DeepSpeedJobName");
  EXPECT_EQ(TensorBoardMonitor::directory(c.tensorboard), "DeepSpeedJobName");
}

TEST(TensorBoard, SectionIsReadWithoutWarnings) {
  Config c = Config::parse(
      {{"train_batch_size", 8},
       {"tensorboard", {{"enabled", true}, {"output_path", "logs/"}, {"job_name", "llama-run"}}}});
  EXPECT_TRUE(c.tensorboard.enabled);
  EXPECT_EQ(TensorBoardMonitor::directory(c.tensorboard), "logs/llama-run");
  EXPECT_EQ(c.source("tensorboard.enabled"), "file");
  EXPECT_TRUE(c.warnings().empty()) << c.warnings()[0];
}

// The check value of CRC-32C (the CRC of "123456789"), and the mask TFRecords put on it.
TEST(TensorBoard, Crc32cGivesTheStandardCheckValue) {
  const char* s = "123456789";
  const std::span<const unsigned char> b(reinterpret_cast<const unsigned char*>(s), 9);
  EXPECT_EQ(session::crc32c(b), 0xE3069283u);
  const std::uint32_t c = 0xE3069283u;
  EXPECT_EQ(session::masked_crc32c(b), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

// A protocol buffer reader for the fields the event file uses: varints, 32- and 64-bit fixed, bytes.
struct Reader {
  std::string_view b;
  std::size_t at = 0;
  bool done() const { return at >= b.size(); }
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      const unsigned char c = static_cast<unsigned char>(b.at(at++));
      v |= std::uint64_t(c & 0x7f) << shift;
      if (!(c & 0x80)) return v;
    }
  }
  template <typename T>
  T fixed() {
    T v;
    std::memcpy(&v, b.substr(at, sizeof(T)).data(), sizeof(T));
    at += sizeof(T);
    return v;
  }
  std::string_view bytes() {
    const std::size_t n = varint();
    std::string_view s = b.substr(at, n);
    at += n;
    return s;
  }
};

struct Scalar {
  std::int64_t step = 0;
  double wall_time = 0;
  std::string version, tag;
  float value = 0;
};

// Each record of the file, its framing checked, decoded as an Event.
std::vector<Scalar> read_events(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<Scalar> out;
  Reader file{all};
  auto crc_of = [](std::string_view s) {
    return session::masked_crc32c({reinterpret_cast<const unsigned char*>(s.data()), s.size()});
  };
  while (!file.done()) {
    const std::string_view len_bytes = file.b.substr(file.at, 8);
    const std::uint64_t len = file.fixed<std::uint64_t>();
    EXPECT_EQ(file.fixed<std::uint32_t>(), crc_of(len_bytes)) << "length CRC of record " << out.size();
    const std::string_view data = file.b.substr(file.at, len);
    file.at += len;
    EXPECT_EQ(file.fixed<std::uint32_t>(), crc_of(data)) << "data CRC of record " << out.size();
    Scalar s;
    for (Reader e{data}; !e.done();) {
      const std::uint64_t key = e.varint();
      if (key == (1 << 3 | 1)) {
        s.wall_time = e.fixed<double>();
      } else if (key == (2 << 3 | 0)) {
        s.step = std::int64_t(e.varint());
      } else if (key == (3 << 3 | 2)) {
        s.version = e.bytes();
      } else if (key == (5 << 3 | 2)) {
        for (Reader summary{e.bytes()}; !summary.done();) {
          EXPECT_EQ(summary.varint(), 1u << 3 | 2) << "Summary.value";
          for (Reader v{summary.bytes()}; !v.done();) {
            const std::uint64_t k = v.varint();
            if (k == (1 << 3 | 2))
              s.tag = v.bytes();
            else if (k == (2 << 3 | 5))
              s.value = v.fixed<float>();
            else
              ADD_FAILURE() << "unexpected Summary.Value field key " << k;
          }
        }
      } else {
        ADD_FAILURE() << "unexpected Event field key " << key;
        break;
      }
    }
    out.push_back(s);
  }
  return out;
}

TEST(TensorBoard, EventFileHoldsTheVersionThenEachScalarWithItsStep) {
  test::ScratchDir d("tensorboard-events");
  std::string path;
  {
    TensorBoardMonitor tb(d.path());
    path = tb.path();
    tb.write("Train/Samples/train_loss", 8, 5.25);
    tb.write("Train/Samples/lr", 8, 1e-4);
    tb.flush();
    tb.write("Train/Samples/train_loss", 16, 4.5);
    tb.flush();
  }
  const std::string name = std::filesystem::path(path).filename().string();
  EXPECT_TRUE(std::regex_match(name, std::regex(R"(events\.out\.tfevents\.[0-9]{10}\..+\.[0-9]+\.[0-9]+)")))
      << name;
  EXPECT_NE(name.find(std::to_string(::getpid())), std::string::npos) << name;
  const std::vector<Scalar> ev = read_events(path);
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[0].version, "brain.Event:2");
  EXPECT_GT(ev[0].wall_time, 1.5e9);
  const std::tuple<std::string, std::int64_t, float> want[] = {{"Train/Samples/train_loss", 8, 5.25f},
                                                               {"Train/Samples/lr", 8, 1e-4f},
                                                               {"Train/Samples/train_loss", 16, 4.5f}};
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(ev[i + 1].tag, std::get<0>(want[i])) << i;
    EXPECT_EQ(ev[i + 1].step, std::get<1>(want[i])) << i;
    EXPECT_EQ(ev[i + 1].value, std::get<2>(want[i])) << i;
    EXPECT_GE(ev[i + 1].wall_time, ev[0].wall_time) << i;
  }
}

// What is written before a flush is in the file once it returns: a killed run keeps every flushed step.
TEST(TensorBoard, FlushedStepsAreInTheFileWhileTheRunGoesOn) {
  test::ScratchDir d("tensorboard-flush");
  TensorBoardMonitor tb(d.path());
  tb.write("Train/Samples/grad_norm", 3, 0.75);
  tb.flush();
  const std::vector<Scalar> ev = read_events(tb.path());
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[1].tag, "Train/Samples/grad_norm");
  EXPECT_EQ(ev[1].value, 0.75f);
}

// Several runs of one process in one folder (a Python loop's second engine, or its load_checkpoint, within
// the same second) each get a file of their own: none truncates another's.
TEST(TensorBoard, RunsOfOneProcessGetAFileEachAndKeepTheirEvents) {
  test::ScratchDir d("tensorboard-runs");
  TensorBoardMonitor first(d.path());
  first.write("Train/Samples/train_loss", 4, 5.0);
  first.flush();
  TensorBoardMonitor second(d.path());
  second.write("Train/Samples/train_loss", 8, 4.0);
  second.flush();
  ASSERT_NE(first.path(), second.path());
  const std::vector<Scalar> a = read_events(first.path()), b = read_events(second.path());
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(a[1].step, 4);
  EXPECT_EQ(a[1].value, 5.0f);
  EXPECT_EQ(b[1].step, 8);
  EXPECT_EQ(b[1].value, 4.0f);
}

TEST(TensorBoard, AFolderThatCannotTakeTheFileIsRefusedNamingIt) {
  test::ScratchDir d("tensorboard-missing");
  const std::string missing = d.path() + "/not-made";
  try {
    TensorBoardMonitor tb(missing);
    FAIL() << "created a file in " << missing;
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(missing + "/events.out.tfevents."), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata
