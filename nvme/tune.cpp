#include "nvme/tune.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <limits>
#include <memory>
#include <random>

#include "core/error.h"
#include "core/log.h"

namespace strata::nvme {

using strata::detail::cat;

const char* to_string(Pattern p) {
  switch (p) {
    case Pattern::seq_read:
      return "seq_read";
    case Pattern::seq_write:
      return "seq_write";
    case Pattern::rand_read:
      return "rand_read";
    case Pattern::rand_write:
      return "rand_write";
  }
  return "?";
}

bool is_write(Pattern p) {
  return p == Pattern::seq_write || p == Pattern::rand_write;
}

double TunePoint::combined_gbps() const {
  return read_gbps > 0 && write_gbps > 0 ? 2.0 / (1.0 / read_gbps + 1.0 / write_gbps) : 0.0;
}

namespace {

constexpr std::size_t kMaxSeqRequest = std::size_t(64) << 20;

struct AlignedBuffer {
  explicit AlignedBuffer(std::size_t n) : bytes(n) {
    if (posix_memalign(&ptr, 4096, n) != 0) ptr = nullptr;
    if (!ptr) throw OutOfMemory(cat("cannot allocate a ", format_bytes(n), " measurement buffer"));
    std::mt19937_64 rng(0x5eed);
    auto* w = static_cast<std::uint64_t*>(ptr);
    for (std::size_t i = 0; i < n / 8; ++i) w[i] = rng();  // incompressible, like fio's buffers
  }
  ~AlignedBuffer() { std::free(ptr); }
  void* ptr = nullptr;
  std::size_t bytes;
};

}  // namespace

std::size_t measure_buffer_bytes(const AioOptions& o) {
  std::size_t want = o.block_size * std::size_t(o.queue_depth) * std::size_t(o.intra_op_parallelism);
  return std::max(o.block_size, std::min(want, kMaxSeqRequest));
}

namespace {

// Sequential requests span many blocks (the engine cuts them into block_size pieces); random ones are
// one block each. Outstanding requests cover every queue's queue_depth pieces plus about 32 MiB more (at
// least two requests), as a swap pipeline keeps work queued ahead: the engine never idles while the
// measuring thread, on a busy machine, takes its time to react to a completion, and little is left to
// drain after the deadline.
// Requests whose pieces can be in the kernel at once: those covering the queues' pieces, plus one whose
// last pieces are still out when the next one's first go in. Giving each its own memory gives the
// engine fio's buffer footprint (block x depth), each I/O in flight with memory of its own.
struct Plan {
  std::uint64_t request;
  std::size_t outstanding;
  std::size_t in_kernel;
};

Plan plan(const AioOptions& o, bool seq, std::uint64_t span, std::size_t buffer_bytes) {
  constexpr std::uint64_t kAhead = std::uint64_t(32) << 20;
  const std::uint64_t bs = o.block_size;
  const std::uint64_t slots = std::uint64_t(o.queue_depth) * std::uint64_t(o.intra_op_parallelism);
  std::uint64_t req = bs;
  if (seq)
    req = std::min<std::uint64_t>(
        std::max<std::uint64_t>(bs, std::min(buffer_bytes, measure_buffer_bytes(o)) / bs * bs), span);
  const std::uint64_t covering = (slots * bs + req - 1) / req;
  return {req, std::size_t(covering + std::max<std::uint64_t>(2, (kAhead + req - 1) / req)),
          std::size_t(covering + 1)};
}

}  // namespace

std::size_t measure_inflight_bytes(const AioOptions& o) {
  const auto unbounded = std::numeric_limits<std::uint64_t>::max();
  const auto big = std::numeric_limits<std::size_t>::max();
  std::size_t bytes = 0;
  for (bool seq : {true, false}) {
    const Plan p = plan(o, seq, unbounded, big);
    bytes = std::max(bytes, std::size_t(p.request) * p.in_kernel);
  }
  return bytes;
}

Measurement measure(AioEngine& engine, const File& file, std::uint64_t file_bytes, Pattern pattern,
                    double seconds, void* buffer, std::size_t buffer_bytes, double ramp_seconds) {
  const AioOptions& o = engine.options();
  const std::uint64_t bs = o.block_size;
  STRATA_CHECK(file_bytes >= bs, "measure: the file (", file_bytes, " bytes) is smaller than one block (", bs,
               ")");
  STRATA_CHECK(buffer_bytes >= bs, "measure: the buffer (", buffer_bytes,
               " bytes) is smaller than one block (", bs, ")");
  STRATA_CHECK(seconds > 0 && ramp_seconds >= 0, "measure: seconds (", seconds,
               ") must be positive and ramp (", ramp_seconds, ") not negative");
  const std::uint64_t blocks = file_bytes / bs, span = blocks * bs;
  const bool seq = pattern == Pattern::seq_read || pattern == Pattern::seq_write;
  const bool wr = is_write(pattern);
  const Plan pl = plan(o, seq, span, buffer_bytes);
  const std::uint64_t req = pl.request;
  // Requests take the buffer's request-sized regions in turn, as many regions as can be in the kernel
  // at once (Plan): with measure_inflight_bytes() of buffer each I/O in flight has memory of its own and
  // the whole is about block x depth, as fio's buffers are (on a virtual disk, reads landing in memory
  // that other reads in flight also fill ran about 25% slower).
  const std::uint64_t regions = std::clamp<std::uint64_t>(buffer_bytes / req, 1, pl.in_kernel);
  std::uint64_t next_region = 0;

  std::mt19937_64 rng(0x10ad);
  std::uint64_t pos = 0;
  std::deque<std::pair<IoHandle, std::uint64_t>> q;
  auto submit = [&] {
    std::uint64_t off, len = req;
    if (seq) {
      if (pos >= span) pos = 0;  // wrap at the end of the range, as fio does
      off = pos;
      len = std::min(req, span - pos);
      pos += len;
    } else {
      off = (rng() % blocks) * bs;
    }
    void* mem = static_cast<char*>(buffer) + next_region++ % regions * req;
    IoHandle h = wr ? engine.submit_write(file, mem, len, off) : engine.submit_read(file, mem, len, off);
    q.emplace_back(h, len);
  };
  using clock = std::chrono::steady_clock;
  auto span_of = [](double s) {
    return std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(s));
  };
  // The window opens when the ramp ends (at the first submit without one), as fio resets its counters
  // then: every request that completes afterwards counts, also one that was in flight before.
  const auto start = clock::now() + span_of(ramp_seconds);
  const auto deadline = start + span_of(seconds);
  auto last = start;
  Measurement m;
  try {
    for (std::size_t i = 0; i < pl.outstanding; ++i) submit();
    while (!q.empty()) {
      engine.wait(q.front().first);
      const auto now = clock::now();
      if (now >= start) {
        m.bytes += q.front().second;
        last = now;
      }
      q.pop_front();
      if (now < deadline) submit();
    }
  } catch (...) {
    for (auto& [h, n] : q) {
      try {
        engine.wait(h);
      } catch (const Error&) {
      }
    }
    throw;
  }
  m.seconds = std::chrono::duration<double>(last - start).count();
  m.gbps = m.seconds > 0 ? double(m.bytes) / m.seconds / 1e9 : 0;
  return m;
}

