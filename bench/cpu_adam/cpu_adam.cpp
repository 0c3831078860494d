// bench/cpu_adam: params/s and effective GB/s of cpu_optim's updates against the physical ceiling for
// the same traffic, measured in the same run on the same threads (see loops.h), per SIMD target, dtype
// combination and thread count; plus an unfused multi-pass AdamW for scale. Prints a table and one
// JSON line.
//
// Bytes per element count what the update must move: reads of params (4), grads, exp_avg, exp_avg_sq
// and writes of params (4), exp_avg, exp_avg_sq and the output; e.g. 30 B for AdamW with fp32 states and
// grads and a bf16 output (DeepSpeed's fp32 case without the output is 28 B). The read-for-ownership of
// the output stream is not counted (non-temporal stores avoid it).
//
// Layout: every array has its own mapping, and array k starts k * --stagger bytes into it (default
// 4 KiB + 64 B). Arrays at the same offset within same-sized mappings sit a multiple of their size apart;
// on the machine of bench/RESULTS.md, arrays 256 MiB apart (the default 64Mi fp32 params) ran every loop,
// the ceiling too, at half speed, while any stagger, or tensors as PyTorch allocates them, did not. The
// default keeps that layout artefact out of the figures; --stagger 0 shows it.
//
// Method: each figure is the median (or, with --statistic min, the fastest) of --reps timed runs after
// one warm-up; the ceiling and the optimizer runs alternate, so load from other processes falls on both
// alike. The ceiling is the fastest of its variants: output written with plain or with non-temporal
// stores, each with and without the optimizer's software prefetch; the table names the one that won.
#include <sys/mman.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/cpu_adam/loops.h"
#include "core/error.h"
#include "cpu_optim/cpu_optim.h"

namespace co = strata::cpu_optim;
namespace sb = strata::bench;

