// tier_bench: the tier manager against the physical limits measured in the same run.
//
//   tier_bench [--backend host] [--bytes 268435456] [--reps 9] [--layers 8] [--numel 16000000]
//              [--steps 1] [--pairs 4] [--nvme-path /tmp] [--trace tier_bench.memprof.jsonl]
//
// 1. Pinned <-> device moves. Ceiling: a plain copy of the same size between a pinned buffer and a
//    device buffer — memcpy (on the host backend the device's memory is host memory) and the device's
//    own stream copy (cudaMemcpyAsync on cuda), whichever is faster in that repetition. The move is
//    TierManager::fetch (pinned -> device) and evict (device -> pinned) of one tensor of --bytes, timed
//    from the call to Move::wait() returning.
// 2. NVMe. Ceiling: SwapStore writes and reads of the workload's largest tensor size from pinned memory,
//    without the manager.
// 3. A scripted ZeRO-Infinity workload (params and optimizer state on NVMe) that moves a few GiB per step
//    through all three tiers: forward fetches each layer's params NVMe -> pinned -> device (one layer
//    prefetched ahead), backward fetches them again and moves each layer's gradient device -> pinned,
//    the optimizer reads master / exp_avg / exp_avg_sq NVMe -> pinned (next layer prefetched), writes them
//    back and writes new params to NVMe. No compute: the figures are data movement alone, the worst case
//    for the trace writer's relative cost. Run --pairs times without and with the memprof trace writer,
//    interleaved; the trace of the last traced run is left at --trace for `memprof summary` / `memprof html`.
// 4. The trace writer's worst case: 64 KiB tensors moved back and forth as fast as the manager goes.
// Prints the tables, then one JSON line.
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "nvme/engine.h"
#include "nvme/swap_store.h"
#include "tiering/tiering.h"

