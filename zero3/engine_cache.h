// Internal to zero3: the chunk cache — the engine's part that makes chunks' working params resident on
// the device for the model (gathers, prefetched or on demand, the all-gather at N ranks), keeps or drops
// them on release within the plan's cache, and holds NVMe-resident params' pinned copies. Notes [Device
// room], [Gather] and [Ranks] in engine_cache.cpp.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "prefetch/prefetch.h"
#include "zero3/engine_gate.h"
#include "zero3/engine_state.h"

namespace strata::zero3 {

class ChunkCache final : public prefetch::FetchTarget, public DeviceRoom {
 public:
  ChunkCache(EngineState& e, UpdateGate& gate) : engine_(e), gate_(gate) {}

  // Makes the prefetcher (after the plan: its options are the config's stage3_* keys).
  void open();
  prefetch::Prefetcher& prefetcher() { return *pf_; }

  // ---- the model's acquire / release (model::ChunkProvider) ----
  model::ChunkView acquire(int c);
  void release(int c);

  // ---- DeviceRoom (engine_gate.h) ----
  void* device_alloc(tiering::TensorId id, AllocFor who) override;
  void params_written(ChunkSlot& s, std::vector<tiering::Move>& writes) override;

  // Drops every gathered chunk (after the step: they are stale).
  void drop_all_gathered();
  // Stages 1 and 2 after the step: each rank updated its slice of every chunk's working params; the
  // all-gather (in place, on the gather stream) gives every rank all of them.
  void all_gather_params();
  // A checkpoint load wrote every NVMe-resident param anew: no pinned copy counts as cached any more.
  void forget_param_copies() {
    param_cache_.clear();
    param_cache_numel_ = 0;
  }

  // ---- prefetch::FetchTarget ----
  std::uint64_t numel(int c) const override;
  prefetch::Residency residency(int c) override;
  bool start_fetch(int c, bool demand) override;
  void wait_fetch(int c) override;
  std::uint64_t live_numel() const override;

 private:
  void finish_fetch(ChunkSlot& s);
  void drop_gathered(ChunkSlot& s);
  // The cache (Note [Device room]): gathered chunks not held, ready or in flight, and the device bytes they
  // take.
  bool cached(const ChunkSlot& s) const;
  std::uint64_t cache_bytes() const;
  // The trace position of the next acquire of `s` not yet made in this pass; -1: none (or unknown).
  std::int64_t next_use(const ChunkSlot& s) const;
  // The cached chunk to drop first: the one used furthest in the future (never again: first of all), then
  // the least recently used. With `for_position` >= 0 (a prefetch for that position) only chunks used after
  // it qualify; with kAnyCached every cached chunk does. Null when none does.
  static constexpr std::int64_t kAnyCached = -1;
  ChunkSlot* victim(std::int64_t for_position);
  // Drops cached chunks, victim() first, until the cache plus `more` bytes fits plan.device_cache. False
  // when that cannot be done with the chunks victim(for_position) allows.
  bool fit_cache(std::uint64_t more, std::int64_t for_position);
  void trim_param_cache();

  EngineState& engine_;
  UpdateGate& gate_;
  std::unique_ptr<prefetch::Prefetcher> pf_;
  int acquiring_ = -1;  // the chunk acquire() is making resident (never dropped to make room meanwhile)
  std::uint64_t use_clock_ = 0;
  // NVMe-resident parameters: reads in flight (<= offload_param.buffer_count) and the pinned copies kept as
  // a cache (<= offload_param.max_in_cpu elements), least recently used first.
  int nvme_param_reads_ = 0;
  std::deque<int> param_cache_;
  std::uint64_t param_cache_numel_ = 0;
};

}  // namespace strata::zero3
