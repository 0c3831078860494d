// strata/nvme/tune.h: measuring the engine on a directory, and the nvme-tune sweep (DeepSpeed's
// ds_nvme_tune) that picks the best `aio` settings for it.
//
// Example:
//   strata::nvme::TuneOptions t;
//   t.dir = "/local_nvme";
//   t.on_point = [](const strata::nvme::TunePoint& p) { print(p); };
//   strata::nvme::TuneResult r = strata::nvme::tune(t);
//   std::puts(r.best.opts.to_config_json().c_str());    // paste into ds_config.json
//
// Every point writes to the drive for `seconds`: the sweep costs SSD write endurance (TBW), which
// nvme-tune says before it starts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "nvme/engine.h"

namespace strata::nvme {

enum class Pattern { seq_read, seq_write, rand_read, rand_write };
const char* to_string(Pattern p);  // "seq_read", ...
bool is_write(Pattern p);

struct Measurement {
  double gbps = 0;          // 1e9 bytes per second
  std::uint64_t bytes = 0;  // bytes of the requests that completed inside the window
  double seconds = 0;       // the timed window
};

// Runs `pattern` on the first `file_bytes` of `file` (which must already be that long; writes overwrite
// it) through `engine` the way fio does with --bs=block_size --iodepth=queue_depth --size=S, where S is
// file_bytes rounded down to whole blocks: sequential patterns sweep [0, S) in order and wrap around to 0,
// random ones move one block at a uniformly random block-aligned offset in [0, S). `buffer`
// (buffer_bytes bytes, page-aligned) must hold at least one block; sequential requests use up to
// buffer_bytes at a time, and requests take its request-sized regions in turn, as many as can be in the
// kernel at once: with measure_inflight_bytes() of buffer no two I/Os in flight share memory and the
// memory used is about block x depth, as fio's buffers are; a smaller buffer is shared.
//
// Timed as fio's --time_based --ramp_time=R --runtime=T counts: the window opens R seconds after the
// first submit (at it with R == 0); every request that completes after that counts, also one that was
// in flight before (fio resets its counters at the end of the ramp, with its queue full); submitting
// stops T seconds into the window, and what is in flight then is collected and counted, the window
// closing at the last completion (fio reaps its queue before it stops its clock). Both therefore count
// up to one queue's worth of bytes that moved before the window: about block x depth / (rate x T)
// too much, which T must make small.
Measurement measure(AioEngine& engine, const File& file, std::uint64_t file_bytes, Pattern pattern,
                    double seconds, void* buffer, std::size_t buffer_bytes, double ramp_seconds = 0);

// Bytes of buffer measure() can use to keep sequential requests large (min(block x depth x threads, 64 MiB)).
std::size_t measure_buffer_bytes(const AioOptions& opts);
// Bytes of buffer with which no two of measure()'s I/Os in flight share memory: about block x depth x
// threads, plus one request.
std::size_t measure_inflight_bytes(const AioOptions& opts);

// A page-aligned scratch file for measurements: created at `bytes` under `dir`, filled with data (so
// reads hit written blocks and writes overwrite rather than allocate), removed on destruction.
class ScratchFile {
 public:
  // OutOfMemory when the file system under `dir` has less than `bytes` free; IoError when `dir` is not
  // writable.
  ScratchFile(const std::string& dir, std::uint64_t bytes, bool direct);
  ~ScratchFile();
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  const File& file() const { return file_; }
  const std::string& path() const { return file_.path(); }
  std::uint64_t bytes() const { return bytes_; }

 private:
  File file_;
  std::uint64_t bytes_;
};

struct TunePoint {
  AioOptions opts;
  double read_gbps = 0;
  double write_gbps = 0;
  // 2 / (1/read + 1/write): the rate at which equal amounts are read and written, as optimizer swap
  // does every step.
  double combined_gbps() const;
};

struct TuneOptions {
  std::string dir;  // where the scratch file goes (the NVMe drive)
  std::uint64_t file_bytes = std::uint64_t(1) << 30;
  double seconds = 1.0;           // per point and direction
  std::vector<Backend> backends;  // empty: every backend this machine supports
  std::vector<std::size_t> block_sizes = {std::size_t(1) << 20, std::size_t(8) << 20};
  std::vector<int> queue_depths = {8, 32, 128};
  std::vector<int> threads = {1, 2};  // aio.intra_op_parallelism
  std::vector<bool> single_submit = {false};
  std::vector<bool> overlap_events = {true};
  bool direct = true;
  std::function<void(const TunePoint&)> on_point;  // called after each point (progress)
};

struct TuneResult {
  std::vector<TunePoint> points;
  TunePoint best;                   // highest combined_gbps
  TunePoint best_read;              // highest read_gbps
  TunePoint best_write;             // highest write_gbps
  std::uint64_t bytes_written = 0;  // to the drive during the sweep, the initial fill included
  std::string file;                 // the scratch file used (already removed)
};

// Runs the sweep. Backends named in opts.backends that do not work here are skipped and listed in
// `skipped` with the reason; ConfigError for an empty sweep or bad values.
TuneResult tune(const TuneOptions& opts, std::vector<std::string>* skipped = nullptr);

}  // namespace strata::nvme
