// strata/session/csv_monitor.h: DeepSpeed's csv_monitor, per-step metrics as CSV files a user can plot.
//
// Example:
//   // A new run (resumed_at nullopt) or one resumed from a checkpoint whose step column reads S.
//   using strata::session::CsvMonitor;
//   CsvMonitor mon(CsvMonitor::directory(cfg.csv_monitor), resumed_at);
//   mon.write("Train/Samples/train_loss", samples, loss);   // DIR/Train_Samples_train_loss.csv
//   mon.write("Train/Samples/lr", samples, lr);             // DIR/Train_Samples_lr.csv
//
// The layout is DeepSpeed's (deepspeed/monitor/csv_monitor.py): the files go in output_path/job_name/, one
// per event name with '/' and ' ' replaced by '_', each starting with the header row `step,<the name's
// last '/' component>` and then one `step,value` row per write. Values carry full double precision
// (%.17g: parsing the text gives back the same double). Each row is flushed as it is written, so a plot
// or `tail -f` sees every finished step and a killed run loses none.
//
// Differences from DeepSpeed, which opens the files in append mode and writes a header per run (so a rerun
// leaves a series whose step column goes back): an earlier run's files are made to fit this run when the
// monitor is constructed (Note [Earlier runs' files] in csv_monitor.cpp). A new run replaces them, with
// a warning naming them; a resumed run keeps each file's header and its rows up to the checkpoint's step
// and appends after them.
//
// Not thread-safe: one writer (rank 0's training loop) per object.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"

namespace strata::session {

// output_path/job_name as DeepSpeed's monitors join them (os.path.join: "" output_path is relative to the
// current directory; an absolute job_name stands alone); "." when both are empty. csv_monitor's and
// tensorboard's folder.
std::string monitor_directory(const std::string& output_path, const std::string& job_name);

class CsvMonitor {
 public:
  // output_path/job_name as DeepSpeed joins them ("" output_path: relative to the current directory; an
  // absolute job_name stands alone); "." when both are empty.
  static std::string directory(const CsvMonitorConfig& c);
  // DIR/<name with '/' and ' ' as '_'>.csv, the file `name`'s events go to.
  static std::string file_for(const std::string& dir, std::string_view name);
  // The event names whose files the constructor looks for in the folder: every event the front-ends write
  // (DeepSpeed's own names start the same way). Files of other names are handled at their first write.
  static constexpr std::string_view kEventPrefix = "Train/Samples/";

  // `dir` must exist (session::check_outputs creates and probes it before the engine). `resumed_at`: nullopt
  // for a new run, whose files replace any earlier run's; else the step column's value at the checkpoint
  // the run resumed from, past which an earlier run's rows are dropped. Raises IoError naming the file
  // when a file in the folder cannot be read, rewritten or removed.
  CsvMonitor(std::string dir, std::optional<std::int64_t> resumed_at);

  // Appends `step,value` to the event's file, opening it (and writing its header when the file is empty)
  // on first use; flushed before returning. Raises IoError naming the file when it cannot be written.
  void write(std::string_view name, std::int64_t step, double value);

  const std::string& dir() const { return dir_; }

 private:
  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  // Makes the files at `paths` fit this run (replaced or trimmed) and logs what changed; each path once.
  void adopt(const std::vector<std::string>& paths);

  std::string dir_;
  std::optional<std::int64_t> resumed_at_;
  std::set<std::string, std::less<>> adopted_;  // paths already made to fit this run
  std::map<std::string, std::unique_ptr<std::FILE, Closer>, std::less<>> files_;  // by event name
};

}  // namespace strata::session
