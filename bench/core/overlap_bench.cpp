// overlap_bench: how far a copy on a stream overlaps work on the caller's thread, against full overlap
// measured in the same run. (Formerly a timed test; a time ratio is a measurement, not a pass/fail.)
//
//   overlap_bench [--backend host] [--bytes 268435456] [--reps 5]
//
// Per direction (h2d: pinned -> device, d2h: device -> pinned) and repetition, in this order:
//   copy    copy_async of --bytes on a stream, then synchronize()
//   busy    a fixed amount of arithmetic on the caller's thread (a dependent chain of adds), calibrated
//           once to take about as long as the copy
//   both    copy_async, the same busy work, then synchronize()
// ideal = max(copy, busy): the ceiling, both fully overlapped; serial = copy + busy: no overlap at all.
//   overlap     (serial - both) / (serial - ideal): 1 = the ideal, 0 = serial (below 0: worse than serial)
//   ideal/both  the speed of `both` as a fraction of the ideal
// Medians over the repetitions. On the host backend the copy is a memcpy on the stream's worker thread, so
// it needs a second free core to overlap; on cuda it is a DMA transfer. Prints the table and the load
// average (other work on the machine lowers the figures), then one JSON line.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"

namespace {

using namespace strata;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double load_average() {
  double l[1] = {-1};
  return ::getloadavg(l, 1) == 1 ? l[0] : -1;
}

volatile double g_sink = 0;

// `iters` dependent floating-point adds (not vectorised: strict FP order), the caller's "compute".
void busy(std::uint64_t iters) {
  double x = 0;
  for (std::uint64_t i = 0; i < iters; ++i) x += double(i & 1023) * 1e-9;
  g_sink = g_sink + x;
}

struct Row {
  const char* direction = "";
  double copy_s = 0, busy_s = 0, both_s = 0;
  double ideal_s() const { return std::max(copy_s, busy_s); }
  double serial_s() const { return copy_s + busy_s; }
  double overlap() const {
    const double room = serial_s() - ideal_s();
    return room > 0 ? (serial_s() - both_s) / room : 0;
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"overlap_bench: a stream copy overlapping the caller's work, against full overlap"};
  std::string backend = "host";
  std::size_t bytes = 256ull << 20;
  int reps = 5;
  app.add_option("--backend", backend, "Device backend: host or cuda");
  app.add_option("--bytes", bytes, "Bytes per copy")->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "Repetitions per direction (medians are reported)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    auto dev = open_device({.backend = backend});
    PinnedBuffer host(*dev, bytes);
    DeviceBuffer device(*dev, bytes, "overlap_bench");
    std::memset(host.data(), 1, bytes);
    auto s = dev->create_stream("overlap-bench");

    std::vector<Row> rows;
    for (const char* direction : {"h2d", "d2h"}) {
      const bool up = std::strcmp(direction, "h2d") == 0;
      auto copy = [&] {
        if (up)
          s->copy_async(device.data(), host.data(), bytes, CopyKind::host_to_device);
        else
          s->copy_async(host.data(), device.data(), bytes, CopyKind::device_to_host);
      };
      auto time_copy = [&] {
        const auto t = Clock::now();
        copy();
        s->synchronize();
        return seconds_since(t);
      };
      time_copy();  // warm: pages touched, the stream's worker started
      // Calibrate the busy work to the copy's median time: iterations per second from a short run, twice.
      const double target_s = median({time_copy(), time_copy(), time_copy()});
      std::uint64_t iters = 1 << 20;
      for (int round = 0; round < 2; ++round) {
        const auto t = Clock::now();
        busy(iters);
        iters = std::max<std::uint64_t>(1, std::uint64_t(double(iters) * target_s / seconds_since(t)));
      }
      std::vector<double> copy_s, busy_s, both_s;
      for (int r = 0; r < reps; ++r) {
        copy_s.push_back(time_copy());
        auto t = Clock::now();
        busy(iters);
        busy_s.push_back(seconds_since(t));
        t = Clock::now();
        copy();
        busy(iters);
        s->synchronize();
        both_s.push_back(seconds_since(t));
      }
      rows.push_back({.direction = direction,
                      .copy_s = median(copy_s),
                      .busy_s = median(busy_s),
                      .both_s = median(both_s)});
    }

    const double load = load_average();
    std::printf(
        "overlap_bench: %s backend (device %s), %zu MiB per copy, %d reps (medians), load average %.2f\n",
        backend.c_str(), dev->caps().name.c_str(), bytes >> 20, reps, load);
    std::printf("ceiling: ideal = max(copy, busy) of the same run, both fully overlapped\n");
    std::printf("%-5s %10s %10s %10s %10s %10s %10s %8s %10s\n", "dir", "copy ms", "copy GB/s", "busy ms",
                "both ms", "ideal ms", "serial ms", "overlap", "ideal/both");
    for (const Row& r : rows)
      std::printf("%-5s %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %8.2f %10.2f\n", r.direction,
                  r.copy_s * 1e3, double(bytes) / r.copy_s * 1e-9, r.busy_s * 1e3, r.both_s * 1e3,
                  r.ideal_s() * 1e3, r.serial_s() * 1e3, r.overlap(), r.ideal_s() / r.both_s);
    nlohmann::json out = {
        {"bench", "overlap"}, {"backend", backend},   {"device", dev->caps().name},        {"bytes", bytes},
        {"reps", reps},       {"load_average", load}, {"results", nlohmann::json::array()}};
    for (const Row& r : rows)
      out["results"].push_back({{"direction", r.direction},
                                {"copy_ms", r.copy_s * 1e3},
                                {"copy_gbs", double(bytes) / r.copy_s * 1e-9},
                                {"busy_ms", r.busy_s * 1e3},
                                {"both_ms", r.both_s * 1e3},
                                {"ideal_ms", r.ideal_s() * 1e3},
                                {"serial_ms", r.serial_s() * 1e3},
                                {"overlap", r.overlap()},
                                {"ideal_over_both", r.ideal_s() / r.both_s}});
    std::printf("%s\n", out.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "overlap_bench: error: %s\n", e.what());
    return 1;
  }
}
