// nvme_bench: sequential and random read/write GB/s of the engine per backend, block size and queue
// depth, each next to fio's figure for the same settings on the same file in the same run.
//
//   nvme_bench --dir /local_nvme            # sweep, then the headline (about 10 minutes)
//   nvme_bench --dir /local_nvme --quick    # 1 MiB blocks, depths 1 and 32
//   nvme_bench --dir /local_nvme --no-sweep --headline-read 8M:32 --headline-write 1M:64
//       --headline-seconds 30 --reps 5     # (one line) long headline runs only
//
// Like for like: fio (which must be installed: apt-get install fio) and the engine run on the same file
// over the same byte range [0, whole blocks of the file), with the same block size, depth, I/O engine
// (io_uring with registered buffers, libaio, psync) and O_DIRECT setting, both writing incompressible
// data and reading into memory the CPU never wrote (class Buffers), the file's page cache dropped before
// each run (fio's invalidate=1, posix_fadvise DONTNEED for the engine), both timed the same way
// (time-based, a ramp not counted, the same window; see measure() in nvme/tune.h), taking turns at going
// first. Prints a table and one JSON line. The headline re-measures the best io_uring sequential read and
// write points (or the given ones) several times, alternating engine and fio, and compares the medians.
#include <fcntl.h>
#include <sys/mman.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "nvme/nvme.h"

