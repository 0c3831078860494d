// `strata train`: trains a Llama-style model with the ZeRO-3 offload engine from a DeepSpeed config.
//
//   strata train --config configs/zero3_cpu.json --model 10m --text book.txt --steps 200 --save ckpt
//   strata train --config ds.json --model configs/models/1b.json --data train.bin --steps 20
//                --backend host --device-memory-cap 1GiB --load ckpt       (one command line)
//
// On a terminal the last line is a progress bar (step, loss, tokens/s, the step's time split into
// forward / backward / optimizer / waiting on transfers, bytes per tier); otherwise one plain log line per
// steps_per_print steps. A summary follows the last step. With csv_monitor enabled the same figures go to
// CSV files every step, at full precision (session/csv_monitor.h). Everything a bad argument or config can
// get wrong fails before the first step.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "config/config.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/cpu/ops.h"
#include "model/eval.h"
#include "model/hf_dir.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "session/adapters.h"
#include "session/session.h"
#include "tools/cli.h"
#include "tools/launch_plan.h"
#include "zero3/checkpoint.h"
#include "zero3/engine.h"

namespace strata::cli {
namespace {

using detail::cat;
using Clock = std::chrono::steady_clock;

struct TrainOpts {
  std::string config, model, init_from, data, text;
  std::int64_t steps = -1, max_steps = -1;  // -1: not given (exactly one of them and epochs is)
  double epochs = 0;                        // 0: not given
  std::string save, load, load_tag, export_path, eval_data;
  std::string adapter, export_merged;  // LoRA: the adapters to start from; the merged model's destination
  std::int64_t save_interval = 0, eval_interval = 0, eval_batches = 0;
  int seq_len = 0;
  std::string backend, device_cap;
  std::vector<std::string> sets;
  bool progress = true;
};

std::string duration(double s) {
  char b[32];
  if (s < 60)
    std::snprintf(b, sizeof b, "%.0fs", s);
  else if (s < 3600)
    std::snprintf(b, sizeof b, "%dm%02ds", int(s) / 60, int(s) % 60);
  else
    std::snprintf(b, sizeof b, "%dh%02dm", int(s) / 3600, int(s) % 3600 / 60);
  return b;
}

// The global step of the checkpoint --load will read; 0 when it cannot be told here (the engine's load
// then says why).
std::int64_t checkpoint_step(const std::string& dir, const std::string& tag) {
  try {
    const std::string t = tag.empty() ? zero3::latest_tag(dir) : tag;
    for (const zero3::CheckpointTag& c : zero3::complete_checkpoints(dir))
      if (c.tag == t) return c.step;
  } catch (const Error&) {
  }
  return 0;
}

// A temporary token file for --text, removed when the run ends.

// Note [Stop signals]: SIGINT and SIGTERM (what a preemptible machine sends before it takes the machine
// back) let the step in progress finish; the run then saves its checkpoint when --save was given, prints
// its summary, releases the device, pinned memory and swap files, and exits 128 + the signal (130 / 143).
// A second signal exits at once. With several ranks they agree after every step on whether any rank was
// signalled, so all stop after the same step (the save is collective). SIGUSR1 and SIGUSR2 stop the run
// too, as SIGTERM and SIGINT: they are what `strata launch` sends for those, since mpirun forwards them to
// every rank without ending the job (Note [Launcher signals] in tools/cmd_launch.cpp); `kill -USR1` to a
// plain mpirun's pid stops its ranks the same way.
std::atomic<int> g_stop_signal{0};  // SIGINT or SIGTERM once signalled (a SIGUSR2 / SIGUSR1 as those)
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_stop_signal(int sig) {
  const int as = stop_signal_from(sig);
  if (g_stop_signal.exchange(as) != 0) ::_exit(128 + as);
}

const char* signal_name(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal";
}

// Installs on_stop_signal for SIGINT, SIGTERM, SIGUSR1 and SIGUSR2 for the lifetime of the object.
class StopSignals {
 public:
  StopSignals() {
    struct sigaction sa = {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int i = 0; i < kCount; ++i) ::sigaction(kSignals[i], &sa, &old_[i]);
  }
  ~StopSignals() {
    for (int i = 0; i < kCount; ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  static constexpr int kCount = 4;
  static constexpr int kSignals[kCount] = {SIGINT, SIGTERM, SIGUSR1, SIGUSR2};
  struct sigaction old_[kCount] = {};
};

struct TempTokens {
  std::string path;
  ~TempTokens() {
    if (!path.empty()) std::remove(path.c_str());
  }
};

// The swap files' I/O summed over the training steps: bytes each way and the drive's busy seconds.
struct NvmeSteps {
  std::uint64_t read = 0, written = 0;
  double busy = 0;
  void add(const nvme::IoStats& before, const nvme::IoStats& after) {
    read += after.bytes_read - before.bytes_read;
    written += after.bytes_written - before.bytes_written;
    busy += after.busy_seconds - before.busy_seconds;
  }
};

using session::TierBytes;

class Progress {
 public:
  Progress(std::int64_t total, std::int64_t first, bool tty, std::int64_t every, std::FILE* out)
      : total_(total),
        first_(first),
        tty_(tty),
        every_(std::max<std::int64_t>(1, every)),
        out_(out),
        t0_(Clock::now()) {}

  void update(const zero3::StepResult& r, const TierBytes& b) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - t0_).count();
    const std::int64_t done = r.step - first_;
    const double eta = done > 0 ? elapsed / double(done) * double(total_ - done) : 0;
    const zero3::StepTimes& t = r.times;
    const double tps = t.total > 0 ? double(r.tokens) / t.total : 0;
    char line[512];
    if (tty_) {
      const int width = 20,
                fill = int(double(width) * double(done) / double(std::max<std::int64_t>(1, total_)));
      std::string bar(std::size_t(fill), '#');
      bar.resize(std::size_t(width), '-');
      std::snprintf(
          line, sizeof line,
          "\r\033[K[%s] step %lld/%lld  loss %#.6g%s  lr %.3g  grad_norm %.3f  %.0f tok/s  %.2fs (fwd %.2f "
          "bwd %.2f opt %.2f wait %.2f)  dev %s pin %s nvme %s  ETA %s",
          bar.c_str(), (long long)r.step, (long long)(first_ + total_), r.loss, r.applied ? "" : " (skipped)",
          r.lr, r.grad_norm, tps, t.total, t.forward, t.backward, t.optimizer, t.wait,
          format_size(b.device, 1).c_str(), format_size(b.pinned, 1).c_str(), format_size(b.nvme, 1).c_str(),
          duration(eta).c_str());
      std::fputs(line, stderr);
      std::fflush(stderr);
      return;
    }
    if (done != 1 && done != total_ && done % every_ != 0) return;
    std::snprintf(
        line, sizeof line,
        "step %lld/%lld loss %#.6g%s lr %.3g grad_norm %.3f scale %g tok/s %.0f time %.3fs fwd %.3f bwd "
        "%.3f opt %.3f wait %.3f | device %s pinned %s nvme %s\n",
        (long long)r.step, (long long)(first_ + total_), r.loss, r.applied ? "" : " (skipped)", r.lr,
        r.grad_norm, r.loss_scale, tps, t.total, t.forward, t.backward, t.optimizer, t.wait,
        format_size(b.device, 1).c_str(), format_size(b.pinned, 1).c_str(), format_size(b.nvme, 1).c_str());
    std::fputs(line, out_);
    std::fflush(out_);
  }
  void finish() {
    if (tty_) std::fputs("\n", stderr);
  }