// ---- scratch file ---------------------------------------------------------------------------------

ScratchFile::ScratchFile(const std::string& dir, std::uint64_t bytes, bool direct)
    : bytes_(bytes / 4096 * 4096) {
  STRATA_CHECK(bytes_ > 0, "scratch file of ", bytes, " bytes: must be at least 4096");
  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) != 0) {
    int err = errno;
    throw IoError(cat("cannot use ", dir, " for measurements: ", strata::detail::errno_text(err)));
  }
  std::uint64_t avail = std::uint64_t(vfs.f_bavail) * vfs.f_frsize;
  if (avail < bytes_ + (std::uint64_t(64) << 20))
    throw OutOfMemory(cat("measuring under ", dir, " needs a ", format_bytes(bytes_),
                          " scratch file (plus 64 MiB "
                          "headroom) but only ",
                          format_bytes(avail),
                          " is free; free space or choose a smaller "
                          "file size"));
  static std::atomic<unsigned> counter{0};
  std::string path =
      (std::filesystem::path(dir) / cat("strata-scratch-", ::getpid(), "-", counter++, ".bin")).string();
  file_ = File::open(path, OpenMode::create, direct);
  try {
    file_.resize(0);
    AioOptions o;
    o.queue_depth = 16;
    o.use_direct = direct;
    AioEngine engine(o);
    AlignedBuffer buf(std::min<std::uint64_t>(bytes_, kMaxSeqRequest));
    for (std::uint64_t off = 0; off < bytes_; off += buf.bytes)
      engine.submit_write(file_, buf.ptr, std::min<std::uint64_t>(buf.bytes, bytes_ - off), off);
    engine.wait_all();
  } catch (...) {
    file_.close();
    ::unlink(path.c_str());
    throw;
  }
}

