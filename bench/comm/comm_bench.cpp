// comm_bench: collective bandwidth against message size, nccl-tests style, for the communicator
// make_communicator picks (mpi on the host backend, nccl on cuda), next to memcpy of the same bytes.
//
//   mpirun -np 2 comm_bench [--backend host] [--dtype fp32] [--min-bytes 1KiB] [--max-bytes 64MiB]
//                           [--iters 0 (auto)] [--ops all_gather,reduce_scatter,all_reduce]
//
// Per op and size (size = the larger buffer's bytes, as nccl-tests count it: all_gather's recv,
// reduce_scatter's send, all_reduce's buffer):
//   time     mean of `iters` back-to-back calls, the slowest rank's (all_reduce_max of the ranks' times)
//   algbw    size / time
//   busbw    algbw x (N-1)/N for all_gather and reduce_scatter, x 2(N-1)/N for all_reduce: the traffic
//            one link carries in a bandwidth-optimal algorithm, comparable across N
//   memcpy   the ceiling: every rank copies `size` bytes between two buffers of its device at the same
//            time (memcpy on host, cudaMemcpy-like device copy on a stream on cuda), slowest rank's time
// Prints the table, then one JSON line (rank 0 only).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "core/device.h"
#include "core/error.h"

namespace {

using namespace strata;
using Clock = std::chrono::steady_clock;

std::size_t parse_bytes(const std::string& s) {
  std::size_t i = 0;
  const double v = std::stod(s, &i);
  std::string unit = s.substr(i);
  double m = 1;
  if (unit == "KiB" || unit == "K")
    m = 1024.0;
  else if (unit == "MiB" || unit == "M")
    m = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G")
    m = 1024.0 * 1024 * 1024;
  else if (!unit.empty() && unit != "B")
    throw ConfigError("byte size '" + s + "': unit is not B, KiB, MiB or GiB");
  return std::size_t(v * m);
}

struct Row {
  std::string op;
  std::size_t bytes = 0;
  int iters = 0;
  double time_s = 0, algbw = 0, busbw = 0, memcpy_bw = 0;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"comm_bench: collective bandwidth against message size (run under mpirun)"};
  std::string backend = "host", dtype_s = "fp32", min_s = "1KiB", max_s = "64MiB";
  std::string ops_s = "all_gather,reduce_scatter,all_reduce";
  int iters_opt = 0;
  app.add_option("--backend", backend, "Device backend: host or cuda");
  app.add_option("--dtype", dtype_s, "Element type: fp32, bf16, fp16");
  app.add_option("--min-bytes", min_s, "Smallest size");
  app.add_option("--max-bytes", max_s, "Largest size (x4 steps)");
  app.add_option("--iters", iters_opt, "Calls per size (0: about 0.2 s worth, 3..1000)");
  app.add_option("--ops", ops_s, "Comma-separated: all_gather, reduce_scatter, all_reduce");
  CLI11_PARSE(app, argc, argv);
  try {
    DType dtype;
    if (!parse_dtype(dtype_s, &dtype) || !dtype_is_float(dtype))
      throw ConfigError("--dtype " + dtype_s + ": not fp32, bf16 or fp16");
    auto dev = open_device({.backend = backend});
    auto world = comm::make_communicator(*dev);
    auto stream = dev->create_stream("comm-bench");
    const int W = world->world_size(), me = world->rank();
    const std::size_t es = dtype_bytes(dtype);
    const std::size_t max_bytes = parse_bytes(max_s), min_bytes = std::max(parse_bytes(min_s), es * W);
    // Two device buffers of the largest size: the collectives' send and recv, and memcpy's src and dst.
    DeviceBuffer a(*dev, max_bytes, "comm_bench send"), b(*dev, max_bytes, "comm_bench recv");
    stream->memset_async(a.data(), 0, max_bytes);  // values do not matter; zeros stay finite
    stream->memset_async(b.data(), 0, max_bytes);
    stream->synchronize();

    std::vector<std::string> ops;
    {
      std::stringstream ss(ops_s);
      for (std::string op; std::getline(ss, op, ',');) ops.push_back(op);
    }
    // One call of `op` over `bytes` (the larger buffer), on the stream.
    auto issue = [&](const std::string& op, std::size_t bytes) {
      const std::size_t n = bytes / es, per_rank = n / W;
      if (op == "all_gather")
        world->all_gather(a.data(), b.data(), per_rank, dtype, stream.get());
      else if (op == "reduce_scatter")
        world->reduce_scatter(a.data(), b.data(), per_rank, dtype, comm::ReduceOp::sum, stream.get());
      else if (op == "all_reduce")
        world->all_reduce(a.data(), b.data(), n, dtype, comm::ReduceOp::sum, stream.get());
      else if (op == "memcpy")
        stream->copy_async(b.data(), a.data(), bytes, CopyKind::device_to_device);
      else
        throw ConfigError("--ops: '" + op + "' is not all_gather, reduce_scatter or all_reduce");
    };
    // Mean seconds per call over the slowest rank; iters chosen from one timed call (the same on all ranks).
    auto measure = [&](const std::string& op, std::size_t bytes, int* iters_out) {
      world->barrier();
      auto t0 = Clock::now();
      issue(op, bytes);  // warm-up (and the estimate)
      stream->synchronize();
      double one = world->all_reduce_max(std::chrono::duration<double>(Clock::now() - t0).count());
      int iters = iters_opt > 0 ? iters_opt : std::clamp(int(0.2 / std::max(one, 1e-7)), 3, 1000);
      world->barrier();
      t0 = Clock::now();
      for (int i = 0; i < iters; ++i) issue(op, bytes);
      stream->synchronize();
      const double t = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
      *iters_out = iters;
      return world->all_reduce_max(t);
    };

    std::vector<Row> rows;
    for (const std::string& op : ops) {
      for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
        const std::size_t used = bytes / es / W * W * es;  // a multiple of world elements
        Row r{.op = op, .bytes = used};
        r.time_s = measure(op, used, &r.iters);
        int memcpy_iters = 0;
        r.memcpy_bw = double(used) / measure("memcpy", used, &memcpy_iters) / 1e9;
        r.algbw = double(used) / r.time_s / 1e9;
        const double f = op == "all_reduce" ? 2.0 * (W - 1) / W : double(W - 1) / W;
        r.busbw = r.algbw * f;
        rows.push_back(r);
      }
    }
    if (me == 0) {
      std::printf("comm_bench: %s communicator, %d ranks, %s, %s backend (device %s)\n", world->name(), W,
                  dtype_name(dtype), backend.c_str(), dev->caps().name.c_str());
      std::printf("%-15s %10s %6s %12s %10s %10s %12s %8s\n", "op", "size", "iters", "time us", "algbw GB/s",
                  "busbw GB/s", "memcpy GB/s", "bus/mcpy");
      for (const Row& r : rows)
        std::printf("%-15s %10s %6d %12.1f %10.2f %10.2f %12.2f %8.2f\n", r.op.c_str(),
                    format_size(r.bytes, 0).c_str(), r.iters, r.time_s * 1e6, r.algbw, r.busbw, r.memcpy_bw,
                    r.busbw / r.memcpy_bw);
      nlohmann::json out = {{"bench", "comm"},    {"communicator", world->name()},
                            {"world", W},         {"dtype", dtype_name(dtype)},
                            {"backend", backend}, {"results", nlohmann::json::array()}};
      for (const Row& r : rows)
        out["results"].push_back({{"op", r.op},
                                  {"bytes", r.bytes},
                                  {"iters", r.iters},
                                  {"time_us", r.time_s * 1e6},
                                  {"algbw_gbs", r.algbw},
                                  {"busbw_gbs", r.busbw},
                                  {"memcpy_gbs", r.memcpy_bw}});
      std::printf("%s\n", out.dump().c_str());
    }
    stream->synchronize();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_bench: error: %s\n", e.what());
    comm::abort_all(1);
  }
}