namespace {

using namespace strata::nvme;

struct Point {
  Backend backend;
  Pattern pattern;
  std::size_t block;
  int depth;
  double ours = 0, fio = 0;
  double ratio() const { return fio > 0 ? ours / fio : 0; }
};

const char* fio_engine(Backend b) {
  switch (b) {
    case Backend::io_uring:
      return "io_uring";
    case Backend::libaio:
      return "libaio";
    default:
      return "psync";
  }
}

const char* fio_rw(Pattern p) {
  switch (p) {
    case Pattern::seq_read:
      return "read";
    case Pattern::seq_write:
      return "write";
    case Pattern::rand_read:
      return "randread";
    case Pattern::rand_write:
      return "randwrite";
  }
  return "read";
}

std::string run_capture(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[8192];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

bool fio_available(std::string* version) {
  *version = run_capture("fio --version 2>/dev/null");
  while (!version->empty() && (version->back() == '\n' || version->back() == '\r')) version->pop_back();
  return version->rfind("fio", 0) == 0;
}

// The range both sides cover at block size `block`: the file's whole blocks from offset 0.
std::uint64_t range_bytes(std::uint64_t file_bytes, std::size_t block) {
  return file_bytes / block * block;
}

// fio on the same file, byte range, block size, depth, engine and O_DIRECT setting: the ceiling. One fio
// process runs the given patterns one after another (stonewalled jobs, each time-based with its own
// ramp, which is not counted, as its start-up is not); returns GB/s per pattern, 0 where fio reported
// nothing.
std::vector<double> run_fio(const std::string& path, std::uint64_t file_bytes, Backend b,
                            const std::vector<Pattern>& ps, std::size_t block, int depth, double seconds,
                            double ramp, bool direct) {
  std::string cmd = strata::detail::cat(
      "fio --filename='", path, "' --offset=0 --size=", range_bytes(file_bytes, block), " --bs=", block,
      " --iodepth=", b == Backend::psync ? 1 : depth, " --ioengine=", fio_engine(b),
      b == Backend::io_uring ? " --fixedbufs=1" : "", " --direct=", direct ? 1 : 0,
      " --invalidate=1 --time_based=1 --ramp_time=", int(ramp * 1000), "ms --runtime=", int(seconds * 1000),
      "ms --norandommap --randrepeat=0 --fallocate=none --disk_util=0 --stonewall");
  for (Pattern p : ps) cmd += strata::detail::cat(" --name=", to_string(p), " --rw=", fio_rw(p));
  cmd += " --output-format=json 2>&1";
  std::string out = run_capture(cmd);
  std::vector<double> gbps(ps.size(), 0.0);
  auto j = nlohmann::json::parse(out.substr(std::min(out.find('{'), out.size())), nullptr, false);
  if (j.is_discarded() || !j.contains("jobs")) {
    std::fprintf(stderr, "nvme_bench: fio gave no result for: %s\n%s\n", cmd.c_str(),
                 out.substr(0, 2000).c_str());
    return gbps;
  }
  for (const auto& job : j["jobs"])
    for (std::size_t i = 0; i < ps.size(); ++i)
      if (job.value("jobname", "") == to_string(ps[i]))
        gbps[i] = job[is_write(ps[i]) ? "write" : "read"]["bw_bytes"].get<double>() / 1e9;
  return gbps;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

std::string human(std::size_t bytes) {
  return bytes >= (1u << 20) ? std::to_string(bytes >> 20) + "M" : std::to_string(bytes >> 10) + "K";
}

// "8M:32" -> block 8 MiB, depth 32 (K and M suffixes, or bytes).
bool parse_point(const std::string& text, std::size_t* block, int* depth) {
  const auto colon = text.find(':');
  if (colon == std::string::npos) return false;
  try {
    std::size_t used = 0;
    const std::string b = text.substr(0, colon);
    unsigned long long v = std::stoull(b, &used);
    const std::string suffix = b.substr(used);
    if (suffix == "K" || suffix == "k")
      v <<= 10;
    else if (suffix == "M" || suffix == "m")
      v <<= 20;
    else if (!suffix.empty())
      return false;
    const int d = std::stoi(text.substr(colon + 1), &used);
    if (used != text.size() - colon - 1 || v == 0 || v % 4096 || d < 1) return false;
    *block = std::size_t(v);
    *depth = d;
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// The engine's buffers, as fio has them: what writes send is incompressible data written once by the CPU
// (fio fills its write buffers at start-up); what reads land in is memory the CPU never wrote (fio leaves
// its read buffers as allocated). On the virtual disk measured in bench/RESULTS.md the difference alone
// moved read rates by about 1.5x.
class Buffers {
 public:
  explicit Buffers(std::size_t bytes) : bytes_(bytes), write_(map(bytes)), read_(map(bytes)) {
    std::mt19937_64 rng(0xbe4c);
    for (std::size_t i = 0; i < bytes / 8; ++i) static_cast<std::uint64_t*>(write_)[i] = rng();
  }
  ~Buffers() {
    ::munmap(write_, bytes_);
    ::munmap(read_, bytes_);
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  void* for_pattern(Pattern p) const { return is_write(p) ? write_ : read_; }
  void* write() const { return write_; }
  void* read() const { return read_; }
  std::size_t bytes() const { return bytes_; }

 private:
  static void* map(std::size_t bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      throw strata::OutOfMemory(strata::detail::cat("nvme_bench: a ", bytes, "-byte buffer"));
    return p;
  }
  std::size_t bytes_;
  void* write_;
  void* read_;
};

class Runner {
 public:
  Runner(const ScratchFile& file, const Buffers& bufs, bool direct)
      : file_(file), bufs_(bufs), direct_(direct) {}

  double ours(AioEngine& engine, Pattern p, double seconds, double ramp) {
    // As fio's invalidate=1 at the start of each job: nothing of the file stays in the page cache.
    ::posix_fadvise(file_.file().buffered_fd(), 0, 0, POSIX_FADV_DONTNEED);
    return measure(engine, file_.file(), range_bytes(file_.bytes(), engine.options().block_size), p, seconds,
                   bufs_.for_pattern(p), bufs_.bytes(), ramp)
        .gbps;
  }
  std::vector<double> fio(Backend b, const std::vector<Pattern>& ps, std::size_t block, int depth,
                          double seconds, double ramp) {
    return run_fio(file_.path(), file_.bytes(), b, ps, block, depth, seconds, ramp, direct_);
  }
  double fio(Backend b, Pattern p, std::size_t block, int depth, double seconds, double ramp) {
    return fio(b, std::vector<Pattern>{p}, block, depth, seconds, ramp)[0];
  }
  std::unique_ptr<AioEngine> engine(Backend b, std::size_t block, int depth) {
    AioOptions o;
    o.backend = b;
    o.block_size = block;
    o.queue_depth = depth;
    o.use_direct = direct_;
    auto e = std::make_unique<AioEngine>(o);
    // As the runtime registers its pinned pool (fio: fixedbufs).
    e->register_buffers(bufs_.write(), bufs_.bytes());
    e->register_buffers(bufs_.read(), bufs_.bytes());
    return e;
  }

 private:
  const ScratchFile& file_;
  const Buffers& bufs_;
  bool direct_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"nvme_bench: engine GB/s per backend, block size and depth against fio on the same file"};
  std::string dir = ".";
  std::uint64_t file_mib = 1024;
  double seconds = 0.5, ramp = 0.5, headline_seconds = 3, headline_ramp = 2;
  int reps = 9;
  bool quick = false, buffered = false, no_sweep = false;
  std::string read_point, write_point;
  app.add_option("--dir", dir, "Directory on the drive to measure (a scratch file is created and removed)");
  app.add_option("--file-mib", file_mib, "Scratch file size in MiB")->check(CLI::Range(64, 1 << 20));
  app.add_option("--seconds", seconds, "Counted seconds per sweep point, for the engine and for fio each")
      ->check(CLI::PositiveNumber);
  app.add_option(
         "--ramp", ramp,
         "Seconds not counted at the start of each sweep run (fio's ramp_time); it should cover the first "
         "block x depth bytes, which fio's fresh buffers are pinned for")
      ->check(CLI::NonNegativeNumber);
  CLI::Option* o_reps =
      app.add_option("--reps", reps, "Alternating engine/fio repetitions of the headline points")
          ->check(CLI::Range(1, 50));
  CLI::Option* o_hsec =
      app.add_option("--headline-seconds", headline_seconds, "Counted seconds per headline repetition")
          ->check(CLI::PositiveNumber);
  CLI::Option* o_hramp = app.add_option("--headline-ramp", headline_ramp,
                                        "Seconds not counted at the start of each headline run")
                             ->check(CLI::NonNegativeNumber);
  app.add_option("--headline-read", read_point,
                 "BLOCK:DEPTH of the headline's sequential read (e.g. 8M:32); default the sweep's best");
  app.add_option("--headline-write", write_point,
                 "BLOCK:DEPTH of the headline's sequential write; default the sweep's best");
  app.add_flag("--no-sweep", no_sweep, "Only the headline (points default to 1M:32 without a sweep)");
  app.add_flag("--quick", quick, "Small sweep: 1 MiB blocks, depths 1 and 32, fewer headline runs");
  app.add_flag("--buffered", buffered, "Without O_DIRECT (both the engine and fio)");
  CLI11_PARSE(app, argc, argv);

  struct Target {
    std::size_t block = 1u << 20;
    int depth = 32;
    bool given = false;
  } read_target, write_target;
  for (auto [text, t] : {std::pair{&read_point, &read_target}, std::pair{&write_point, &write_target}}) {
    if (text->empty()) continue;
    if (!parse_point(*text, &t->block, &t->depth)) {
      std::fprintf(stderr, "nvme_bench: '%s' is not BLOCK:DEPTH (e.g. 8M:32, block a multiple of 4 KiB)\n",
                   text->c_str());
      return 2;
    }
    t->given = true;
  }

  std::vector<std::size_t> blocks = {256u << 10, 1u << 20, 8u << 20};
  std::vector<int> depths = {1, 8, 32, 64};
  if (quick) {
    blocks = {1u << 20};
    depths = {1, 32};
    if (!o_hsec->count()) headline_seconds = 2;
    if (!o_hramp->count()) headline_ramp = 1;
    if (!o_reps->count()) reps = 3;
  }
  const bool direct = !buffered;
  try {
    std::string fio_version;
    const bool have_fio = fio_available(&fio_version);
    if (!have_fio)
      std::fprintf(stderr,
                   "nvme_bench: fio not found; the ceiling column stays empty (install it: apt-get install "
                   "fio)\n");
    std::vector<Backend> backends;
    for (Backend b : {Backend::io_uring, Backend::libaio, Backend::psync}) {
      std::string why;
      if (backend_available(b, &why))
        backends.push_back(b);
      else
        std::fprintf(stderr, "nvme_bench: skipping %s: %s\n", to_string(b), why.c_str());
    }
    std::size_t max_block = no_sweep ? 0 : *std::max_element(blocks.begin(), blocks.end());
    max_block = std::max({max_block, read_target.block, write_target.block});
    if ((file_mib << 20) < max_block) {
      std::fprintf(stderr, "nvme_bench: the file (%llu MiB) is smaller than a block\n",
                   (unsigned long long)file_mib);
      return 2;
    }

    ScratchFile scratch(dir, file_mib << 20, direct);
    // Every point's requests in flight get memory of their own, as fio's I/Os do (measure() in
    // nvme/tune.h): 576 MiB each for reads and writes at 8 MiB x 64 (fio: 512 MiB).
    std::size_t buf_bytes = 0;
    auto need = [&](std::size_t block, int depth) {
      AioOptions o;
      o.block_size = block;
      o.queue_depth = depth;
      buf_bytes = std::max(buf_bytes, measure_inflight_bytes(o));
    };
    if (!no_sweep)
      for (std::size_t bs : blocks)
        for (int d : depths) need(bs, d);
    need(read_target.block, read_target.depth);
    need(write_target.block, write_target.depth);
    Buffers bufs(buf_bytes);
    Runner run(scratch, bufs, direct);

    std::printf(
        "nvme_bench: %s, file %s (%llu MiB, %s), %s; sweep: %.2f s counted after %.2f s ramp per run; "
        "headline: %d alternating runs of %.2f s after %.2f s ramp\n",
        cpu_model().c_str(), scratch.path().c_str(), (unsigned long long)file_mib,
        direct ? "O_DIRECT" : "buffered", have_fio ? fio_version.c_str() : "no fio", seconds, ramp, reps,
        headline_seconds, headline_ramp);
    std::printf(
        "fio per run: --filename=<the file> --offset=0 --size=<its whole blocks> --bs --iodepth --ioengine "
        "(io_uring with --fixedbufs=1) --direct=%d --invalidate=1 --time_based=1 --ramp_time --runtime "
        "--norandommap --randrepeat=0; the engine: the same range, block, depth and backend, buffer "
        "registered, page cache dropped, the same ramp and window\n",
        direct ? 1 : 0);

    // The fill just wrote the whole file; a second of reads (not counted) lets the drive settle.
    {
      auto warm = run.engine(backends.front(), 1u << 20, 8);
      run.ours(*warm, Pattern::seq_read, 1.0, 0);
    }

    std::vector<Point> points;
    int combo = 0;
    if (!no_sweep) {
      std::printf("%-9s %-10s %6s %5s %10s %10s %7s\n", "backend", "pattern", "block", "depth", "engine",
                  "fio", "ratio");
      for (Backend b : backends)
        for (std::size_t bs : blocks)
          for (int d : depths) {
            if (b == Backend::psync && d != depths.front()) continue;  // no queue: depth changes nothing
            // Reads before writes, and engine and fio take turns going first, so that neither side always
            // runs in the wake of the other's writes (a virtual disk may still be flushing them).
            const std::vector<Pattern> patterns = {Pattern::seq_read, Pattern::rand_read, Pattern::seq_write,
                                                   Pattern::rand_write};
            std::vector<double> ours, fio(patterns.size(), 0.0);
            const bool fio_first = combo++ % 2 == 1;
            if (have_fio && fio_first) fio = run.fio(b, patterns, bs, d, seconds, ramp);
            {
              auto engine = run.engine(b, bs, d);
              for (Pattern p : patterns) ours.push_back(run.ours(*engine, p, seconds, ramp));
            }
            if (have_fio && !fio_first) fio = run.fio(b, patterns, bs, d, seconds, ramp);
            for (std::size_t i = 0; i < patterns.size(); ++i) {
              const Pattern p = patterns[i];
              Point pt{b, p, bs, b == Backend::psync ? 1 : d};
              pt.ours = ours[i];
              pt.fio = fio[i];
              std::printf("%-9s %-10s %6s %5d %8.3f GB/s %6.3f GB/s %6.0f%%\n", to_string(b), to_string(p),
                          human(bs).c_str(), pt.depth, pt.ours, pt.fio, pt.ratio() * 100);
              std::fflush(stdout);
              points.push_back(pt);
            }
          }
    }

    // Headline: the given io_uring sequential read and write points, or the sweep's best, re-measured
    // alternately.
    nlohmann::ordered_json headline = nlohmann::ordered_json::object();
    if (std::find(backends.begin(), backends.end(), Backend::io_uring) != backends.end() && have_fio) {
      std::printf(
          "\nheadline: io_uring sequential points, %d alternating runs of %.2f s after a %.2f s ramp; "
          "medians, "
          "and the median ratio of adjacent engine/fio runs\n",
          reps, headline_seconds, headline_ramp);
      for (Pattern p : {Pattern::seq_read, Pattern::seq_write}) {
        Target t = p == Pattern::seq_read ? read_target : write_target;
        if (!t.given && !no_sweep) {
          const Point* best = nullptr;
          for (const Point& pt : points)
            if (pt.backend == Backend::io_uring && pt.pattern == p && (!best || pt.ours > best->ours))
              best = &pt;
          if (!best) continue;
          t.block = best->block;
          t.depth = best->depth;
        }
        auto engine = run.engine(Backend::io_uring, t.block, t.depth);
        std::vector<double> ours, fio;
        for (int r = 0; r < reps; ++r) {
          if (r % 2 == 0) {
            ours.push_back(run.ours(*engine, p, headline_seconds, headline_ramp));
            fio.push_back(run.fio(Backend::io_uring, p, t.block, t.depth, headline_seconds, headline_ramp));
          } else {
            fio.push_back(run.fio(Backend::io_uring, p, t.block, t.depth, headline_seconds, headline_ramp));
            ours.push_back(run.ours(*engine, p, headline_seconds, headline_ramp));
          }
        }
        // Each engine run sits next to a fio run in time, so the ratio of each pair cancels the slow
        // drift of a shared disk; the headline ratio is the median of those pair ratios.
        std::vector<double> pair;
        for (std::size_t i = 0; i < ours.size(); ++i)
          if (fio[i] > 0) pair.push_back(ours[i] / fio[i]);
        const double mo = median(ours), mf = median(fio), ratio = median(pair);
        std::printf("io_uring  %-10s %6s %5d %8.3f GB/s %6.3f GB/s %6.0f%%   (engine runs:", to_string(p),
                    human(t.block).c_str(), t.depth, mo, mf, 100 * ratio);
        for (double v : ours) std::printf(" %.3f", v);
        std::printf("; fio runs:");
        for (double v : fio) std::printf(" %.3f", v);
        std::printf(")\n");
        // Both sides count the bytes in flight when the window opens, up to block x depth moved before
        // it (measure() in nvme/tune.h): against a short window that decides the figure.
        const double inflight = mf > 0 ? double(t.block) * t.depth / (mf * 1e9 * headline_seconds) : 0;
        if (inflight > 0.05)
          std::printf(
              "          the %s in flight are %.0f%% of what a %.2f s window moves: ratios this short are "
              "not a comparison (raise --headline-seconds)\n",
              human(t.block * std::size_t(t.depth)).c_str(), 100 * inflight, headline_seconds);
        std::fflush(stdout);
        headline[to_string(p)] = {{"block", t.block},    {"depth", t.depth}, {"engine_gbps", mo},
                                  {"fio_gbps", mf},      {"ratio", ratio},   {"inflight_share", inflight},
                                  {"engine_runs", ours}, {"fio_runs", fio}};
      }
    }

    nlohmann::ordered_json j;
    j["bench"] = "nvme";
    j["cpu"] = cpu_model();
    j["file_bytes"] = scratch.bytes();
    j["direct"] = direct;
    j["fio"] = have_fio ? fio_version : "";
    j["seconds_per_point"] = seconds;
    j["ramp_per_point"] = ramp;
    j["headline_seconds"] = headline_seconds;
    j["headline_ramp"] = headline_ramp;
    j["headline"] = headline;
    nlohmann::ordered_json pts = nlohmann::ordered_json::array();
    for (const Point& pt : points)
      pts.push_back({{"backend", to_string(pt.backend)},
                     {"pattern", to_string(pt.pattern)},
                     {"block", pt.block},
                     {"depth", pt.depth},
                     {"engine_gbps", pt.ours},
                     {"fio_gbps", pt.fio},
                     {"ratio", pt.ratio()}});
    j["points"] = pts;
    std::printf("%s\n", j.dump().c_str());
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "nvme_bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