ScratchFile::~ScratchFile() {
  std::string path = file_.path();
  file_.close();
  if (!path.empty()) ::unlink(path.c_str());
}

// ---- the sweep --------------------------------------------------------------------------------------

TuneResult tune(const TuneOptions& t, std::vector<std::string>* skipped) {
  if (t.block_sizes.empty() || t.queue_depths.empty() || t.threads.empty() || t.single_submit.empty() ||
      t.overlap_events.empty())
    throw ConfigError(
        "nvme-tune: every swept list (block sizes, queue depths, threads, single_submit, "
        "overlap_events) needs at least one value");
  if (!(t.seconds > 0))
    throw ConfigError(cat("nvme-tune: seconds per point must be positive, not ", t.seconds));
  std::vector<Backend> backends = t.backends;
  if (backends.empty()) backends = {Backend::io_uring, Backend::libaio, Backend::psync};
  std::vector<Backend> usable;
  for (Backend b : backends) {
    if (b == Backend::auto_select) b = resolve_backend(b);
    std::string why;
    if (backend_available(b, &why)) {
      if (std::find(usable.begin(), usable.end(), b) == usable.end()) usable.push_back(b);
    } else if (skipped) {
      skipped->push_back(cat(to_string(b), ": ", why));
    }
  }
  if (usable.empty()) throw BackendError("nvme-tune: none of the requested backends works on this machine");
  std::size_t max_block = *std::max_element(t.block_sizes.begin(), t.block_sizes.end());
  STRATA_CHECK(t.file_bytes >= max_block, "nvme-tune: the scratch file (", format_bytes(t.file_bytes),
               ") must hold at least one block of ", format_bytes(max_block));

  // Every candidate is validated before anything is written.
  std::vector<AioOptions> sweep;
  for (Backend b : usable)
    for (std::size_t bs : t.block_sizes)
      for (std::size_t di = 0; di < t.queue_depths.size(); ++di) {
        if (b == Backend::psync && di > 0) break;  // psync has no queue: depth changes nothing
        for (int th : t.threads)
          for (bool ss : t.single_submit)
            for (bool ov : t.overlap_events) {
              AioOptions o;
              o.backend = b;
              o.block_size = bs;
              o.queue_depth = t.queue_depths[di];
              o.intra_op_parallelism = th;
              o.single_submit = ss;
              o.overlap_events = ov;
              o.use_direct = t.direct;
              o.validate();
              sweep.push_back(o);
            }
      }

  TuneResult result;
  ScratchFile scratch(t.dir, t.file_bytes, t.direct);
  result.file = scratch.path();
  result.bytes_written = scratch.bytes();
  std::size_t buf_bytes = max_block;
  for (const AioOptions& o : sweep) buf_bytes = std::max(buf_bytes, measure_buffer_bytes(o));
  AlignedBuffer buf(buf_bytes);
  for (const AioOptions& o : sweep) {
    AioEngine engine(o);
    engine.register_buffers(buf.ptr, buf.bytes);  // as the runtime does with its pinned pool
    TunePoint p;
    p.opts = o;
    Measurement w =
        measure(engine, scratch.file(), scratch.bytes(), Pattern::seq_write, t.seconds, buf.ptr, buf.bytes);
    Measurement r =
        measure(engine, scratch.file(), scratch.bytes(), Pattern::seq_read, t.seconds, buf.ptr, buf.bytes);
    engine.unregister_buffers(buf.ptr);
    p.write_gbps = w.gbps;
    p.read_gbps = r.gbps;
    result.bytes_written += w.bytes;
    result.points.push_back(p);
    if (t.on_point) t.on_point(p);
  }
  auto best_by = [&](auto key) {
    return *std::max_element(result.points.begin(), result.points.end(),
                             [&](const TunePoint& a, const TunePoint& b) { return key(a) < key(b); });
  };
  result.best = best_by([](const TunePoint& p) { return p.combined_gbps(); });
  result.best_read = best_by([](const TunePoint& p) { return p.read_gbps; });
  result.best_write = best_by([](const TunePoint& p) { return p.write_gbps; });
  return result;
}

}  // namespace strata::nvme
