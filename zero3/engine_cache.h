// Internal to zero3: the chunk cache — the engine's part that makes chunks' working params resident on
// the device for the model (gathers, prefetched or on demand, the all-gather at N ranks), keeps or drops
// them on release within the plan's cache, and holds NVMe-resident params' pinned copies. Notes [Device
// room], [Gather] and [Ranks] in engine_cache.cpp.
#pragma once

#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <utility>
#include <vector>

#include "prefetch/prefetch.h"
#include "zero3/engine_gate.h"
#include "zero3/engine_state.h"

namespace strata::zero3 {

// The cache's own per-chunk state: the gathered working params on the device, in the ops' activation
// dtype. `gathered` is registered once and pinned; its device block comes and goes (allocate, then evict of
// a never-valid copy frees). Written by ChunkCache only (and `error` by the gather stream's host function
// of the gather in flight, before `ready` completes).
struct CacheEntry {
  enum class Gather : std::uint8_t { absent, in_flight, ready, held };
  Gather gather = Gather::absent;
  tiering::TensorId gathered = 0;
  void* gptr = nullptr;             // (numel) in the ops' activation dtype (act)
  std::unique_ptr<Event> ready;     // recorded on the gather stream after the widening pass
  std::unique_ptr<Event> released;  // recorded on the compute stream at release: its ops reading the copy
  const Event* reader = nullptr;    // the last work reading the gathered block: `ready` or `released`
  std::exception_ptr error;         // set by that pass before `ready` completes
  bool pins_param = false;          // the gather holds a pin on the param's pinned copy (NVMe home)
  bool counts_nvme_read = false;    // the gather occupies one of offload_param.buffer_count buffers
  std::uint64_t last_use = 0;
};

class ChunkCache final : public prefetch::FetchTarget, public DeviceRoom {
 public:
  ChunkCache(const EngineEnv& env, UpdateGate& gate) : env_(env), gate_(gate) {}

  // Makes the prefetcher (after the plan: its options are the config's stage3_* keys).
  void open();
  // The engine's construction made chunk s (in chunk order): its gathered block registered.
  void add_chunk(const ChunkSlot& s);
  prefetch::Prefetcher& prefetcher() { return *pf_; }

  // ---- the pass (Engine::begin_pass / end_pass): the prefetcher's, and whether one is open ----
  // `repeat`: another micro-batch of this step follows (Note [Reuse across passes] in prefetch.h).
  void begin_pass(bool repeat);
  void end_pass();
  void abandon_pass();  // a forward that failed or whose backward will not run: not recorded
  bool in_pass() const { return in_pass_; }
  const CacheEntry& entry(int c) const { return entries_[std::size_t(c)]; }

  // ---- the model's acquire / release (model::ChunkProvider) ----
  model::ChunkView acquire(int c);
  void release(int c);

  // ---- DeviceRoom (engine_gate.h) ----
  void* device_alloc(tiering::TensorId id, AllocFor who) override;
  void params_written(const ChunkSlot& s, std::vector<tiering::Move>& writes) override;

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

  // What the cache counted: its gathers (TransferStats' gather fields), and the seconds the host waited
  // for them while the compute stream was idle since the last take_wait() (StepTimes.wait's share).
  const TransferStats& transfers() const { return transfers_; }
  double take_wait() { return std::exchange(wait_, 0.0); }

 private:
  const ChunkSlot& slot(int c) const { return env_.slots[std::size_t(c)]; }
  void finish_fetch(int c);
  // An NF4 base's chunk: its packed working copy dequantised into the gathered block (gather stream).
  void dequantize(const ChunkSlot& s, const void* packed, void* gathered);
  void drop_gathered(int c);
  // The cache (Note [Device room]): gathered chunks not held, ready or in flight, and the device bytes they
  // take.
  bool cached(int c) const;
  std::uint64_t cache_bytes() const;
  // The trace position of the next acquire of chunk c not yet made in this pass; -1: none (or unknown).
  std::int64_t next_use(int c) const;
  // The cached chunk to drop first: the one used furthest in the future (never again: first of all), then
  // the least recently used. With `for_position` >= 0 (a prefetch for that position) only chunks used after
  // it qualify; with kAnyCached every cached chunk does. -1 when none does.
  static constexpr std::int64_t kAnyCached = -1;
  int victim(std::int64_t for_position) const;
  // Drops cached chunks, victim() first, until the cache plus `more` bytes fits plan.device_cache. False
  // when that cannot be done with the chunks victim(for_position) allows.
  bool fit_cache(std::uint64_t more, std::int64_t for_position);
  void trim_param_cache();
  // What a pinned copy of chunk s counts against offload_param.max_in_cpu: its shard's elements, or a
  // packed copy's bytes in working-dtype elements.
  std::uint64_t cache_numel(const ChunkSlot& s) const {
    const std::uint64_t w = env_.working_dtype_bytes();
    return s.nf4 ? (s.nf4->bytes + w - 1) / w : s.shard.numel;
  }

  const EngineEnv& env_;
  UpdateGate& gate_;
  std::vector<CacheEntry> entries_;  // per chunk
  std::unique_ptr<prefetch::Prefetcher> pf_;
  bool in_pass_ = false;  // between begin_pass and end_pass
  int acquiring_ = -1;    // the chunk acquire() is making resident (never dropped to make room meanwhile)
  std::uint64_t use_clock_ = 0;
  // NVMe-resident parameters: reads in flight (<= offload_param.buffer_count) and the pinned copies kept as
  // a cache (<= offload_param.max_in_cpu elements), least recently used first.
  int nvme_param_reads_ = 0;
  std::deque<int> param_cache_;
  std::uint64_t param_cache_numel_ = 0;
  TransferStats transfers_;
  double wait_ = 0;
};

}  // namespace strata::zero3
