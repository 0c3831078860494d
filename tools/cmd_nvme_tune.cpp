// `strata nvme-tune --path DIR [DIR...]`: DeepSpeed's ds_nvme_tune. Sweeps backend, block size, queue depth
// and threads on each DIR (one per drive, as a list-valued nvme_path stripes over them), prints GB/s per
// point and drive and the best `aio` settings as JSON to paste into a config. With several drives the
// best setting is the one whose slowest drive is fastest: a striped request ends with its slowest stripe.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "nvme/tune.h"
#include "tools/cli.h"

namespace strata::cli {
namespace {

using detail::cat;

struct TuneArgs {
  std::vector<std::string> paths;
  std::string file_size = "1G";
  double seconds = 1.0;
  std::vector<std::string> backends;
  std::string block_sizes = "1M,8M";
  std::string queue_depths = "8,32,128";
  std::string threads = "1,2";
  bool full = false, quick = false, buffered = false;
};

// "4096", "256K", "1M", "2G" (powers of 1024).
std::uint64_t parse_size(const std::string& s, const char* what) {
  std::size_t used = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = s.substr(used);
  std::uint64_t mul = unit.empty() || unit == "B"  ? 1
                      : unit == "K" || unit == "k" ? 1ull << 10
                      : unit == "M" || unit == "m" ? 1ull << 20
                      : unit == "G" || unit == "g" ? 1ull << 30
                                                   : 0;
  if (used == 0 || mul == 0 || v == 0)
    throw ConfigError(cat("nvme-tune ", what, ": \"", s, "\" is not a size such as 4096, 256K, 1M or 2G"));
  return v * mul;
}

template <typename T, typename F>
std::vector<T> parse_list(const std::string& s, F one) {
  std::vector<T> out;
  std::size_t at = 0;
  while (at <= s.size()) {
    std::size_t comma = s.find(',', at);
    std::string item = s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (!item.empty()) out.push_back(one(item));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

int parse_int(const std::string& s, const char* what) {
  try {
    std::size_t used = 0;
    int v = std::stoi(s, &used);
    if (used == s.size() && v > 0) return v;
  } catch (const std::exception&) {
  }
  throw ConfigError(cat("nvme-tune ", what, ": \"", s, "\" is not a positive integer"));
}

void print_point(const nvme::TunePoint& p) {
  // psync has no queue, so its depth is not a setting that was measured.
  std::string depth = p.opts.backend == nvme::Backend::psync ? "-" : std::to_string(p.opts.queue_depth);
  std::printf("  %-9s %6s %6s %7d %6s %7s %9.3f %9.3f %9.3f\n", nvme::to_string(p.opts.backend),
              format_size(p.opts.block_size, 0).c_str(), depth.c_str(), p.opts.intra_op_parallelism,
              p.opts.single_submit ? "yes" : "no", p.opts.overlap_events ? "yes" : "no", p.read_gbps,
              p.write_gbps, p.combined_gbps());
  std::fflush(stdout);
}

bool same_setting(const nvme::AioOptions& a, const nvme::AioOptions& b) {
  return a.backend == b.backend && a.block_size == b.block_size && a.queue_depth == b.queue_depth &&
         a.intra_op_parallelism == b.intra_op_parallelism && a.single_submit == b.single_submit &&
         a.overlap_events == b.overlap_events;
}

// Several drives: per setting measured on all of them, the slowest drive's combined rate; the setting
// where that is highest. `rate` is set to it (the stripe set moves about drives x rate).
const nvme::TunePoint* best_for_stripes(const std::vector<nvme::TuneResult>& per_drive, double* rate) {
  const nvme::TunePoint* best = nullptr;
  *rate = 0;
  for (const nvme::TunePoint& p : per_drive.front().points) {
    double slowest = p.combined_gbps();
    for (std::size_t d = 1; d < per_drive.size(); ++d) {
      const auto& pts = per_drive[d].points;
      auto it = std::find_if(pts.begin(), pts.end(),
                             [&](const nvme::TunePoint& q) { return same_setting(p.opts, q.opts); });
      slowest = it == pts.end() ? 0 : std::min(slowest, it->combined_gbps());
    }
    if (slowest > *rate) *rate = slowest, best = &p;
  }
  return best;
}

int run_tune(const TuneArgs& a) {
  nvme::TuneOptions t;
  t.file_bytes = parse_size(a.file_size, "--file-size");
  t.seconds = a.seconds;
  t.direct = !a.buffered;
  for (const std::string& b : a.backends) t.backends.push_back(nvme::parse_backend(b));
  t.block_sizes = parse_list<std::size_t>(
      a.block_sizes, [](const std::string& s) { return std::size_t(parse_size(s, "--block-sizes")); });
  t.queue_depths =
      parse_list<int>(a.queue_depths, [](const std::string& s) { return parse_int(s, "--queue-depths"); });
  t.threads = parse_list<int>(a.threads, [](const std::string& s) { return parse_int(s, "--threads"); });
  if (a.full) {  // DeepSpeed's tuner space and then some
    t.block_sizes = {256u << 10, 1u << 20, 4u << 20, 8u << 20};
    t.queue_depths = {8, 32, 64, 128};
    t.threads = {1, 2, 4, 8};
    t.single_submit = {false, true};
    t.overlap_events = {true, false};
  } else if (a.quick) {
    t.block_sizes = {1u << 20};
    t.queue_depths = {8, 32};
    t.threads = {1};
    t.seconds = std::min(t.seconds, 0.5);
  }
  t.on_point = print_point;

  // Checked before the banner, so that a wrong path is the only thing printed.
  std::error_code ec;
  for (const std::string& path : a.paths)
    if (!std::filesystem::is_directory(path, ec))
      throw IoError(cat("nvme-tune --path ", path,
                        ": not a directory (or not reachable); give a directory on the drive to measure"));
  std::string all_paths;
  for (const std::string& path : a.paths) all_paths += (all_paths.empty() ? "" : ", ") + path;

  std::size_t per_backend = t.block_sizes.size() * t.queue_depths.size() * t.threads.size() *
                            t.single_submit.size() * t.overlap_events.size();
  std::printf(
      "nvme-tune: sweeping up to %zu settings per backend on %s, %.1f s of writing and %.1f s of reading "
      "each, on a "
      "%s scratch file.\n"
      "WARNING: every point writes to the drive at full speed for %.1f s; the whole sweep can write tens of "
      "GB. SSDs "
      "wear out with writes (rated in TBW / drive writes per day): run this once per machine, not in a "
      "loop.\n\n",
      per_backend, all_paths.c_str(), t.seconds, t.seconds, a.file_size.c_str(), t.seconds);
  auto line = [](const char* what, const nvme::TunePoint& p) {
    std::printf("%-14s %s, block %s, depth %d, threads %d: read %.3f GB/s, write %.3f GB/s\n", what,
                nvme::to_string(p.opts.backend), format_size(p.opts.block_size, 0).c_str(),
                p.opts.queue_depth, p.opts.intra_op_parallelism, p.read_gbps, p.write_gbps);
  };
  std::vector<nvme::TuneResult> per_drive;
  for (const std::string& path : a.paths) {  // one drive at a time: each measured alone
    if (a.paths.size() > 1) std::printf("%s\n", path.c_str());
    std::printf("  %-9s %6s %6s %7s %6s %7s %9s %9s %9s\n", "backend", "block", "depth", "threads", "single",
                "overlap", "read GB/s", "write GB/s", "combined");
    t.dir = path;
    std::vector<std::string> skipped;
    per_drive.push_back(nvme::tune(t, &skipped));
    const nvme::TuneResult& r = per_drive.back();
    for (const std::string& s : skipped) std::printf("  skipped %s\n", s.c_str());
    std::printf("\n");
    line("best read:", r.best_read);
    line("best write:", r.best_write);
    line("best overall:", r.best);
    std::printf("\nwrote %.2f GB to %s during the sweep (removed).\n\n", double(r.bytes_written) / 1e9,
                path.c_str());
  }
  const nvme::TunePoint* best = &per_drive.front().best;
  if (per_drive.size() > 1) {
    double rate = 0;
    best = best_for_stripes(per_drive, &rate);
    if (!best) throw IoError(cat("nvme-tune: no setting worked on every drive of ", all_paths));
    std::printf(
        "Striped over the %zu drives, a request ends with its slowest stripe: the setting whose slowest "
        "drive "
        "is fastest moves about %.3f GB/s combined per drive, %.3f GB/s in all.\n",
        per_drive.size(), rate, rate * double(per_drive.size()));
  }
  std::printf(
      "Best aio config (read and write weighted equally, as optimizer swap uses them); paste into your "
      "ds_config.json:\n%s\n",
      best->opts.to_config_json().c_str());
  return 0;
}

Command nvme_tune(
    "nvme-tune", "Measure NVMe throughput on a directory and print the best aio settings (ds_nvme_tune)",
    [](CLI::App& sub) {
      auto a = std::make_shared<TuneArgs>();
      sub.add_option("--path", a->paths,
                     "Directory on the NVMe drive (a scratch file is created there); several: one per drive, "
                     "each measured")
          ->required();
      sub.add_option("--file-size", a->file_size, "Scratch file size (e.g. 1G)")->capture_default_str();
      sub.add_option("--seconds", a->seconds, "Seconds per point and direction")->capture_default_str();
      sub.add_option("--backend", a->backends,
                     "Backends to sweep: io_uring, libaio, psync (default: all that work here)");
      sub.add_option("--block-sizes", a->block_sizes, "Comma-separated block sizes")->capture_default_str();
      sub.add_option("--queue-depths", a->queue_depths, "Comma-separated queue depths")
          ->capture_default_str();
      sub.add_option("--threads", a->threads, "Comma-separated intra_op_parallelism values")
          ->capture_default_str();
      sub.add_flag("--full", a->full,
                   "Wide sweep: blocks 256K-8M, depths 8-128, threads 1-8, single_submit and "
                   "overlap_events both ways");
      sub.add_flag("--quick", a->quick, "Small sweep: 1M blocks, depths 8 and 32, one thread");
      sub.add_flag("--buffered", a->buffered, "Measure without O_DIRECT");
      return [a] { return run_tune(*a); };
    });

}  // namespace
}  // namespace strata::cli