namespace {

using namespace strata;
using namespace strata::tiering;
using Clock = std::chrono::steady_clock;

double now_s() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

// CPU seconds used by the whole process (all threads) so far.
double process_cpu_s() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double gbs(double bytes, double s) {
  return s > 0 ? bytes / s * 1e-9 : 0;
}

struct Opts {
  std::string backend = "host";
  std::size_t bytes = 256ull << 20;
  int reps = 9;
  int layers = 8;
  std::uint64_t numel = 16'000'000;
  int steps = 1;
  int pairs = 4;
  std::string nvme_path = "/tmp";
  std::string trace = "tier_bench.memprof.jsonl";
};

// ---------------------------------------------------------------- 1. pinned <-> device

// Per direction: a plain memcpy between a pinned buffer and a device buffer (host backend only: there the
// device's memory is host memory), the device's plain stream copy between them, and the manager's move.
struct Direction {
  double memcpy_gbs = 0, stream_gbs = 0, move_gbs = 0;
  double of_ceiling = 0;  // median over repetitions of (faster plain copy's time / move time)
};
struct CopyFigures {
  Direction up, down;  // pinned -> device, device -> pinned
};

// Everything is interleaved in every repetition, so that load from other processes on the machine hits
// the ceilings and the moves alike; the ratios are taken per repetition.
CopyFigures copy_ceiling_and_moves(Device& dev, const Opts& o) {
  const std::size_t n = o.bytes;
  const bool host = dev.caps().host_addressable;
  PinnedBuffer pbuf(dev, n);
  DeviceBuffer dbuf(dev, n, "copy ceiling");
  std::memset(pbuf.data(), 3, n);
  auto s = dev.create_stream("ceiling");
  s->memset_async(dbuf.data(), 0, n);
  s->synchronize();
  TierManager tm(dev, {.device_budget = 2 * n + (64 << 20),
                       .pinned_budget = 2 * n + (64 << 20),
                       .pinned_slab_bytes = 64 << 20});
  TensorId id = tm.register_tensor(
      {.name = "moved", .kind = Kind::param, .dtype = DType::u8, .bytes = n, .home = Tier::pinned});
  std::memset(tm.allocate(id, Tier::pinned), 5, n);
  tm.mark_written(id, Tier::pinned);

  struct Samples {
    std::vector<double> memcpy, stream, move, ratio;
  } up, down;
  auto plain = [&](Samples& out, void* dst, const void* src, CopyKind kind) {
    double m = 1e30;
    if (host) {
      double t0 = now_s();
      std::memcpy(dst, src, n);
      m = now_s() - t0;
      out.memcpy.push_back(m);
    }
    double t0 = now_s();
    s->copy_async(dst, src, n, kind);
    s->synchronize();
    double st = now_s() - t0;
    out.stream.push_back(st);
    return std::min(m, st);
  };
  for (int r = 0; r < o.reps + 1; ++r) {  // the first repetition warms caches, TLBs and the pools
    double ceil_up = plain(up, dbuf.data(), pbuf.data(), CopyKind::host_to_device);
    double t0 = now_s();
    tm.fetch(id, Tier::device).wait();  // pinned -> device, straight from the pinned block
    double t_up = now_s() - t0;
    tm.mark_written(id, Tier::device);  // the pinned copy is now stale, so the eviction must copy
    double ceil_down = plain(down, pbuf.data(), dbuf.data(), CopyKind::device_to_host);
    t0 = now_s();
    tm.evict(id, Tier::device, Tier::pinned).wait();  // device -> pinned, into the stale block
    double t_down = now_s() - t0;
    if (r == 0) {
      for (Samples* x : {&up, &down}) x->memcpy.clear(), x->stream.clear();
      continue;
    }
    up.move.push_back(t_up);
    down.move.push_back(t_down);
    up.ratio.push_back(ceil_up / t_up);
    down.ratio.push_back(ceil_down / t_down);
  }
  auto fig = [&](const Samples& x) {
    Direction d;
    d.memcpy_gbs = x.memcpy.empty() ? 0 : gbs(double(n), median(x.memcpy));
    d.stream_gbs = gbs(double(n), median(x.stream));
    d.move_gbs = gbs(double(n), median(x.move));
    d.of_ceiling = median(x.ratio);
    return d;
  };
  return {fig(up), fig(down)};
}

// ---------------------------------------------------------------- 2. NVMe ceiling

struct NvmeFigures {
  double write_gbs = 0, read_gbs = 0;
  std::string backend;
};

NvmeFigures nvme_ceiling(Device& dev, const Opts& o, std::uint64_t tensor_bytes) {
  nvme::AioEngine engine;
  NvmeFigures f;
  f.backend = nvme::to_string(engine.backend());
  const int k = std::max(4, int((1ull << 30) / tensor_bytes));  // about 1 GiB in all
  nvme::SwapStore store(engine, {.nvme_path = o.nvme_path, .capacity = k * tensor_bytes + (64 << 20)});
  PinnedBuffer buf(dev, tensor_bytes);
  std::memset(buf.data(), 7, tensor_bytes);
  std::vector<nvme::SwapExtent> ext;
  for (int i = 0; i < k; ++i) ext.push_back(store.allocate(tensor_bytes));
  double t0 = now_s();
  for (auto& e : ext) store.wait(store.write(e, buf.data()));
  double t1 = now_s();
  for (auto& e : ext) store.wait(store.read(e, buf.data()));
  double t2 = now_s();
  f.write_gbs = gbs(double(k) * tensor_bytes, t1 - t0);
  f.read_gbs = gbs(double(k) * tensor_bytes, t2 - t1);
  return f;
}

// ---------------------------------------------------------------- 3. the scripted workload

struct RunFigures {
  double seconds = 0, cpu_seconds = 0;
  std::uint64_t moved = 0, nvme_read = 0, nvme_written = 0;
  std::int64_t writer_cpu_ns = 0;
  std::uint64_t events = 0, evictions = 0;
  Snapshot end;
};

RunFigures run_workload(Device& dev, const Opts& o, bool traced) {
  nvme::AioEngine engine;
  const std::uint64_t N = o.numel;
  const std::uint64_t per_layer = N * (2 + 4 + 12);
  nvme::SwapStore store(engine,
                        {.nvme_path = o.nvme_path, .capacity = o.layers * per_layer + (512ull << 20)});
  TierManager tm(
      dev, {.device_budget = 12 * N + (32 << 20), .pinned_budget = 48 * N, .pinned_slab_bytes = 64 << 20},
      &store);
  std::vector<ShardTensors> L;
  for (int i = 0; i < o.layers; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "layers.%d", i);
    L.push_back(tm.register_shard(
        {.prefix = name,
         .chunk = i,
         .numel = N,
         .homes = {.param = Tier::nvme, .grad = Tier::pinned, .master = Tier::nvme, .optim = Tier::nvme}}));
    for (TensorId id : {L[i].param, L[i].master, L[i].exp_avg, L[i].exp_avg_sq}) {
      std::memset(tm.allocate(id, Tier::pinned), i + 1, tm.info(id).desc.bytes);
      tm.mark_written(id, Tier::pinned);
      tm.evict(id, Tier::pinned, Tier::nvme).wait();
    }
  }
  tm.synchronize();
  std::unique_ptr<TraceWriter> trace;
  if (traced)
    trace = std::make_unique<TraceWriter>(tm, TraceOptions{.path = o.trace, .sample_interval_ms = 10});
  auto stream = dev.create_stream("compute");
  Snapshot before = tm.snapshot(false);

