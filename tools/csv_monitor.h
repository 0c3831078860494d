// strata/tools/csv_monitor.h: DeepSpeed's csv_monitor, per-step metrics as CSV files a user can plot.
//
// Example:
//   strata::cli::CsvMonitor mon(strata::cli::CsvMonitor::directory(cfg.csv_monitor));
//   mon.write("Train/Samples/train_loss", samples, loss);   // DIR/Train_Samples_train_loss.csv
//   mon.write("Train/Samples/lr", samples, lr);             // DIR/Train_Samples_lr.csv
//
// The layout is DeepSpeed's (deepspeed/monitor/csv_monitor.py): the files go in output_path/job_name/, one
// per event name with '/' and ' ' replaced by '_', each starting with the header row `step,<the name's
// last '/' component>` and then one `step,value` row per write. Values carry full double precision
// (%.17g: parsing the text gives back the same double). Each row is flushed as it is written, so a plot
// or `tail -f` sees every finished step and a killed run loses none.
//
// One difference from DeepSpeed: a file that already has rows (a resumed run writing to the same folder)
// gets the new rows appended under its existing header; DeepSpeed writes the header again, once per run.
//
// Not thread-safe: one writer (rank 0's training loop) per object.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "config/config.h"

namespace strata::cli {

class CsvMonitor {
 public:
  // output_path/job_name as DeepSpeed joins them ("" output_path: relative to the current directory; an
  // absolute job_name stands alone); "." when both are empty.
  static std::string directory(const CsvMonitorConfig& c);
  // DIR/<name with '/' and ' ' as '_'>.csv, the file `name`'s events go to.
  static std::string file_for(const std::string& dir, std::string_view name);

  // `dir` must exist (strata train creates and probes it before the first step).
  explicit CsvMonitor(std::string dir);

  // Appends `step,value` to the event's file, opening it (and writing its header when the file is empty)
  // on first use; flushed before returning. Raises IoError naming the file when it cannot be written.
  void write(std::string_view name, std::int64_t step, double value);

  const std::string& dir() const { return dir_; }

 private:
  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::string dir_;
  std::map<std::string, std::unique_ptr<std::FILE, Closer>, std::less<>> files_;  // by event name
};

}  // namespace strata::cli