namespace {

enum class Kind { adamw, adagrad, lion };

struct Combo {
  Kind kind;
  strata::DType grad, state;
  bool out;
  strata::DType out_dtype = strata::DType::bf16;
};

const char* kind_name(Kind k) {
  return k == Kind::adamw ? "adamw" : k == Kind::adagrad ? "adagrad" : "lion";
}
const char* short_name(strata::DType t) {
  return t == strata::DType::fp32 ? "f32" : t == strata::DType::bf16 ? "bf16" : "f16";
}

std::string combo_name(const Combo& c) {
  return std::string(kind_name(c.kind)) + " g" + short_name(c.grad) + " s" + short_name(c.state) + " o" +
         (c.out ? short_name(c.out_dtype) : "-");
}

// Bytes the update moves per element (see the top).
double bytes_per_elem(const Combo& c) {
  const double g = double(strata::dtype_bytes(c.grad)), s = double(strata::dtype_bytes(c.state));
  const double states = c.kind == Kind::adamw ? 2 : 1;
  return 4 + g + states * s + 4 + states * s + (c.out ? 2 : 0);
}

// Touched, optionally huge-page backed memory: `bytes` usable bytes starting `offset` bytes into a
// page-aligned mapping.
struct Region {
  void* base = nullptr;
  void* p = nullptr;
  std::size_t mapped = 0;
  Region(std::size_t bytes, bool huge, std::size_t offset) : mapped(bytes + offset) {
    base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    STRATA_SYS_CHECK(base != MAP_FAILED, "mmap of ", mapped, " bytes");
    if (huge) madvise(base, mapped, MADV_HUGEPAGE);
    std::memset(base, 0, mapped);
    p = static_cast<char*>(base) + offset;
  }
  ~Region() { munmap(base, mapped); }
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
};

bool g_use_min = false;  // --statistic min: the fastest run instead of the median

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (g_use_min) return v.front();
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double seconds(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a;
  f >> a;
  return a;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

struct Row {
  std::string target, combo, what;
  int threads;
  double bytes, params_per_s, ceiling_params_per_s;
  std::string ceiling;        // the ceiling variant that was fastest
  nlohmann::json variants{};  // Gparam/s of each ceiling variant
};

void print_row(const Row& r, const std::string& name) {
  std::printf("%-7s %-26s %3d %10.3f %9.1f %10.3f %9.1f %6.1f%%  %s\n", r.target.c_str(), name.c_str(),
              r.threads, r.params_per_s / 1e9, r.params_per_s * r.bytes / 1e9, r.ceiling_params_per_s / 1e9,
              r.ceiling_params_per_s * r.bytes / 1e9, 100 * r.params_per_s / r.ceiling_params_per_s,
              r.ceiling.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{"cpu_optim update throughput against the read-modify-write ceiling"};
  std::size_t n = std::size_t(64) << 20;
  int reps = 7;
  std::vector<std::string> targets;
  std::vector<int> thread_counts;
  bool huge = true, all_combos = false, unfused = true, stream_output = true;
  std::size_t stagger = 4096 + 64;
  app.add_option("-n,--params", n, "elements per shard (default 64Mi: far past the caches)");
  app.add_option("--reps", reps, "timed runs per figure (median reported)")->check(CLI::Range(1, 1000));
  app.add_option("--targets", targets,
                 "SIMD targets, or auto for the one the optimizer picks (default: every one this CPU runs)");
  app.add_option("--threads", thread_counts, "thread counts (default: 1 and all)");
  app.add_flag("!--no-hugepages", huge, "do not ask for transparent huge pages");
  app.add_option("--stagger", stagger,
                 "array k starts k times this many bytes into its mapping (default 4160; a multiple of 64)")
      ->check(CLI::Range(std::size_t(0), std::size_t(1) << 24));
  app.add_flag("--all-combos", all_combos, "every optimizer and dtype combination, not just the main ones");
  app.add_flag("!--no-unfused", unfused, "skip the unfused multi-pass AdamW");
  app.add_flag("!--no-stream-output", stream_output, "optimizer writes its output with ordinary stores");
  std::string statistic = "median";
  app.add_option("--statistic", statistic, "median (default) or min of the timed runs, for every figure")
      ->check(CLI::IsMember({"median", "min"}));
  std::vector<std::string> only;
  app.add_option("--only", only,
                 "run only the updates whose name contains one of these (e.g. \"adamw gf32 sf32 obf16\")");
  CLI11_PARSE(app, argc, argv);
  if (stagger % 64 != 0) {
    std::fprintf(stderr,
                 "cpu_adam: --stagger %zu is not a multiple of 64; give whole cache lines (e.g. 4160)\n",
                 stagger);
    return 2;
  }
  g_use_min = statistic == "min";
  n = (n + 4095) / 4096 * 4096;  // whole ranges of 64 elements for every thread count used here
  if (targets.empty()) targets = co::supported_targets();
  for (std::string& t : targets) {
    if (t == "auto") t = co::chosen_target("auto");  // what the optimizer picks on this CPU
  }
  const int cores = int(std::thread::hardware_concurrency());
  if (thread_counts.empty()) thread_counts = cores > 1 ? std::vector<int>{1, cores} : std::vector<int>{1};

  std::vector<Combo> combos = {
      {Kind::adamw, strata::DType::fp32, strata::DType::fp32, true},   // the headline case
      {Kind::adamw, strata::DType::fp32, strata::DType::fp32, false},  // DeepSpeed's fp32 case
      {Kind::adamw, strata::DType::bf16, strata::DType::fp32, true},
      {Kind::adamw, strata::DType::fp32, strata::DType::bf16, true},
      {Kind::adamw, strata::DType::fp16, strata::DType::fp32, true, strata::DType::fp16},
      {Kind::adagrad, strata::DType::fp32, strata::DType::fp32, true},
      {Kind::lion, strata::DType::fp32, strata::DType::fp32, true},
  };
  if (all_combos) {
    combos.clear();
    for (Kind k : {Kind::adamw, Kind::adagrad, Kind::lion})
      for (strata::DType g : {strata::DType::fp32, strata::DType::bf16, strata::DType::fp16})
        for (strata::DType s : {strata::DType::fp32, strata::DType::bf16})
          for (int o = 0; o < 3; ++o)
            combos.push_back({k, g, s, o != 0, o == 2 ? strata::DType::fp16 : strata::DType::bf16});
  }

  // One set of buffers at the largest layout, reused by every combination.
  // Array k starts k * stagger bytes into its own mapping (see --stagger).
  Region p(n * 4, huge, 0), g(n * 4, huge, stagger), m(n * 4, huge, 2 * stagger), v(n * 4, huge, 3 * stagger),
      out(n * 2, huge, 4 * stagger), tmp(n * 4, huge, 5 * stagger);
  const auto fill = [&](const Combo& c) {
    auto* pp = static_cast<float*>(p.p);
    for (std::size_t i = 0; i < n; ++i) {
      const float x = float(int(i % 2001) - 1000) * 1e-3f;
      pp[i] = 1.0f + x;
      const float gx = 0.01f * x + 1e-4f;
      if (c.grad == strata::DType::fp32)
        static_cast<float*>(g.p)[i] = gx;
      else if (c.grad == strata::DType::bf16)
        static_cast<std::uint16_t*>(g.p)[i] = strata::f32_to_bf16(gx);
      else
        static_cast<std::uint16_t*>(g.p)[i] = strata::f32_to_f16(gx);
      if (c.state == strata::DType::fp32) {
        static_cast<float*>(m.p)[i] = 0.0f;
        static_cast<float*>(v.p)[i] = 1e-6f;
      } else {
        static_cast<std::uint16_t*>(m.p)[i] = 0;
        static_cast<std::uint16_t*>(v.p)[i] = strata::f32_to_bf16(1e-6f);
      }
    }
  };

  std::printf(
      "cpu_adam: %zu params per shard, %d reps (%s), huge pages %s, arrays staggered by %zu B, output stores "
      "%s, load average %s\n",
      n, reps, statistic.c_str(), huge ? "requested" : "off", stagger, stream_output ? "streaming" : "plain",
      load_average().c_str());
  std::printf("machine: %s, %d cpus; SIMD targets compiled: ", cpu_model().c_str(), cores);
  for (const auto& t : co::compiled_targets()) std::printf("%s ", t.c_str());
  std::printf("\n\n%-7s %-26s %3s %10s %9s %10s %9s %7s  %s\n", "target", "update", "thr", "Gparam/s", "GB/s",
              "ceil Gp/s", "ceil GB/s", "frac", "fastest ceiling variant");

  std::vector<Row> rows;
  for (const std::string& target : targets) {
    const std::int64_t bit = sb::target_bit(target);
    STRATA_CHECK(bit != 0, "target ", target, " is not compiled into the benchmark");
    for (int threads : thread_counts) {
      co::Optimizer opt({.simd = target, .threads = threads, .pin = false, .stream_output = stream_output});
      for (const Combo& c : combos) {
        if (!only.empty() && std::none_of(only.begin(), only.end(), [&](const std::string& o) {
              return combo_name(c).find(o) != std::string::npos;
            })) {
          continue;
        }
        fill(c);
        co::Shard sh{.params = static_cast<float*>(p.p),
                     .grads = g.p,
                     .exp_avg = c.kind == Kind::adagrad ? nullptr : m.p,
                     .exp_avg_sq = c.kind == Kind::lion ? nullptr : v.p,
                     .out = c.out ? out.p : nullptr,
                     .n = n,
                     .grad_dtype = c.grad,
                     .state_dtype = c.state,
                     .out_dtype = c.out_dtype};
        sb::Arrays arr{static_cast<float*>(p.p),
                       g.p,
                       m.p,
                       v.p,
                       c.out ? out.p : nullptr,
                       nullptr,
                       c.grad == strata::DType::fp32 ? 0 : 1,
                       c.state == strata::DType::fp32 ? 0 : 1,
                       c.out ? 1 : 0,
                       c.kind == Kind::adamw ? 2 : 1};
        co::ShardStep st;
        std::int64_t step = 0;
        const auto run_opt = [&] {
          ++step;
          if (c.kind == Kind::adamw)
            opt.adam(st, {.lr = 1e-4f, .weight_decay = 0.01f}, step, sh, 0.5f);
          else if (c.kind == Kind::adagrad)
            opt.adagrad(st, {.lr = 1e-4f}, step, sh, 0.5f);
          else
            opt.lion(st, {.lr = 1e-6f}, step, sh, 0.5f);
        };
        // The ceiling loop adds the gradient (to v: its square) to every array; the optimizer runs that
        // alternate with it on the same data keep seeing finite params and non-negative second moments
        // (checked after the runs: NaN data would take the optimizer's rare repair path).
        const auto run_ceiling = [&](bool stream, bool prefetch) {
          opt.for_each_range(
              n, [&](std::size_t b, std::size_t e) { sb::ceiling_range(bit, arr, b, e, stream, prefetch); });
        };
        // Ceiling variants: [streamed output][software prefetch]; without an output only the first
        // row. The fastest variant's median is the ceiling.
        std::vector<double> t_opt, t_ceil_runs[2][2];
        const int n_stream = c.out ? 2 : 1;
        for (int s = 0; s < n_stream; ++s)
          for (int f = 0; f < 2; ++f) run_ceiling(s, f);
        run_opt();
        for (int r = 0; r < reps; ++r) {
          for (int s = 0; s < n_stream; ++s) {
            for (int f = 0; f < 2; ++f) {
              t_ceil_runs[s][f].push_back(seconds([&] { run_ceiling(s, f); }));
              if (s == 0 && f == 0) t_opt.push_back(seconds(run_opt));
            }
          }
        }
        const float* pp = static_cast<const float*>(p.p);
        STRATA_CHECK(std::all_of(pp, pp + n, [](float x) { return std::isfinite(x); }),
                     "the benchmark's params went non-finite during the runs of ", combo_name(c));
        double t_ceil = 1e300;
        std::string ceil_variant;
        nlohmann::json variants;
        for (int s = 0; s < n_stream; ++s) {
          for (int f = 0; f < 2; ++f) {
            const double t = median(t_ceil_runs[s][f]);
            const std::string name =
                std::string(s ? "streamed output" : "plain stores") + (f ? ", prefetch" : "");
            variants[name] = double(n) / t / 1e9;
            if (t < t_ceil) {
              t_ceil = t;
              ceil_variant = name;
            }
          }
        }
        const Row row{target,
                      combo_name(c),
                      "fused",
                      threads,
                      bytes_per_elem(c),
                      double(n) / median(t_opt),
                      double(n) / t_ceil,
                      ceil_variant,
                      variants};
        rows.push_back(row);
        print_row(row, row.combo);

        if (unfused && c.kind == Kind::adamw && c.grad == strata::DType::fp32 &&
            c.state == strata::DType::fp32 && c.out) {
          sb::Arrays ua = arr;
          ua.tmp = static_cast<float*>(tmp.p);
          const sb::UnfusedScalars s{0.5f, 1.0f - 1e-6f, 0.9f, 0.1f, 0.999f, 0.001f, 1.2f, 1e-8f, -1e-4f};
          const auto run_unfused = [&] {
            for (int pass = 0; pass < sb::kUnfusedPasses; ++pass) {
              opt.for_each_range(
                  n, [&](std::size_t b, std::size_t e) { sb::unfused_pass(bit, pass, ua, s, b, e); });
            }
          };
          std::vector<double> t_unf, t_ceil2;
          run_unfused();
          for (int r = 0; r < reps; ++r) {
            t_ceil2.push_back(seconds([&] { run_ceiling(false, false); }));
            t_unf.push_back(seconds(run_unfused));
          }
          const double t_plain = median(t_ceil2);
          const Row u{target,
                      combo_name(c),
                      "unfused",
                      threads,
                      bytes_per_elem(c),
                      double(n) / median(t_unf),
                      double(n) / std::min(t_plain, t_ceil),
                      t_plain < t_ceil ? "plain stores" : ceil_variant};
          rows.push_back(u);
          print_row(u, "unfused " + row.combo);
        }
      }
    }
  }

  nlohmann::json j;
  j["bench"] = "cpu_adam";
  j["params"] = n;
  j["reps"] = reps;
  j["statistic"] = statistic;
  j["cpu"] = cpu_model();
  j["cpus"] = cores;
  j["load_average"] = load_average();
  j["huge_pages"] = huge;
  j["stagger_bytes"] = stagger;
  j["stream_output"] = stream_output;
  for (const Row& r : rows) {
    j["results"].push_back({{"target", r.target},
                            {"update", r.combo},
                            {"kind", r.what},
                            {"threads", r.threads},
                            {"bytes_per_param", r.bytes},
                            {"gparams_per_s", r.params_per_s / 1e9},
                            {"gbytes_per_s", r.params_per_s * r.bytes / 1e9},
                            {"ceiling_gparams_per_s", r.ceiling_params_per_s / 1e9},
                            {"ceiling_gbytes_per_s", r.ceiling_params_per_s * r.bytes / 1e9},
                            {"fraction_of_ceiling", r.params_per_s / r.ceiling_params_per_s},
                            {"ceiling_variant", r.ceiling},
                            {"ceiling_variants_gparams_per_s", r.variants}});
  }
  std::printf("\n%s\n", j.dump().c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "cpu_adam: %s\n", e.what());
  return 1;
}