  double t0 = now_s(), c0 = process_cpu_s();
  for (int step = 0; step < o.steps; ++step) {
    tm.set_step(step, Phase::forward);
    auto fetch_param = [&](int i) {
      tm.pin(L[i].param);
      return tm.fetch(L[i].param, Tier::device);
    };
    auto release_param = [&](int i) {
      tm.unpin(L[i].param);
      tm.evict(L[i].param, Tier::device, Tier::nvme);  // valid on NVMe: the device block is just freed
    };
    Move next = fetch_param(0);
    for (int i = 0; i < o.layers; ++i) {
      Move cur = next;
      if (i + 1 < o.layers) next = fetch_param(i + 1);
      cur.wait();
      release_param(i);
    }
    tm.set_step(step, Phase::backward);
    next = fetch_param(o.layers - 1);
    for (int i = o.layers - 1; i >= 0; --i) {
      Move cur = next;
      if (i > 0) next = fetch_param(i - 1);
      cur.wait();
      void* g = tm.allocate(L[i].grad, Tier::device);
      stream->memset_async(g, step + 1, tm.info(L[i].grad).desc.bytes);  // "the gradient"
      stream->synchronize();
      tm.mark_written(L[i].grad, Tier::device);
      tm.evict(L[i].grad, Tier::device, Tier::pinned);  // D2H into the fp32 gradient shard
      release_param(i);
    }
    tm.set_step(step, Phase::optimizer);
    auto fetch_states = [&](int i) {
      std::vector<Move> m;
      for (TensorId id : {L[i].master, L[i].exp_avg, L[i].exp_avg_sq}) {
        tm.pin(id);
        m.push_back(tm.fetch(id, Tier::pinned));
      }
      return m;
    };
    std::vector<Move> ahead = fetch_states(0);
    for (int i = 0; i < o.layers; ++i) {
      std::vector<Move> cur = std::move(ahead);
      if (i + 1 < o.layers) ahead = fetch_states(i + 1);
      for (Move& m : cur) m.wait();
      for (TensorId id : {L[i].master, L[i].exp_avg, L[i].exp_avg_sq}) {
        tm.mark_written(id, Tier::pinned);  // "updated by Adam"
        tm.unpin(id);
        tm.evict(id, Tier::pinned, Tier::nvme);
      }
      tm.allocate(L[i].param, Tier::pinned);  // the new bf16 params, written back to their home
      tm.mark_written(L[i].param, Tier::pinned);
      tm.evict(L[i].param, Tier::pinned, Tier::nvme);
    }
  }
  tm.synchronize();
  RunFigures f;
  f.seconds = now_s() - t0;
  f.cpu_seconds = process_cpu_s() - c0;
  if (trace) {
    trace->close();
    TraceStats ts = trace->stats();
    f.writer_cpu_ns = ts.writer_cpu_ns;
    f.events = ts.events;
  }
  f.end = tm.snapshot(false);
  for (int d = 0; d < kDirectionCount; ++d) {
    std::uint64_t b = f.end.moves[d].bytes - before.moves[d].bytes;
    f.moved += b;
    if (direction_from(d) == Tier::nvme) f.nvme_read += b;
    if (direction_to(d) == Tier::nvme) f.nvme_written += b;
  }
  f.evictions = f.end.evictions - before.evictions;
  return f;
}

// ---------------------------------------------------------------- 4. event-heavy worst case

