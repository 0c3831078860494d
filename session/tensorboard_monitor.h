// strata/session/tensorboard_monitor.h: DeepSpeed's tensorboard monitor, per-step metrics as TensorBoard
// event files.
//
// Example:
//   using strata::session::TensorBoardMonitor;
//   TensorBoardMonitor tb(TensorBoardMonitor::directory(cfg.tensorboard));
//   tb.write("Train/Samples/train_loss", samples, loss);   // a scalar at step `samples`
//   tb.flush();                                             // once per optimizer step
//
// The layout is DeepSpeed's (deepspeed/monitor/tensorboard.py, a SummaryWriter on output_path/job_name):
// one file per run in that folder, named `events.out.tfevents.<unix seconds, 10 digits>.<host>.<pid>.<n>`
// (n counts the process's event files from 0: strata train's is .0; a Python process's next run .1, ...),
// so `tensorboard --logdir output_path` shows each job as a run and a resumed run as a second file in the
// same run. The file is a sequence of TFRecords (Note [Event files] in the .cpp): the first record a
// file_version event ("brain.Event:2"), then one event per scalar: wall time, step and a summary value
// holding the tag and the value as a float (`simple_value`, which TensorBoard's scalar dashboard reads).
// Records are buffered and written at flush(), which session::Monitors calls after every optimizer step,
// so a killed run loses at most the step it was in.
//
// Not thread-safe: one writer (rank 0's training loop) per object.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "config/config.h"

namespace strata::session {

class TensorBoardMonitor {
 public:
  // output_path/job_name as DeepSpeed joins them ("" output_path: relative to the current directory; an
  // absolute job_name stands alone); "." when both are empty.
  static std::string directory(const TensorBoardConfig& c);

  // Creates this run's event file in `dir`, which must exist (session::check_outputs creates and probes it
  // before the engine is built), and writes its file_version record. Raises IoError naming the file when
  // it cannot.
  explicit TensorBoardMonitor(const std::string& dir);

  // One scalar event: `value` (stored as a float, as TensorBoard's scalars are) at `step`, tagged `name`.
  void write(std::string_view name, std::int64_t step, double value);
  // Writes the buffered records and flushes the file. Raises IoError naming the file when it cannot.
  void flush();

  const std::string& path() const { return path_; }

 private:
  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  void record(const std::string& event);  // one TFRecord around a serialised Event

  std::string path_;
  std::unique_ptr<std::FILE, Closer> file_;
  std::string pending_;  // records not yet written
};

// CRC-32C (Castagnoli) of `bytes`, and the masked form TFRecords store (Note [Event files] in the .cpp).
std::uint32_t crc32c(std::span<const unsigned char> bytes);
std::uint32_t masked_crc32c(std::span<const unsigned char> bytes);

}  // namespace strata::session
