// The per-step metrics both front-ends write (session/session.h, "the per-step metrics").
#include <utility>

#include "core/log.h"
#include "session/session.h"

namespace strata::session {

// Note [Monitors]
// ~~~~~~~~~~~~~~~
// DeepSpeed's csv_monitor and tensorboard sections make its engine write every optimizer step's figures
// from engine.step(). Both Strata front-ends do it through this one class, so a config gives the same
// files, event names, steps and values whichever runs it:
//   - `strata train` opens the monitors once the engine is built and any --load has run, writes each
//     step's events after train_batch and, with --eval-data, the evaluation's loss; its summary names the
//     files (destinations()).
//   - The Python engine (python/engine_binding.cpp) writes each step's events from the engine.step() that
//     runs the optimizer step. It opens the monitors at its first optimizer step rather than in
//     strata.initialize, since only then is it known whether the run resumed: a load_checkpoint before
//     that step makes the CSV files keep their rows up to the loaded step, as `strata train --load` does;
//     a load_checkpoint after steps closes the monitors, and the next step opens them again from the
//     loaded step (a new tensorboard event file, as a resumed run gets). It logs destinations() then.
// Every step is written, skipped ones included (their loss, grad norm and loss scale are what the user
// wants to see). The folders are created and probed up front by check_outputs (Note [Outputs up front]
// in session.cpp), from monitor_outputs, on rank 0 only: the other ranks write nothing.

TierBytes tier_bytes(zero3::Engine& engine) {
  const tiering::Usage u = engine.tiers().usage();
  TierBytes b;
  std::uint64_t* out[] = {&b.device, &b.pinned, &b.nvme};
  for (int t = 0; t < tiering::kTierCount; ++t)
    for (int k = 0; k < tiering::kKindCount; ++k) *out[t] += u.bytes[std::size_t(t)][std::size_t(k)];
  return b;
}

std::vector<MonitorEvent> step_events(const zero3::StepResult& r, const TierBytes& b,
                                      std::uint64_t device_peak, bool fp16) {
  const zero3::StepTimes& t = r.times;
  std::vector<MonitorEvent> e;
  e.reserve(14);
  e.push_back({"Train/Samples/train_loss", r.loss});
  e.push_back({"Train/Samples/lr", r.lr});
  if (fp16) e.push_back({"Train/Samples/loss_scale", r.loss_scale});  // DeepSpeed: fp16 only
  e.push_back({"Train/Samples/grad_norm", r.grad_norm});
  e.push_back({"Train/Samples/tokens_per_second", t.total > 0 ? double(r.tokens) / t.total : 0.0});
  e.push_back({"Train/Samples/time_total", t.total});
  e.push_back({"Train/Samples/time_forward", t.forward});
  e.push_back({"Train/Samples/time_backward", t.backward});
  e.push_back({"Train/Samples/time_optimizer", t.optimizer});
  e.push_back({"Train/Samples/time_wait", t.wait});
  e.push_back({"Train/Samples/bytes_device", double(b.device)});
  e.push_back({"Train/Samples/bytes_pinned", double(b.pinned)});
  e.push_back({"Train/Samples/bytes_nvme", double(b.nvme)});
  e.push_back({"Train/Samples/bytes_device_peak", double(device_peak)});
  return e;
}

std::vector<Output> monitor_outputs(const Config& cfg, int rank) {
  std::vector<Output> out;
  if (rank != 0) return out;
  if (cfg.csv_monitor.enabled)
    out.push_back({CsvMonitor::directory(cfg.csv_monitor), "csv_monitor.output_path/job_name:"});
  if (cfg.tensorboard.enabled)
    out.push_back({TensorBoardMonitor::directory(cfg.tensorboard), "tensorboard.output_path/job_name:"});
  return out;
}

Monitors::Monitors(const Config& cfg, zero3::Engine& engine, std::optional<std::int64_t> resumed_step)
    : samples_per_step_(std::int64_t(engine.micro_batch()) * engine.accumulation_steps() *
                        engine.communicator().world_size()),
      fp16_(cfg.fp16.enabled) {
  if (engine.communicator().rank() != 0) return;
  if (cfg.csv_monitor.enabled)
    csv_.emplace(
        CsvMonitor::directory(cfg.csv_monitor),
        resumed_step ? std::optional<std::int64_t>(*resumed_step * samples_per_step_) : std::nullopt);
  // One event file per run in the job's folder (a resumed run adds its own).
  if (cfg.tensorboard.enabled) tb_.emplace(TensorBoardMonitor::directory(cfg.tensorboard));
}

void Monitors::write(std::string_view name, std::int64_t samples, double value) {
  if (csv_) csv_->write(name, samples, value);  // flushed row by row
  if (tb_) tb_->write(name, samples, value);
}

void Monitors::write_step(zero3::Engine& engine, const zero3::StepResult& r) {
  if (!csv_ && !tb_) return;
  const std::uint64_t device_peak = engine.device().memory_stats().peak_in_use;
  for (const MonitorEvent& e : step_events(r, tier_bytes(engine), device_peak, fp16_))
    write(e.name, r.step * samples_per_step_, e.value);
  if (tb_) tb_->flush();
}

void Monitors::write_eval(std::int64_t step, double loss) {
  write("Train/Samples/eval_loss", step * samples_per_step_, loss);
  if (tb_) tb_->flush();
}

std::vector<std::string> Monitors::destinations() const {
  std::vector<std::string> d;
  if (csv_) d.push_back(CsvMonitor::file_for(csv_->dir(), "Train/Samples/*") + " (csv_monitor)");
  if (tb_) d.push_back(tb_->path() + " (tensorboard)");
  return d;
}

}  // namespace strata::session