// Small tensors moved pinned <-> device as fast as the manager goes: about ten ring events per round
// trip, so the trace writer's cost per event shows. Returns seconds per round trip; *writer_share gets
// the writer thread's CPU time over the run's wall time.
double small_moves(Device& dev, const Opts& o, bool traced, int rounds, double* writer_share) {
  TierManager tm(dev, {.device_budget = 64 << 20, .pinned_budget = 64 << 20, .pinned_slab_bytes = 8 << 20});
  const std::size_t n = 64 << 10;
  std::vector<TensorId> ids;
  for (int i = 0; i < 16; ++i) {
    ids.push_back(tm.register_tensor(
        {.name = "small", .kind = Kind::param, .dtype = DType::u8, .bytes = n, .home = Tier::pinned}));
    std::memset(tm.allocate(ids.back(), Tier::pinned), i, n);
    tm.mark_written(ids.back(), Tier::pinned);
  }
  std::unique_ptr<TraceWriter> trace;
  if (traced)
    trace =
        std::make_unique<TraceWriter>(tm, TraceOptions{.path = o.trace + ".small", .sample_interval_ms = 10});
  double t0 = now_s();
  for (int r = 0; r < rounds; ++r) {
    TensorId id = ids[std::size_t(r) % ids.size()];
    tm.fetch(id, Tier::device).wait();
    tm.mark_written(id, Tier::device);
    tm.evict(id, Tier::device, Tier::pinned).wait();
  }
  double dt = now_s() - t0;
  if (trace) {
    trace->close();
    *writer_share = double(trace->stats().writer_cpu_ns) * 1e-9 / dt;
  }
  return dt / rounds;
}

}  // namespace