 private:
  std::int64_t total_, first_;
  bool tty_;
  std::int64_t every_;
  std::FILE* out_;
  Clock::time_point t0_;
};

// The parts of a run that its start lines, its loop and its summary share, set up by run_train.
struct TrainRun {
  const TrainOpts& o;
  const Config& cfg;
  const model::ModelConfig& mcfg;
  zero3::Engine& engine;
  model::TrainableModel& model;
  model::DataLoader& data;
  const model::TokenFile& file;
  std::optional<model::TokenFile>& eval_file;
  int seq_len = 0, world = 1;
  std::FILE* out = nullptr;     // rank 0's stdout; the others' a sink
  session::Monitors& monitors;  // csv_monitor and tensorboard (Note [Monitors] in session/monitors.cpp)
};

// What the loop leaves for the summary.
struct LoopTotals {
  std::vector<double> losses;
  zero3::StepTimes sum;
  std::int64_t tokens_seen = 0, skipped = 0;
  NvmeSteps io;
  std::string saved;   // the last checkpoint written
  int stopped_by = 0;  // the stop signal that ended the run before its last step; 0: it ran them all
  double wall = 0;
  std::vector<double> step_seconds;  // each step's time (the prediction's check)
};

// Before the first step: the run in one line, the loss mask, the memory plan and each chunk's update route.
void print_start(const TrainRun& run, std::int64_t steps, std::int64_t first) {
  const Config& cfg = run.cfg;
  const model::ModelConfig& mcfg = run.mcfg;
  zero3::Engine& engine = run.engine;
  const int seq_len = run.seq_len, world = run.world;
  std::FILE* out = run.out;
  const model::TokenFile& file = run.file;
  const model::DataLoader& data = run.data;
  std::fprintf(
      out,
      "train: %s, %lld parameters%s, %d x %d tokens x %d accumulation per step x %d rank%s, %lld steps from "
      "step %lld, offload param %s / optimizer %s, device %s (%s)\n",
      mcfg.name.c_str(), (long long)mcfg.num_parameters(),
      mcfg.lora.active() ? cat(mcfg.lora.nf4_base ? " (frozen, NF4)" : " (frozen)", " + ",
                               model::lora_parameters(mcfg), " in LoRA adapters of rank ", mcfg.lora.r)
                               .c_str()
                         : "",
      engine.micro_batch(), seq_len, engine.accumulation_steps(), world, world > 1 ? "s" : "",
      (long long)steps, (long long)first, zero3::offload_name(cfg.zero_optimization.offload_param.device),
      zero3::offload_name(cfg.zero_optimization.offload_optimizer.device),
      engine.device().caps().name.c_str(), format_size(engine.device().caps().capacity, 1).c_str());
  // A loss mask (model/loss_mask.h): how many of the samples' targets count, and how steps weigh them.
  if (const model::LossMask* mask = file.mask()) {
    const std::int64_t all = data.sample_targets(), counted = data.counted_targets();
    std::fprintf(out, "loss mask: %s: %lld of %lld targets count (%.1f%%); strata.loss_weighting %s\n",
                 mask->path().c_str(), (long long)counted, (long long)all,
                 all > 0 ? 100.0 * double(counted) / double(all) : 0.0,
                 cfg.strata.loss_weighting == StrataConfig::LossWeighting::tokens
                     ? "tokens (a step's loss is the mean over its counted targets)"
                     : "micro_batches (a step's loss is the mean of its micro-batches' means)");
  }
  // Document boundaries (model/packed_docs.h): packed documents kept apart.
  if (const model::PackedDocs* docs = file.docs())
    std::fprintf(out,
                 "documents: %s: %zu documents kept apart (attention within each, rotary positions from 0 in "
                 "each, a document's first token not a target)\n",
                 docs->path().c_str(), docs->size());
  std::fputs(zero3::describe(engine.plan(), zero3::shard_homes(cfg).grad, world > 1).c_str(), out);
  // How each chunk is updated (Note [Update routes] in zero3/placement.cpp), in runs of equal routes.
  std::fprintf(out, "update routes%s:\n%s\n", world > 1 ? " (each rank)" : "",
               zero3::describe(engine.update_routes(), "  ").c_str());

  std::fflush(out);

  std::fflush(out);
}

// `steps` optimizer steps from global step `first`: progress, metrics, evaluations, interval checkpoints,
// and a stop signal between steps (Note [Stop signals]).
LoopTotals train_loop(TrainRun& run, std::int64_t steps, std::int64_t first, bool tty,
                      const nlohmann::json& client_state) {
  const TrainOpts& o = run.o;
  const Config& cfg = run.cfg;
  zero3::Engine& engine = run.engine;
  const int seq_len = run.seq_len, world = run.world;
  std::FILE* out = run.out;
  model::TrainableModel& model = run.model;
  model::DataLoader& data = run.data;
  std::optional<model::TokenFile>& eval_file = run.eval_file;
  LoopTotals t;
  auto& [losses, sum, tokens_seen, skipped, io, saved, stopped_by, wall, step_seconds] = t;
  Progress progress(steps, first, tty, cfg.steps_per_print, out);
  const auto t0 = Clock::now();
  for (std::int64_t i = 0; i < steps; ++i) {
    const nvme::IoStats io0 = engine.nvme_stats();
    const zero3::StepResult r = engine.train_batch(model, data);
    io.add(io0, engine.nvme_stats());
    losses.push_back(r.loss);
    sum.forward += r.times.forward, sum.backward += r.times.backward, sum.optimizer += r.times.optimizer;
    sum.wait += r.times.wait, sum.total += r.times.total;
    step_seconds.push_back(r.times.total);
    tokens_seen += r.tokens;
    skipped += r.applied ? 0 : 1;
    progress.update(r, session::tier_bytes(engine));
    run.monitors.write_step(engine, r);
    const bool eval_now =
        eval_file && ((o.eval_interval > 0 && (i + 1) % o.eval_interval == 0) || i + 1 == steps);
    if (eval_now) {
      progress.finish();
      const model::EvalResult e =
          model::evaluate(model, engine, *eval_file, seq_len, int(engine.micro_batch()), o.eval_batches);
      if (eval_file->mask())
        std::fprintf(out, "eval step %lld loss %.9g ppl %.9g tokens %lld counted %lld\n", (long long)r.step,
                     e.loss, e.ppl, (long long)e.tokens, (long long)e.counted);
      else
        std::fprintf(out, "eval step %lld loss %.9g ppl %.9g tokens %lld\n", (long long)r.step, e.loss, e.ppl,
                     (long long)e.tokens);
      std::fflush(out);
      run.monitors.write_eval(r.step, e.loss);
    }
    if (!o.save.empty() && o.save_interval > 0 && (i + 1) % o.save_interval == 0 && i + 1 < steps) {
      progress.finish();
      saved = engine.save_checkpoint(o.save, client_state, &data);
    }
    stopped_by = g_stop_signal.load();
    if (world > 1) stopped_by = int(engine.communicator().all_reduce_max(double(stopped_by)));
    if (stopped_by != 0 && i + 1 < steps) {
      progress.finish();
      STRATA_LOG_WARN(
          "train: ", signal_name(stopped_by), " after step ", r.step,
          o.save.empty() ? ": stopping (no --save: nothing is saved)" : ": saving a checkpoint and stopping");
      break;
    }
    stopped_by = 0;  // signalled during the last step: the run ends as usual
  }
  progress.finish();
  wall = std::chrono::duration<double>(Clock::now() - t0).count();
  return t;
}

// After the last step: losses, step times, prefetch, memory peaks (the largest over the ranks), attention,
// the overlap, bytes moved, NVMe traffic, and every file the run wrote.
void print_summary(const TrainRun& run, const LoopTotals& t) {
  const Config& cfg = run.cfg;
  const model::ModelConfig& mcfg = run.mcfg;
  zero3::Engine& engine = run.engine;
  const int seq_len = run.seq_len, world = run.world;
  std::FILE* out = run.out;
  const auto& [losses, sum, tokens_seen, skipped, io, saved, stopped_by, wall, step_seconds] = t;
  TierBytes peak;
  // Memory figures: the tier manager's peaks over the whole run (every block in use at once, gathered
  // chunks and staging included — not the state between steps), the largest over the ranks.
  // The accounting's per-tier peak: the counter memprof's trace replays, so `memprof summary` of this
  // run's trace shows the same figures (tests/tools/summary_peaks_test.sh).
  {
    const tiering::Snapshot snap = engine.tiers().snapshot(/*with_events=*/false);
    peak.device = snap.tiers[int(tiering::Tier::device)].total.peak;
    peak.pinned = snap.tiers[int(tiering::Tier::pinned)].total.peak;
    peak.nvme = snap.tiers[int(tiering::Tier::nvme)].total.peak;
  }
  comm::Communicator& cm = engine.communicator();
  peak.device = std::uint64_t(cm.all_reduce_max(double(peak.device)));
  peak.pinned = std::uint64_t(cm.all_reduce_max(double(peak.pinned)));
  peak.nvme = std::uint64_t(cm.all_reduce_max(double(peak.nvme)));
  const double device_peak = cm.all_reduce_max(double(engine.device().memory_stats().peak_in_use));

  const prefetch::PrefetchStats& ps = engine.prefetch_stats();
  const std::size_t n = losses.size();
  auto mean = [&](std::size_t from, std::size_t to) {
    double s = 0;
    for (std::size_t i = from; i < to; ++i) s += losses[i];
    return s / double(std::max<std::size_t>(1, to - from));
  };
  const std::size_t k = std::max<std::size_t>(1, n / 10);
  std::fprintf(out, "\nsummary: %lld steps (%lld skipped) in %s, %lld tokens, %.0f tokens/s\n", (long long)n,
               (long long)skipped, duration(wall).c_str(), (long long)tokens_seen,
               wall > 0 ? double(tokens_seen) / wall : 0.0);
  if (n > 0) {  // (--steps 0: set up, save or export only)
    std::fprintf(out, "  loss        %#.6g -> %#.6g (mean of the first / last %zu steps: %#.6g -> %#.6g)\n",
                 losses.front(), losses.back(), k, mean(0, k), mean(n - k, n));
    std::fprintf(
        out,
        "  step time   %.3fs mean: forward %.3f, backward %.3f, optimizer %.3f; waiting on transfers %.3f\n",
        sum.total / double(n), sum.forward / double(n), sum.backward / double(n), sum.optimizer / double(n),
        sum.wait / double(n));
    // The step-time model's prediction against the median of the steps after the first two (the first
    // steps fill the caches and trace the prefetcher's order; zero3/step_time.h).
    const zero3::StepPrediction& pred = engine.predicted_step();
    if (pred.step > 0) {
      std::vector<double> later(step_seconds.begin() + std::ptrdiff_t(std::min<std::size_t>(2, n - 1)),
                                step_seconds.end());
      std::nth_element(later.begin(), later.begin() + std::ptrdiff_t(later.size() / 2), later.end());
      const double median = later[later.size() / 2];
      // Two decimals, three under a tenth of a second, so that a short step's figures still differ.
      const int digits = std::min(pred.step, median) < 0.1 ? 3 : 2;
      std::fprintf(out,
                   "  step time   predicted %.*fs, measured %.*fs (median of %zu step%s%s; bottleneck %s)\n",
                   digits, pred.step, digits, median, later.size(), later.size() == 1 ? "" : "s",
                   n > 2 ? " after the first two" : "", pred.bottleneck.c_str());
    }
  }
  std::fprintf(out,
               "  prefetch    %llu hits, %llu late (%.3fs waited), %llu misses, %llu trace invalidations\n",
               (unsigned long long)ps.hits, (unsigned long long)ps.late, ps.late_wait_s,
               (unsigned long long)ps.misses, (unsigned long long)ps.invalidations);
  std::fprintf(
      out, "  memory      %speak in use: device %s, pinned %s, nvme %s (device peak allocated %s of %s)\n",
      world > 1 ? "largest rank's " : "", format_size(peak.device).c_str(), format_size(peak.pinned).c_str(),
      format_size(peak.nvme).c_str(), format_size(std::uint64_t(device_peak), 1).c_str(),
      format_size(engine.device().caps().capacity, 1).c_str());
  if (engine.plan().activation_offload) {
    const zero3::Engine::CheckpointMoves cm = engine.checkpoint_moves();
    std::fprintf(
        out,
        "  activations block inputs in pinned host memory: %s (activation_checkpointing.cpu_checkpointing); "
        "%llu copied out in forward, %llu back in backward\n",
        format_size(engine.plan().pinned_activations, 1).c_str(), (unsigned long long)cm.out,
        (unsigned long long)cm.back);
  }
  // What attention computed with at the training shape (a fallback was also a warning when chosen), for
  // the windowed layers apart when the model has both kinds (Note [Sliding windows] in model/config.h).
  {
    int windowed = 0, window = 0;
    for (std::int64_t l = 0; l < mcfg.n_layers; ++l)
      if (const std::int64_t w = mcfg.window_of(l); w > 0) ++windowed, window = int(w);
    const bool documents = run.file.docs() != nullptr;  // packed documents kept apart (model/packed_docs.h)
    const auto path = [&](int w) {
      return engine.ops().attention_path(engine.micro_batch(), seq_len, int(mcfg.n_heads),
                                         int(mcfg.n_kv_heads), int(mcfg.head_dim()), w, documents);
    };
    if (windowed == 0)
      std::fprintf(out, "  attention   %s\n", path(0).c_str());
    else if (windowed == int(mcfg.n_layers))
      std::fprintf(out, "  attention   %s (sliding window %d)\n", path(window).c_str(), window);
    else
      std::fprintf(out, "  attention   %s; %d layers in a sliding window of %d: %s\n", path(0).c_str(),
                   windowed, window, path(window).c_str());
  }
  if (engine.plan().overlap_groups > 0) {
    const zero3::OverlapStats& os = engine.overlap_stats();
    std::fprintf(out,
                 "  optimizer   overlapped with backward: %llu of %lld steps kept their early updates, %llu "
                 "rolled back (%.3fs undoing), %llu waited, %llu cancelled; %llu chunk updates overlapped "
                 "with the next forward\n",
                 (unsigned long long)os.steps, (long long)n, (unsigned long long)os.rollbacks,
                 os.rollback_seconds, (unsigned long long)os.waited, (unsigned long long)os.cancelled,
                 (unsigned long long)os.deferred);
  }
  const tiering::Snapshot snap = engine.tiers().snapshot(false);
  const zero3::TransferStats& ts = engine.transfer_stats();
  std::fprintf(out, "  moved       gathers %s (%llu chunks), gradients off the device %s (%llu shards);",
               format_size(ts.gather_bytes, 1).c_str(), (unsigned long long)ts.gathers,
               format_size(ts.grad_offload_bytes, 1).c_str(), (unsigned long long)ts.grad_offloads);
  for (int d = 0; d < tiering::kDirectionCount; ++d)
    if (snap.moves[std::size_t(d)].count)
      std::fprintf(out, " %s %s;", tiering::direction_name(d),
                   format_size(snap.moves[std::size_t(d)].bytes, 1).c_str());
  std::fprintf(out, "\n");
  // The swap files' I/O during the steps (not setup, evaluation or checkpoints): what a step reads and
  // writes, and the rate while the drive had work (bench/RESULTS.md compares it with fio's).
  if (n > 0 && io.read + io.written > 0) {
    const double per = 1.0 / double(n);
    std::fprintf(out,
                 "  nvme        %sper step: read %s, written %s; the drive busy %.3fs of the step's %.3fs, "
                 "%.2f GB/s while busy\n",
                 world > 1 ? "rank 0's " : "", format_size(std::uint64_t(double(io.read) * per), 1).c_str(),
                 format_size(std::uint64_t(double(io.written) * per), 1).c_str(), io.busy * per,
                 sum.total * per, io.busy > 0 ? double(io.read + io.written) / io.busy / 1e9 : 0.0);
  }
  if (!saved.empty()) std::fprintf(out, "  checkpoint  %s\n", saved.c_str());
  // Every file the run wrote outside the directories the command line named (the config's trace).
  if (const std::string& trace = cfg.strata.memprof.path; !trace.empty())
    std::fprintf(out, "  trace       %s (strata.memprof.path; `memprof summary %s`)\n",
                 std::filesystem::absolute(trace).string().c_str(), trace.c_str());
  for (const std::string& d : run.monitors.destinations()) std::fprintf(out, "  metrics     %s\n", d.c_str());
}

int run_train(const TrainOpts& o) {
  // From the start (Note [Stop signals]): a signal during the set-up (tokenizing --text, writing the initial
  // state to NVMe) ends the run before its first step, through the destructors that remove the temporary
  // token file and the swap files.
  StopSignals stop_signals;
  if (int(o.steps >= 0) + int(o.max_steps >= 0) + int(o.epochs > 0) != 1)
    throw ConfigError(
        "give exactly one of --steps N (N more optimizer steps), --max-steps N (train until global step N: "
        "the same command starts a run and resumes it with --load) or --epochs E (train until E passes over "
        "the data, counted from step 0 as --max-steps)");
  if (o.model.empty() == o.init_from.empty())
    throw ConfigError(
        "give exactly one of --model PRESET_OR_JSON (fresh weights) or --init-from "
        "MODEL_DIR_OR_SAFETENSORS (a Hugging Face model's weights: docs/model.md lists the families)");
  if (o.data.empty() == o.text.empty())
    throw ConfigError("give exactly one of --data tokens.bin or --text file.txt");
  // The files to read, named with what to give instead (a strata::Error, as every bad argument).
  const std::pair<const char*, const std::string*> inputs[] = {
      {"--data", &o.data}, {"--text", &o.text}, {"--eval-data", &o.eval_data}};
  for (const auto& [flag, path] : inputs)
    if (!path->empty() && !std::filesystem::is_regular_file(*path))
      throw ConfigError(
          cat(flag, " ", *path, ": ", std::filesystem::exists(*path) ? "not a regular file" : "no such file",
              std::string(flag) == "--text"
                  ? "; give a text file to train on"
                  : "; give a token file (llm.c .bin or flat uint16; scripts/tokenize_text.py makes "
                    "one with a model's own tokenizer)"));
  // Under mpirun every rank runs this; rank 0 prints the progress, log lines and summary.
  const comm::RankInfo ri = session::ranks();
  if (o.save_interval > 0 && o.save.empty())
    throw ConfigError("--save-interval needs --save DIR (where the checkpoints go)");
  if ((o.eval_interval > 0 || o.eval_batches > 0) && o.eval_data.empty())
    throw ConfigError(
        "--eval-interval and --eval-batches need --eval-data FILE (the token file to evaluate on)");
  if (!o.text.empty() && std::filesystem::file_size(o.text) == 0)
    throw ConfigError(cat("--text ", o.text, " is empty; give a text file to train on"));
  // --init-from: the model's config and, chunk by chunk, its weights (memory-mapped; checked up front).
  session::ModelSource src;
  if (!o.init_from.empty()) {
    src.hf = model::open_hf_model(o.init_from);
    src.config = src.hf->config;
  } else {
    src = session::open_model(o.model, session::Weights::fresh_only);
  }
  const model::ModelConfig& mcfg = src.config;
  const std::optional<model::HfModel>& hf = src.hf;
  // Note [Resuming from nothing]: --load DIR where DIR holds no checkpoint yet (missing, empty, or without
  // a `latest` pointer and no --load-tag) starts fresh, saying so, so that one command line serves a
  // preemptible job's first start and its restarts (with --save DIR and --max-steps). A DIR that is not
  // a directory, or a --load-tag that does not exist, is still refused when the engine loads.
  bool resume = !o.load.empty();
  if (resume && o.load_tag.empty()) {
    std::error_code ec;
    const std::filesystem::path dir(o.load);
    if (!std::filesystem::exists(dir, ec) ||
        (std::filesystem::is_directory(dir, ec) && !std::filesystem::exists(dir / "latest", ec))) {
      // Checkpoints without a pointer are not "nothing": refused.
      if (!zero3::complete_checkpoints(o.load).empty())
        throw ConfigError(cat("--load ", o.load,
                              " holds checkpoint directories but no `latest` pointer; "
                              "name one with --load-tag TAG"));
      resume = false;
      STRATA_LOG_INFO("train: --load ", o.load, " holds no checkpoint yet: starting fresh",
                      o.save == o.load ? " (--save writes there)" : "");
    }
  }
  if (hf && !o.text.empty() && !hf->dir.empty())
    for (const char* f : {"tokenizer.json", "tokenizer.model"})
      if (std::filesystem::exists(std::filesystem::path(hf->dir) / f))
        throw ConfigError(cat("--text tokenizes bytes, but ", o.init_from, " has its own tokenizer (", f,
                              "): make a token file with `python3 scripts/tokenize_text.py --tokenizer ",
                              o.init_from,
                              " --out tokens.bin TEXT...` and train on it with --data tokens.bin"));
  const int seq_len = session::resolve_seq_len(mcfg, o.seq_len, "--seq-len");
  const std::uint64_t device_cap =
      o.device_cap.empty() ? 0 : parse_byte_size(o.device_cap, "--device-memory-cap");

  TempTokens tmp;
  std::string tokens = o.data;
  if (!o.text.empty()) {
    if (mcfg.vocab_size < model::ByteTokenizer::kVocabSize)
      throw ConfigError(cat("--text uses the byte tokenizer (256 tokens); model '", mcfg.name,
                            "' has vocab_size ", mcfg.vocab_size,
                            ". Use a model with vocab_size >= 256 or a token file (--data)"));
    const char* dir = std::getenv("TMPDIR");
    std::string pattern = std::string(dir && *dir ? dir : "/tmp") + "/strata-tokens-XXXXXX";
    int fd = ::mkstemp(pattern.data());
    STRATA_SYS_CHECK(fd >= 0, "create a temporary token file ", pattern);
    ::close(fd);
    tmp.path = pattern;
    const std::size_t n = model::ByteTokenizer::text_file_to_tokens(o.text, tmp.path);
    STRATA_LOG_INFO("train: ", o.text, ": ", n, " bytes as tokens");
    tokens = tmp.path;
  }
  model::TokenFile file = model::TokenFile::open(tokens);
  // The token file is mapped: its name can go now, so that no kill leaves it behind.
  if (!tmp.path.empty()) std::remove(tmp.path.c_str()), tmp.path.clear();

  // The run's length, which a schedule's total_num_steps "auto" takes (Note [Loud auto] in
  // config/config.cpp): --steps counts on from the checkpoint --load resumes, --max-steps and --epochs
  // count from step 0.
  RunFacts run;
  const std::int64_t resume_step = resume ? checkpoint_step(o.load, o.load_tag) : 0;
  if (o.steps >= 0) {
    run.total_steps = resume_step + o.steps;
    run.from =
        resume_step > 0 ? cat("--steps ", o.steps, " after step ", resume_step) : cat("--steps ", o.steps);
  } else if (o.max_steps >= 0) {
    run.total_steps = o.max_steps;
    run.from = cat("--max-steps ", o.max_steps);
  } else {
    run.epochs = o.epochs;
    run.micro_batches_per_epoch = [&](std::int64_t micro_batch) {
      return model::DataLoader(file, session::loader_shape(int(micro_batch), seq_len, ri.rank, ri.world_size))
          .batches_per_epoch();
    };
    char e[32];
    std::snprintf(e, sizeof e, "%g", o.epochs);
    run.from = cat("--epochs ", e);
  }
  Config cfg = session::resolve_config({.path = o.config}, session::parse_sets(o.sets), mcfg, ri, run);
  // LoRA adapters (session/adapters.h): strata.lora's, or those of --adapter DIR; the base is then frozen.
  cfg.strata.lora.adapter_dir = o.adapter;
  session::resolve_adapters(src, cfg.strata.lora, o.adapter, "--adapter");
  const bool adapters = mcfg.lora.active();
  if (!o.export_merged.empty() && !adapters)
    throw ConfigError(
        "--export-merged writes the model with its adapters merged, and this run has none "
        "(strata.lora or --adapter DIR); --export writes the model");
  if (adapters && o.export_path.ends_with(".safetensors"))
    throw ConfigError(
        cat("--export ", o.export_path,
            ": with adapters --export writes a PEFT adapter directory (adapter_config.json, "
            "adapter_model.safetensors); give a directory, and --export-merged NAME.safetensors "
            "for the merged model in one file"));
  if (!o.export_merged.empty()) session::check_outputs({.export_to = {o.export_merged, "--export-merged"}});
  // Where the run will write, created and probed now rather than after the training (Note [Outputs up
  // front] in session/session.cpp); the monitors' folders are rank 0's.
  const session::OutputPlan outputs{.save = {o.save, "--save"},
                                    .export_to = {o.export_path, "--export"},
                                    .trace = cfg.strata.memprof.path,
                                    .monitors = session::monitor_outputs(cfg, ri.rank)};
  session::check_outputs(outputs);
  session::Trainer trainer = session::build(
      cfg, src, seq_len, ri,
      // A checkpoint of adapters holds them, not the base: a resume reads the base again.
      {.backend = o.backend,
       .device_memory_cap = device_cap,
       .documents = file.docs() != nullptr,  // the plan counts the attention that keeps them apart
       .read_weights = !resume || adapters});
  zero3::Engine& engine = *trainer.engine;
  model::TrainableModel& model = *trainer.model;
  const int rank = engine.communicator().rank(), world = engine.communicator().world_size();
  const bool lead = rank == 0;
  model::DataLoader data(
      file, session::loader_options(engine, cfg, mcfg, seq_len,
                                    {.source = o.text.empty() ? o.data : cat("--text ", o.text)}));
  // --eval-data: strata eval's loss (model/eval.h) over the held-out file, on the engine's own weights,
  // every --eval-interval steps and at the end. Every rank evaluates the same sequences (the engine's
  // gathers are collective); rank 0 prints. Checked now, before any step.
  std::optional<model::TokenFile> eval_file;
  if (!o.eval_data.empty()) {
    eval_file.emplace(model::TokenFile::open(o.eval_data));
    model::check_eval_inputs(mcfg, *eval_file, seq_len, int(engine.micro_batch()), o.eval_batches);
  }
  // Room for the checkpoints --save and the model --export will write, checked before training rather
  // than at the end.
  session::check_output_room(outputs, session::output_sizes(engine, ri), ri.local_size);
  // Note [Resuming from nothing]: every rank decided from its own view of --load; they must agree, or one
  // would load (collectively) while another starts fresh.
  if (world > 1 && !o.load.empty()) {
    comm::Communicator& cm = engine.communicator();
    if (cm.all_reduce_and(resume) != !cm.all_reduce_and(!resume))
      throw ConfigError(cat("--load ", o.load,
                            ": some ranks see a checkpoint there and others do not; give a "
                            "folder every rank reads (a shared file system)"));
  }
  if (resume) engine.load_checkpoint(o.load, o.load_tag, &data);
  // Signalled during the set-up: stop before the first step (every rank, as they agree).
  int early = g_stop_signal.load();
  if (world > 1) early = int(engine.communicator().all_reduce_max(double(early)));
  if (early != 0) {
    STRATA_LOG_WARN("train: ", signal_name(early),
                    " before the first step: stopping (nothing trained, nothing saved)");
    return 128 + early;
  }

  const bool tty = lead && o.progress && ::isatty(STDERR_FILENO);
  const std::int64_t first = engine.global_step();
  // --max-steps N and --epochs E: the steps left to global step N, or to the last of E epochs (none when
  // the checkpoint is already there).
  const std::int64_t target =
      o.epochs > 0 ? run_total_steps(run, engine.micro_batch(), engine.accumulation_steps()) : o.max_steps;
  const std::int64_t steps = target >= 0 ? std::max<std::int64_t>(0, target - first) : o.steps;
  if (o.epochs > 0)
    STRATA_LOG_INFO("train: ", run.from, ": ", data.batches_per_epoch(),
                    " micro-batches an epoch on each rank, ",
                    std::max<std::int64_t>(1, data.batches_per_epoch() / engine.accumulation_steps()),
                    " optimizer steps an epoch (accumulation ", engine.accumulation_steps(),
                    "), to global step ", target);
  if (target >= 0 && first >= target)
    STRATA_LOG_INFO("train: the run is at global step ", first, ", ", run.from, " ends at step ", target,
                    ": nothing left to train");
  // Output from rank 0 only: the others write to a sink.
  std::FILE* out = lead ? stdout : std::fopen("/dev/null", "w");
  STRATA_SYS_CHECK(out != nullptr, "open /dev/null");
  // csv_monitor: a new run replaces an earlier run's files; a resumed one keeps their rows up to the
  // checkpoint's step column (its step x this run's samples per step) and continues them. tensorboard: one
  // event file per run in the job's folder (a resumed run adds its own). Rank 0's only.
  session::Monitors monitors(cfg, engine, resume ? std::optional<std::int64_t>(first) : std::nullopt);
  TrainRun run_parts{o, cfg, mcfg, engine, model, data, file, eval_file, seq_len, world, out, monitors};
  print_start(run_parts, steps, first);
  // What `strata export` of a checkpoint needs to know besides the weights: where the tokenizer files are.
  nlohmann::json client_state = {{"source", "strata train"}};
  if (hf && !hf->dir.empty()) client_state["init_from"] = std::filesystem::absolute(hf->dir).string();
  LoopTotals totals = train_loop(run_parts, steps, first, tty, client_state);
  if (!o.save.empty()) totals.saved = engine.save_checkpoint(o.save, client_state, &data);
  if (adapters && totals.stopped_by == 0) {
    if (!o.export_path.empty()) {
      session::export_adapter(engine, o.export_path, src);
      std::fprintf(out, "exported the adapters to %s (PEFT adapter directory)\n", o.export_path.c_str());
    }
    if (!o.export_merged.empty()) {
      session::export_merged(engine, o.export_merged, src);
      std::fprintf(out, "exported the model with its adapters merged to %s\n", o.export_merged.c_str());
    }
  } else if (!o.export_path.empty() && totals.stopped_by == 0) {
    if (zero3::export_model(engine, o.export_path, hf ? hf->dir : std::string()))
      std::fprintf(out, "exported weights to %s\n", o.export_path.c_str());
    else
      std::fprintf(out, "exported the model to %s (Hugging Face directory)\n", o.export_path.c_str());
  }
  print_summary(run_parts, totals);
  if (out != stdout) std::fclose(out);
  return totals.stopped_by != 0 ? 128 + totals.stopped_by : 0;
}

// A whole number >= 1 (CLI11's PositiveNumber would print its range in full).
const CLI::Validator at_least_one(
    [](std::string& v) -> std::string {
      try {
        std::size_t used = 0;
        if (std::stoll(v, &used) >= 1 && used == v.size()) return {};
      } catch (const std::exception&) {
      }
      return "must be a whole number of at least 1, not " + v;
    },
    "INT >= 1");

Command train(
    "train", "Train a model with the ZeRO-3 offload engine from a DeepSpeed config", [](CLI::App& sub) {
      auto o = std::make_shared<TrainOpts>();
      sub.add_option("--config", o->config, "DeepSpeed-style ds_config.json")->required();
      sub.add_option(
          "--model", o->model,
          "Model preset (tiny, 10m, 125m, 350m, 1b, 3b, llama2-7b, ...) or model.json: fresh weights");
      sub.add_option("--init-from", o->init_from,
                     "Start from a Hugging Face model (Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma): its "
                     "directory (config.json + safetensors) or a "
                     ".safetensors file");
      sub.add_option("--data", o->data, "Token file (llm.c .bin or flat uint16)");
      sub.add_option("--text", o->text, "Text file, tokenized as bytes (models with vocab_size >= 256)");
      sub.add_option("--steps", o->steps, "Optimizer steps to run (0: set up, then save / export)")
          ->check(CLI::NonNegativeNumber);
      sub.add_option("--max-steps", o->max_steps,
                     "Train until global step N (with --load: the steps left; give this or --steps)")
          ->check(CLI::NonNegativeNumber);
      sub.add_option("--epochs", o->epochs,
                     "Train until E passes over the data (a fraction allowed; optimizer steps an epoch as "
                     "transformers counts them; with --load: the steps left)")
          ->check(CLI::PositiveNumber);
      sub.add_option("--seq-len", o->seq_len, "Tokens per sequence (default: min(max_seq_len, 256))")
          ->check(at_least_one);
      sub.add_option("--save", o->save,
                     "Checkpoint directory: written at the end (and every --save-interval steps)");
      sub.add_option("--save-interval", o->save_interval, "Also save every N steps")->check(at_least_one);
      sub.add_option(
          "--eval-data", o->eval_data,
          "Held-out token file: `strata eval`'s loss on it every --eval-interval steps and at the end");
      sub.add_option("--eval-interval", o->eval_interval, "Evaluate every N steps (default: at the end only)")
          ->check(at_least_one);
      sub.add_option("--eval-batches", o->eval_batches,
                     "Micro-batches of --eval-data per evaluation (default: every whole sequence)")
          ->check(at_least_one);
      sub.add_option("--load", o->load,
                     "Resume from this checkpoint directory (its `latest` tag); none there yet: start fresh");
      sub.add_option("--load-tag", o->load_tag, "Resume from this tag instead of `latest`");
      sub.add_option(
          "--export", o->export_path,
          "Write the trained model as a Hugging Face directory (bf16; NAME.safetensors: one file); with "
          "adapters, a PEFT adapter directory");
      sub.add_option("--adapter", o->adapter,
                     "Train LoRA adapters starting from this PEFT adapter directory (its adapter_config.json "
                     "and adapter_model.safetensors) over the frozen base of --init-from");
      sub.add_option("--export-merged", o->export_merged,
                     "With adapters: write the model with them merged (bf16 Hugging Face directory; "
                     "NAME.safetensors: one file); --export then writes the PEFT adapter directory");
      sub.add_option("--backend", o->backend,
                     "Device backend: auto, host or cuda (overrides strata.backend)");
      sub.add_option("--device-memory-cap", o->device_cap,
                     "Device memory the run may use, e.g. 1GiB (overrides strata.device_memory_cap)");
      sub.add_option("--set", o->sets,
                     "Config override name=value (e.g. lr=3e-4, micro_batch=8; docs/config.md)");
      sub.add_flag("!--no-progress", o->progress, "Plain log lines even on a terminal");
      return [o] { return run_train(*o); };
    });

}  // namespace
}  // namespace strata::cli
