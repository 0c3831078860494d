// tools/memprof/memprof.h: reading memprof traces back — the trace as values, the bytes-over-time
// replay, the summary `memprof summary` prints — and the memory estimate of `memprof estimate`.
//
// Example:
//   strata::memprof::Trace tr = strata::memprof::read_trace("run.memprof.jsonl");
//   strata::memprof::Summary s = strata::memprof::summarize(tr);
//   std::fputs(format_summary(s).c_str(), stdout);
//   for (const TimelinePoint& p : replay(tr)) ...;          // bytes per tier × kind after each event
//
//   auto rows = strata::memprof::estimate({.params = 7'000'000'000, .largest_layer = 234'000'000});
//   std::fputs(format_estimate(rows, in).c_str(), stdout);
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "model/config.h"
#include "tiering/accounting.h"
#include "tiering/snapshot.h"
#include "tiering/types.h"
#include "zero3/step_time.h"

namespace strata::memprof {

// The trace speaks the tier manager's words (tiers, kinds, events, snapshots).
using namespace strata::tiering;

using TierKindBytes = std::array<std::array<std::uint64_t, kKindCount>, kTierCount>;

struct TraceTensor {
  TensorId id = 0;
  std::string name;
  Kind kind = Kind::param;
  DType dtype = DType::fp32;
  std::uint64_t bytes = 0;
  Tier home = Tier::device;
  std::int32_t chunk = -1, shard = 0;
};

struct TraceSample {
  std::int64_t t_ns = 0, step = 0;
  Phase phase = Phase::idle;
  TierKindBytes bytes{};
  std::array<std::uint64_t, kTierCount> reserved{};
};

struct Trace {
  std::string path;
  nlohmann::json header;  // as written (config included)
  std::string backend, device;
  std::int64_t start_t = 0;
  std::array<bool, kTierCount> present{};
  std::array<std::uint64_t, kTierCount> capacity{};
  std::vector<TraceTensor> tensors;  // in order of appearance
  std::vector<MemEvent> events;      // in seq order
  std::vector<TraceSample> samples;
  std::uint64_t dropped = 0;               // events lost to ring overflow (gap lines)
  std::optional<Snapshot> final_snapshot;  // from the end line; absent when the run did not close it
  std::int64_t end_t = 0, writer_cpu_ns = 0;
};

// Reads a trace file. IoError when it cannot be read; ConfigError (with path:line) for a file that is
// not a strata.memprof trace, a newer version, or a malformed line. A truncated last line (a run that
// was killed mid-write) is skipped with a warning.
Trace read_trace(const std::string& path);

// Bytes per tier × kind after each alloc/free event, in time order (ties by seq), starting from the
// trace's first sample. Markers carry step/phase changes.
struct TimelinePoint {
  std::int64_t t_ns = 0, step = 0;
  Phase phase = Phase::idle;
  TierKindBytes bytes{};
};
std::vector<TimelinePoint> replay(const Trace& tr);

struct Summary {
  std::string path, backend, device;
  double duration_s = 0;
  std::int64_t first_step = 0, last_step = 0;
  std::array<bool, kTierCount> present{};
  std::array<std::uint64_t, kTierCount> capacity{};
  TierKindBytes peak{};                                // per tier × kind
  std::array<std::uint64_t, kTierCount> peak_total{};  // peak of the tier's sum over kinds
  bool exact = true;  // false: events were dropped and the figures come from the end snapshot
  std::array<MoveCounter, kDirectionCount> moves{};
  std::uint64_t evictions = 0, evicted_bytes = 0, ooms = 0, failed_moves = 0;
  std::vector<MemEvent> oom_events;
  std::vector<TraceTensor> largest;  // biggest first
  std::uint64_t tensors = 0, events = 0, dropped = 0;
  std::int64_t writer_cpu_ns = 0;
};
Summary summarize(const Trace& tr, std::size_t top = 10);
std::string format_summary(const Summary& s);
nlohmann::json summary_json(const Summary& s);

// ---- estimate ----

struct EstimateInput {
  std::uint64_t params = 0;                   // total parameters P (or from `model`)
  std::uint64_t largest_layer = 0;            // parameters of the largest layer (chunk) M (or from `model`)
  int world = 1;                              // GPUs in all
  int nodes = 1;                              // nodes (world / nodes GPUs each)
  double buffer_factor = 1.5;                 // DeepSpeed's additional_buffer_factor
  std::uint64_t sub_group_size = 1000000000;  // zero_optimization.sub_group_size (when no `config`)
  std::string backend = "cuda";  // cuda: chunks gathered in bf16; host: bf16 with bf16 enabled, else fp32
  std::optional<model::ModelConfig> model = {};  // its real chunk layout instead of params / largest_layer
  std::optional<Config> config = {};             // knobs (sub-groups, NVMe buffers, optimizer, dtypes)
  // --machine FILE (zero3/step_time.h, a described machine), with `model`: each row's step predicted on it
  // and its fit checked against its device and host memory, as "auto" plans a placement; `seq_len` tokens a
  // row (0: the model's max_seq_len), the config's micro-batch.
  std::optional<zero3::MachineRates> machine = {};
  int seq_len = 0;
};

struct EstimateRow {
  Tier param_home = Tier::device, optim_home = Tier::device;  // offload_param / offload_optimizer
  // Ours (the engine's memory plan): device per GPU, host (pinned) per node, NVMe per node.
  std::uint64_t device = 0, host = 0, nvme = 0;
  // DeepSpeed's estimate_zero3_model_states_mem_needs: GPU per GPU, CPU per node with zero_init on
  // and off. Its estimator knows only "offload" (cpu); nvme settings show its cpu figures.
  std::uint64_t ds_gpu = 0, ds_cpu_zero_init = 0, ds_cpu = 0;
  // With a machine: the placement planned whole (activations and checkpointing included) on it.
  std::optional<zero3::PlacementOption> planned = {};
};
std::vector<EstimateRow> estimate(const EstimateInput& in);  // ConfigError for bad input
std::string format_estimate(const std::vector<EstimateRow>& rows, const EstimateInput& in);
nlohmann::json estimate_json(const std::vector<EstimateRow>& rows, const EstimateInput& in);

}  // namespace strata::memprof