int main(int argc, char** argv) {
  Opts o;
  CLI::App app{"tier_bench: tier manager moves against plain copies and raw NVMe I/O, and the trace cost"};
  app.add_option("--backend", o.backend, "device backend: host, cuda, auto")->capture_default_str();
  app.add_option("--bytes", o.bytes, "size of the pinned <-> device move")->capture_default_str();
  app.add_option("--reps", o.reps, "timed repetitions (median)")->capture_default_str();
  app.add_option("--layers", o.layers, "workload layers")->capture_default_str();
  app.add_option("--numel", o.numel, "parameters per layer shard")->capture_default_str();
  app.add_option("--steps", o.steps, "workload steps per run")->capture_default_str();
  app.add_option("--pairs", o.pairs, "runs without and with the trace writer, interleaved")
      ->capture_default_str();
  app.add_option("--nvme-path", o.nvme_path, "directory for the swap files")->capture_default_str();
  app.add_option("--trace", o.trace, "memprof trace of the last traced run")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    auto dev = open_device({.backend = o.backend});
    std::filesystem::create_directories(o.nvme_path);

    CopyFigures c = copy_ceiling_and_moves(*dev, o);
    std::printf("pinned <-> device, %zu MiB, medians of %d repetitions (backend %s)\n", o.bytes >> 20, o.reps,
                to_string(dev->caps().backend));
    std::printf("  %-16s %16s %16s %16s %14s\n", "direction", "plain memcpy", "plain stream", "TierManager",
                "of ceiling");
    for (auto [name, d] : {std::pair{"pinned -> device", c.up}, std::pair{"device -> pinned", c.down}})
      std::printf("  %-16s %11.2f GB/s %11.2f GB/s %11.2f GB/s %13.1f%%\n", name, d.memcpy_gbs, d.stream_gbs,
                  d.move_gbs, 100 * d.of_ceiling);
    std::printf(
        "  (ceiling: the faster plain copy of each repetition; memcpy only where device memory is host\n"
        "   memory; \"of ceiling\" is the median over repetitions of ceiling time / move time)\n\n");

    NvmeFigures nv = nvme_ceiling(*dev, o, o.numel * 4);
    std::printf("NVMe ceiling (SwapStore, %s, %llu MiB requests, %s)\n  write %.2f GB/s, read %.2f GB/s\n\n",
                nv.backend.c_str(), (unsigned long long)((o.numel * 4) >> 20), o.nvme_path.c_str(),
                nv.write_gbs, nv.read_gbs);

    std::vector<double> off, on, ratio, cpu_off, cpu_on, cpu_ratio;
    RunFigures last_on, last_off;
    for (int p = 0; p < o.pairs; ++p) {  // alternate the order so that drift in the load cancels
      for (bool traced : {p % 2 == 1, p % 2 == 0}) {
        RunFigures f = run_workload(*dev, o, traced);
        (traced ? on : off).push_back(f.seconds);
        (traced ? cpu_on : cpu_off).push_back(f.cpu_seconds);
        (traced ? last_on : last_off) = f;
      }
      ratio.push_back(on.back() / off.back() - 1);
      cpu_ratio.push_back(cpu_on.back() / cpu_off.back() - 1);
    }
    double t_off = median(off), t_on = median(on);
    double overhead = 100 * median(ratio), cpu_overhead = 100 * median(cpu_ratio);
    double writer_pct = 100 * double(last_on.writer_cpu_ns) * 1e-9 / last_on.seconds;
    std::printf(
        "Scripted workload: %d layers x %llu params, %d step(s), %.2f GiB moved per run "
        "(%.2f GiB NVMe read, %.2f GiB written), %llu evictions\n",
        o.layers, (unsigned long long)o.numel, o.steps, double(last_off.moved) / (1 << 30),
        double(last_off.nvme_read) / (1 << 30), double(last_off.nvme_written) / (1 << 30),
        (unsigned long long)last_off.evictions);
    std::printf("  %-10s %12s %12s %14s %14s\n", "pair", "off wall s", "on wall s", "off process",
                "on process");
    std::printf("  %-10s %12s %12s %14s %14s\n", "", "", "", "CPU s", "CPU s");
    for (int p = 0; p < o.pairs; ++p)
      std::printf("  %-10d %12.3f %12.3f %14.3f %14.3f\n", p, off[p], on[p], cpu_off[p], cpu_on[p]);
    std::printf("  median: trace off %.3f s (%.2f GB/s moved), trace on %.3f s, %llu events traced\n", t_off,
                gbs(double(last_off.moved), t_off), t_on, (unsigned long long)last_on.events);
    std::printf(
        "  trace writer cost: %+.2f%% wall time, %+.2f%% process CPU (medians of the pairs' on/off - 1);\n"
        "  the writer thread itself used %.4f s CPU = %.3f%% of the traced run\n",
        overhead, cpu_overhead, double(last_on.writer_cpu_ns) * 1e-9, writer_pct);
    std::printf("  trace written to %s\n\n", o.trace.c_str());

    const int rounds = 3000;
    std::vector<double> small_off, small_on, small_ratio, small_writer;
    for (int p = 0; p < 5; ++p) {
      for (bool traced : {p % 2 == 1, p % 2 == 0}) {
        double share = 0;
        (traced ? small_on : small_off).push_back(small_moves(*dev, o, traced, rounds, &share));
        if (traced) small_writer.push_back(share);
      }
      small_ratio.push_back(small_on.back() / small_off.back() - 1);
    }
    double small_pct = 100 * median(small_ratio);
    std::printf(
        "Event-heavy worst case: %d round trips of a 64 KiB tensor pinned -> device -> pinned\n"
        "  %.1f us per round trip without the trace, %.1f us with it: %+.2f%% (median of 5 pairs);\n"
        "  writer thread CPU %.2f%% of the traced runs' time\n\n",
        rounds, 1e6 * median(small_off), 1e6 * median(small_on), small_pct, 100 * median(small_writer));

    nlohmann::json j = {{"bench", "tier_bench"},
                        {"backend", to_string(dev->caps().backend)},
                        {"copy_bytes", o.bytes},
                        {"p2d_memcpy_gbs", c.up.memcpy_gbs},
                        {"p2d_stream_gbs", c.up.stream_gbs},
                        {"p2d_move_gbs", c.up.move_gbs},
                        {"p2d_of_ceiling", c.up.of_ceiling},
                        {"d2p_memcpy_gbs", c.down.memcpy_gbs},
                        {"d2p_stream_gbs", c.down.stream_gbs},
                        {"d2p_move_gbs", c.down.move_gbs},
                        {"d2p_of_ceiling", c.down.of_ceiling},
                        {"nvme_backend", nv.backend},
                        {"nvme_write_gbs", nv.write_gbs},
                        {"nvme_read_gbs", nv.read_gbs},
                        {"workload_moved_bytes", last_off.moved},
                        {"workload_s_trace_off", t_off},
                        {"workload_s_trace_on", t_on},
                        {"trace_overhead_pct", overhead},
                        {"trace_overhead_process_cpu_pct", cpu_overhead},
                        {"trace_writer_cpu_pct", writer_pct},
                        {"small_move_us", 1e6 * median(small_off)},
                        {"small_move_trace_overhead_pct", small_pct},
                        {"small_move_trace_writer_cpu_pct", 100 * median(small_writer)},
                        {"trace_events", last_on.events}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tier_bench: %s\n", e.what());
    return 1;
  }
}
