// Requests over several segments (several files, as the stripes of a swap extent): every segment's
// bytes land in its own file and come back from it, checked byte for byte against plain pread/pwrite;
// one handle, one failure naming the file that failed, and every file busy at once.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>

#include "nvme/engine.h"
#include "nvme/file.h"
#include "nvme/queue_impl.h"
#include "tests/nvme/test_util.h"

namespace strata::nvme {
namespace {

using test::ScratchDir;

constexpr int kFiles = 3;

// Page-aligned memory; at(1) is then misaligned for O_DIRECT on every file system.
class AlignedBytes {
 public:
  explicit AlignedBytes(std::size_t n)
      : p_(static_cast<std::uint8_t*>(std::aligned_alloc(4096, (n + 4096) / 4096 * 4096))) {}
  std::uint8_t* at(std::size_t i) { return p_.get() + i; }

 private:
  struct Free {
    void operator()(std::uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<std::uint8_t, Free> p_;
};

// Where one segment goes: file index, file offset and length; its memory follows the previous
// segment's in the request's buffer.
struct Place {
  int file;
  std::uint64_t off;
  std::size_t len;
};

// Four requests of three or four segments each, in disjoint regions of the files: odd offsets and
// lengths, whole pages, many blocks, one byte, and an empty segment.
std::vector<std::vector<Place>> requests() {
  return {
      {{0, 1, 70'001}, {1, 4096, 8192}, {2, 333, 1}},
      {{2, 200'000, 150'000}, {0, 100'003, 99'999}, {1, 100'000, 0}, {1, 150'001, 4095}},
      {{1, 300'000 - 7, 123'457}, {2, 400'123, 65'536}, {0, 250'000, 4096 * 3 + 17}},
      {{0, 600'001, 1}, {1, 700'000, 200'001}, {2, 512, 3'000}},
  };
}

std::size_t total(const std::vector<Place>& r) {
  std::size_t n = 0;
  for (const Place& p : r) n += p.len;
  return n;
}

class Segments : public ::testing::TestWithParam<std::tuple<Backend, int>> {
 protected:
  void SetUp() override {
    STRATA_SKIP_IF_UNAVAILABLE(std::get<0>(GetParam()));
    for (int k = 0; k < kFiles; ++k) paths_.push_back(dir_.file("stripe" + std::to_string(k) + ".bin"));
  }
  AioOptions opts() const {
    AioOptions o;
    o.backend = std::get<0>(GetParam());
    o.block_size = 16 << 10;  // many pieces per segment
    o.queue_depth = 4;
    o.intra_op_parallelism = std::get<1>(GetParam());
    return o;
  }
  std::vector<File> open_all() const {
    std::vector<File> f;
    for (const std::string& p : paths_) f.push_back(File::open(p, OpenMode::create));
    return f;
  }
  std::vector<Segment> segments(const std::vector<Place>& r, const std::vector<File>& files,
                                std::uint8_t* buf) const {
    std::vector<Segment> s;
    for (const Place& p : r) {
      s.push_back({&files[std::size_t(p.file)], p.off, p.len, buf});
      buf += p.len;
    }
    return s;
  }

  ScratchDir dir_{"nvme"};
  std::vector<std::string> paths_;
};

TEST_P(Segments, AWriteOverThreeFilesLandsInEachFileAsPreadReadsIt) {
  AioEngine engine(opts());
  std::vector<File> files = open_all();
  const auto reqs = requests();
  std::vector<AlignedBytes> mem;
  std::vector<std::vector<std::uint8_t>> data;
  std::vector<IoHandle> hs;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    const std::size_t n = total(reqs[i]), skew = i % 2;  // odd requests from misaligned memory
    data.push_back(test::random_bytes(n, 10 + i));
    mem.emplace_back(n + skew);
    std::copy(data[i].begin(), data[i].end(), mem[i].at(skew));
    hs.push_back(engine.submit_write(segments(reqs[i], files, mem[i].at(skew))));
  }
  for (IoHandle h : hs) engine.wait(h);
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    std::size_t at = 0;
    for (const Place& p : reqs[i]) {
      if (p.len == 0) continue;
      auto got = test::oracle_read(paths_[std::size_t(p.file)], p.off, p.len);
      EXPECT_EQ(test::first_difference(got.data(), data[i].data() + at, p.len), -1)
          << "request " << i << ", file " << p.file << " at " << p.off << "+" << p.len;
      at += p.len;
    }
  }
}

TEST_P(Segments, AReadOverThreeFilesReturnsWhatPwritePutInEachFile) {
  const std::size_t file_bytes = 1'000'000;
  std::vector<std::vector<std::uint8_t>> content;
  for (int k = 0; k < kFiles; ++k) {
    content.push_back(test::random_bytes(file_bytes, 20 + std::uint64_t(k)));
    test::oracle_write(paths_[std::size_t(k)], content.back().data(), file_bytes, 0);
  }
  AioEngine engine(opts());
  std::vector<File> files = open_all();
  const auto reqs = requests();
  std::vector<AlignedBytes> mem;
  std::vector<IoHandle> hs;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    const std::size_t n = total(reqs[i]), skew = i % 2;
    mem.emplace_back(n + skew);
    std::fill(mem[i].at(0), mem[i].at(n + skew), 0xEE);
    hs.push_back(engine.submit_read(segments(reqs[i], files, mem[i].at(skew))));
  }
  for (IoHandle h : hs) engine.wait(h);
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    const std::uint8_t* got = mem[i].at(i % 2);
    for (const Place& p : reqs[i]) {
      EXPECT_EQ(test::first_difference(got, content[std::size_t(p.file)].data() + p.off, p.len), -1)
          << "request " << i << ", file " << p.file << " at " << p.off << "+" << p.len;
      got += p.len;
    }
  }
}

TEST_P(Segments, AFailingSegmentFailsTheRequestNamingItsFileAndSegment) {
  auto content = test::random_bytes(50'000, 30);
  for (const std::string& p : paths_) test::oracle_write(p, content.data(), content.size(), 0);
  ASSERT_EQ(::truncate(paths_[1].c_str(), 10'000), 0);  // the middle file is short
  AioEngine engine(opts());
  std::vector<File> files = open_all();
  std::vector<std::uint8_t> buf(3 * 40'000);
  std::vector<Segment> s = {{&files[0], 5'000, 40'000, buf.data()},
                            {&files[1], 5'000, 40'000, buf.data() + 40'000},
                            {&files[2], 5'000, 40'000, buf.data() + 80'000}};
  try {
    engine.wait(engine.submit_read(s));
    FAIL() << "reading past the end of " << paths_[1] << " did not fail";
  } catch (const IoError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(paths_[1]), std::string::npos) << m;
    EXPECT_EQ(m.find(paths_[0]), std::string::npos) << m;
    EXPECT_EQ(m.find(paths_[2]), std::string::npos) << m;
    EXPECT_NE(m.find("end of the file"), std::string::npos) << m;
    EXPECT_NE(m.find("40000-byte read at offset 5000"), std::string::npos) << m;
  }
  EXPECT_EQ(engine.stats().failed_requests, 1u);
  EXPECT_EQ(engine.stats().pending, 0u);
}

TEST_P(Segments, CountersCountTheRequestsTotalOnce) {
  AioEngine engine(opts());
  std::vector<File> files = open_all();
  const auto r = requests()[1];
  auto data = test::random_bytes(total(r), 40);
  engine.wait(engine.submit_write(segments(r, files, data.data())));
  std::vector<std::uint8_t> back(data.size());
  engine.wait(engine.submit_read(segments(r, files, back.data())));
  IoStats st = engine.stats();
  EXPECT_EQ(st.requests, 2u);
  EXPECT_EQ(st.bytes_written, data.size());
  EXPECT_EQ(st.bytes_read, data.size());
  EXPECT_EQ(back, data);
}

TEST_P(Segments, DrainOfOneFileWaitsForTheRequestsThatTouchIt) {
  AioEngine engine(opts());
  std::vector<File> files = open_all();
  const auto r = requests()[2];
  auto data = test::random_bytes(total(r), 50);
  IoHandle h = engine.submit_write(segments(r, files, data.data()));
  engine.drain(files[2]);
  EXPECT_TRUE(engine.poll(h));
  engine.wait(h);
}

INSTANTIATE_TEST_SUITE_P(Backends, Segments,
                         ::testing::Combine(::testing::ValuesIn(test::all_backends()),
                                            ::testing::Values(1, 3)),
                         [](const auto& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_threads" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(SegmentsEmpty, ARequestWhoseSegmentsAreAllEmptyCompletesAtOnce) {
  ScratchDir dir("nvme");
  AioEngine engine;
  File f = File::open(dir.file("a.bin"), OpenMode::create),
       g = File::open(dir.file("b.bin"), OpenMode::create);
  std::vector<Segment> s = {{&f, 4096, 0, nullptr}, {&g, 1, 0, nullptr}};
  IoHandle h = engine.submit_write(s);
  EXPECT_TRUE(engine.poll(h));
  engine.wait(h);
  IoHandle none = engine.submit_read(std::span<const Segment>{});
  EXPECT_TRUE(engine.poll(none));
  engine.wait(none);
  EXPECT_EQ(engine.stats().requests, 2u);
  EXPECT_EQ(f.size() + g.size(), 0u);
}

// Which descriptors had pieces in the queue together, recorded at every reap; pread/pwrite as psync.
std::mutex g_seen_mu;
std::vector<std::set<int>> g_seen;

class RecordingQueue final : public detail::Queue {
 public:
  detail::QueueCaps caps() const override { return {}; }
  void prepare(std::uint32_t slot, const detail::IoDesc& d) override { staged_.push_back({slot, d}); }
  void submit() override {}
  std::size_t reap(std::size_t, detail::Completion* out, std::size_t cap) override {
    std::set<int> fds;
    for (const auto& [slot, d] : staged_) fds.insert(d.fd);
    {
      std::lock_guard<std::mutex> lock(g_seen_mu);
      g_seen.push_back(fds);
    }
    std::size_t n = 0;
    for (; n < staged_.size() && n < cap; ++n) {
      auto [slot, d] = staged_[n];
      ssize_t r = d.op == detail::Op::read ? ::pread(d.fd, d.buf, d.len, off_t(d.off))
                                           : ::pwrite(d.fd, d.buf, d.len, off_t(d.off));
      out[n] = {slot, r < 0 ? -long(errno) : long(r)};
    }
    staged_.erase(staged_.begin(), staged_.begin() + long(n));
    return n;
  }

 private:
  std::vector<std::pair<std::uint32_t, detail::IoDesc>> staged_;
};

std::unique_ptr<detail::Queue> make_recording(unsigned) {
  return std::make_unique<RecordingQueue>();
}

// Note [parts in turn]: one worker whose queue holds pieces of all three segments at once, not the
// first file's pieces until that segment is done.
TEST(SegmentsInTurn, OneWorkerKeepsPiecesOfEveryFileInFlightAtOnce) {
  ScratchDir dir("nvme");
  g_seen.clear();
  detail::QueueFactory previous = detail::exchange_queue_factory(&make_recording);
  {
    AioOptions o;
    o.backend = Backend::psync;
    o.block_size = 16 << 10;
    o.queue_depth = 6;
    o.overlap_events = false;  // batches of queue_depth pieces
    AioEngine engine(o);
    std::vector<File> files;
    for (int k = 0; k < kFiles; ++k)
      files.push_back(File::open(dir.file(std::to_string(k) + ".bin"), OpenMode::create, false));
    const std::size_t seg = 8 * o.block_size;  // eight pieces per file
    auto data = test::random_bytes(kFiles * seg, 60);
    std::vector<Segment> s;
    for (int k = 0; k < kFiles; ++k)
      s.push_back({&files[std::size_t(k)], 0, seg, data.data() + std::size_t(k) * seg});
    engine.wait(engine.submit_write(s));
    for (int k = 0; k < kFiles; ++k) {
      auto got = test::oracle_read(files[std::size_t(k)].path(), 0, seg);
      EXPECT_EQ(test::first_difference(got.data(), data.data() + std::size_t(k) * seg, seg), -1)
          << "file " << k;
    }
  }
  detail::exchange_queue_factory(previous);
  ASSERT_FALSE(g_seen.empty());
  EXPECT_EQ(g_seen.front().size(), std::size_t(kFiles)) << "the first batch must hold pieces of every file";
  std::size_t all = 0;
  std::string batches;
  for (const auto& fds : g_seen) {
    all += fds.size() == std::size_t(kFiles);
    batches += " {";
    for (int fd : fds) batches += " " + std::to_string(fd);
    batches += " }";
  }
  EXPECT_GE(all, 3u) << "of " << g_seen.size() << " batches:" << batches;
}

}  // namespace
}  // namespace strata::nvme
