// strata/tiering/manager.h: the tier manager — the registry of every tensor of model state, the pools of
// the three tiers, the moves between them, and the accounting of it all.
//
// Example:
//   strata::nvme::AioEngine engine(aio);
//   strata::nvme::SwapStore swap(engine, {.nvme_path = "/local_nvme", .capacity = 64ull << 30});
//   strata::tiering::TierManager tm(*dev, {.pinned_budget = 8ull << 30}, &swap);
//   TensorId w = tm.register_tensor({.name = "layers.3.params", .kind = Kind::param, .dtype = DType::bf16,
//                                    .bytes = n * 2, .home = Tier::nvme});
//   std::memcpy(tm.allocate(w, Tier::pinned), init, n * 2);    // storage to fill, then say so:
//   tm.mark_written(w, Tier::pinned);
//   tm.evict(w, Tier::pinned, Tier::nvme).wait();              // to its home; the pinned copy is freed
//   tm.pin(w);                                                 // keep it where it is put
//   Move m = tm.fetch(w, Tier::device);                        // NVMe -> pinned staging -> device
//   m.enqueue_wait(*compute);                                  // compute starts after the copy
//   ... compute with tm.data(w, Tier::device) ...
//   tm.evict(w, Tier::device, Tier::nvme, last_use_event);     // or drop it: a valid copy is on NVMe
//   tm.unpin(w);
//   nlohmann::json j = tm.snapshot().to_json();
//
// Copies: a tensor has at most one block per tier. fetch(id, to) makes `to` hold a valid copy and keeps
// the others; evict(id, from, to) makes `to` hold one and frees `from`. Writing a copy (mark_written)
// makes every other copy stale; stale blocks stay allocated (a later move reuses them) but are the first
// thing eviction drops. Transfers are whole tensors: device <-> pinned on the manager's own H2D and D2H
// streams, pinned <-> NVMe as SwapStore I/O, device <-> NVMe through a pinned staging block from the same
// pool (never through any other buffer; a pinned source or destination is used in place).
//
// Budgets and eviction: every tier has a budget (device: the caching allocator's capacity; pinned: the
// slab budget; NVMe: the store's capacity), and no pool ever reserves more than its budget. A block that
// does not fit evicts the least-recently-used tensor of that tier that is not pinned and not moving, one
// tier down (device -> pinned -> nvme; a tensor with a valid copy elsewhere is just dropped), until the
// block fits. When nothing is evictable, OutOfMemory lists each tier's capacity, used, reserved and free
// bytes and names the setting to change.
//
// Locking contract: every public method may be called from any thread. Public methods take the manager's
// mutex and never call one another; private ones assume it is held. Under the mutex the manager may wait
// for fences (tiering/fence.h) but never for another thread that needs the mutex: the mover threads that
// finish transfers never take it (they post completions to a list the next public call processes).
// A method that must wait for a tensor's move in flight releases the mutex while it waits.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "nvme/swap_store.h"
#include "tiering/accounting.h"
#include "tiering/caching_allocator.h"
#include "tiering/pool.h"
#include "tiering/snapshot.h"
#include "tiering/types.h"

namespace strata::tiering {

struct TierOptions {
  // Bytes the device caching allocator may reserve. 0: the device's capacity (which
  // strata.device_memory_cap caps).
  std::uint64_t device_budget = 0;
  // The device allocator gives every block a segment of its own (tiering/caching_allocator.h, Note [exact
  // segments]): what fits is then exactly the sum of block_bytes() of the blocks in use, so a caller that
  // plans the device's contents in those terms is never refused by fragmentation.
  bool device_exact_segments = true;
  // Bytes of pinned host memory the slabs may take. Required (> 0): pinned memory is staging for every
  // NVMe <-> device move.
  std::uint64_t pinned_budget = 0;
  // Pinned slab size: smaller tensors share slabs, larger ones get a slab each.
  std::size_t pinned_slab_bytes = 64 << 20;
  // Events kept in the ring (older ones are overwritten; readers learn how many they missed).
  std::size_t event_ring_capacity = 1 << 16;
  // Register each pinned slab with the NVMe engine as io_uring fixed buffers (when it can).
  bool register_pinned_slabs = true;
  // The settings an OutOfMemory message names for each tier.
  std::string device_setting =
      "strata.device_memory_cap (the device budget), zero_optimization.offload_param.device / "
      "offload_optimizer.device (cpu or nvme: keep less on the device), or "
      "zero_optimization.stage3_max_live_parameters / stage3_prefetch_bucket_size (fewer gathered chunks)";
  std::string pinned_setting =
      "the pinned host budget (zero_optimization.offload_param.max_in_cpu for parameters kept in host "
      "memory), or zero_optimization.offload_optimizer.device: nvme (optimizer state out of host memory)";
  std::string nvme_setting =
      "the space under zero_optimization.offload_optimizer.nvme_path / offload_param.nvme_path (free "
      "disk, or the swap store's capacity)";
};

// The options of the device tier's caching allocator in a manager made with `opts` (capacity 0: the
// device's). Planners use them to count blocks as the allocator will: CachingAllocator::block_bytes.
AllocatorOptions device_allocator_options(const TierOptions& opts);

struct TensorDesc {
  std::string name;  // "layers.3.exp_avg"
  Kind kind = Kind::param;
  DType dtype = DType::fp32;
  std::uint64_t bytes = 0;
  Tier home = Tier::device;  // where it lives between uses (DESIGN.md §2, by offload config)
  std::int32_t chunk = -1;   // chunk index, -1 none
  std::int32_t shard = 0;    // rank's slice
};

// Homes of the five tensors of a shard (which offload config puts them where is zero3's placement:
// zero3/placement.h, shard_homes).
struct ShardHomes {
  Tier param = Tier::device, grad = Tier::device, master = Tier::device, optim = Tier::device;
};

struct ShardDesc {
  std::string prefix;  // "layers.3" -> "layers.3.param", ".grad", ".master", ".exp_avg", ".exp_avg_sq"
  std::int32_t chunk = -1, shard = 0;
  std::uint64_t numel = 0;
  DType working = DType::bf16;  // the params' dtype; the other four are fp32
  // Elements of the param tensor when it differs from the shard's (ZeRO stages 1 and 2 over N ranks
  // keep the whole chunk's working params on every rank); 0: numel.
  std::uint64_t param_numel = 0;
  // A packed working copy (an NF4 base's chunk, model/nf4_chunk.h): the param tensor is these many bytes
  // of u8; 0: param_numel (or numel) of `working`.
  std::uint64_t param_bytes = 0;
  ShardHomes homes;
  // A frozen shard (its parameters do not train): the working params alone; the other four ids stay 0.
  bool param_only = false;
};
struct ShardTensors {
  TensorId param = 0, grad = 0, master = 0, exp_avg = 0, exp_avg_sq = 0;
};

namespace detail {
struct MoveJob;
}

// A transfer issued by fetch or evict. Default-constructed (or when nothing had to move): already done.
class Move {
 public:
  Move() = default;
  bool done() const;  // the data is in place (or the transfer failed); never blocks
  void wait() const;  // blocks until done; raises the IoError / BackendError of a failed transfer
  // Later work on `s` starts after this move's data is in place: a stream wait on the copy's event when
  // the last step is a device copy already issued, else a host function on `s` that waits (which holds
  // up `s` — on cuda, its host-function thread — until the transfer ends).
  void enqueue_wait(Stream& s) const;
  explicit operator bool() const { return job_ != nullptr; }  // a transfer was issued
  TensorId tensor() const;
  Tier from() const;
  Tier to() const;
  std::uint64_t bytes() const;

 private:
  friend class TierManager;
  explicit Move(std::shared_ptr<detail::MoveJob> j) : job_(std::move(j)) {}
  std::shared_ptr<detail::MoveJob> job_;
};

struct TensorInfo {
  TensorDesc desc;
  TierMask valid = 0;
  TierMask allocated = 0;
  State state = State::absent;
  std::int32_t pins = 0;
  std::string lost;  // why its data is gone (a failed eviction), else empty
};

// Bytes per tier × kind right now (what the trace writer samples).
struct Usage {
  std::int64_t t_ns = 0;
  std::int64_t step = 0;
  Phase phase = Phase::idle;
  std::array<std::array<std::uint64_t, kKindCount>, kTierCount> bytes{};
  std::array<std::uint64_t, kTierCount> reserved{};
  std::array<std::uint64_t, kTierCount> capacity{};
  std::array<bool, kTierCount> present{};
  std::uint64_t last_seq = 0;  // the ring's newest event when these figures were taken
};

class TierManager {
 public:
  // `nvme` (optional) is the NVMe tier; without it, nothing can be evicted below pinned. `dev` and
  // `nvme` must outlive the manager.
  TierManager(Device& dev, TierOptions opts, nvme::SwapStore* nvme = nullptr);
  // Waits for every move in flight, then frees everything.
  ~TierManager();
  TierManager(const TierManager&) = delete;
  TierManager& operator=(const TierManager&) = delete;

  // ---- registry ----
  TensorId register_tensor(const TensorDesc& d);
  ShardTensors register_shard(const ShardDesc& d);
  // Frees every copy (after `after`, if given: the last use on a stream) and forgets the tensor.
  void unregister_tensor(TensorId id, const Event* after = nullptr);
  TensorInfo info(TensorId id) const;
  std::vector<TensorId> tensor_ids() const;
  // The description of any tensor ever registered (also after unregister_tensor), for trace readers.
  std::optional<TensorDesc> describe(TensorId id) const;

  // ---- data ----
  // Storage for `id` on `tier` (device or pinned) to write into, allocated (evicting) when missing.
  void* allocate(TensorId id, Tier tier);
  // The caller wrote the copy on `tier`: it is now the only valid one.
  void mark_written(TensorId id, Tier tier);
  // The block on `tier` (valid or stale), or null (none there, or NVMe).
  void* data(TensorId id, Tier tier) const;

  // ---- moves (same argument order everywhere: tensor, tier(s), the caller's last-use event) ----
  // Makes `to` hold a valid copy, keeping the others. The source is the pinned copy when valid, else
  // the nearest valid one. Nothing to do when `to` already holds one.
  Move fetch(TensorId id, Tier to, const Event* after = nullptr);
  // Makes `to` hold a valid copy and frees the block on `from` (copying only if `to` has none yet).
  Move evict(TensorId id, Tier from, Tier to, const Event* after = nullptr);
  // Frees the block on `tier` after the caller's last use and forgets its data: for a tensor whose
  // contents are dead (nothing copied). An unpinned tensor only.
  void discard(TensorId id, Tier tier, const Event* after = nullptr);
  // Pinned tensors (a count) are never evicted. Unrelated to pinned host memory.
  void pin(TensorId id);
  void unpin(TensorId id);
  // Marks `id` as just used (LRU order). fetch, evict, allocate and mark_written touch too.
  void touch(TensorId id);
  // Blocks until every move issued so far is done.
  void synchronize();

  // ---- accounting ----
  void set_step(std::int64_t step, Phase phase);  // a marker in the ring; later events carry it
  Usage usage() const;
  // Events after `after_seq`, oldest first; *dropped gets how many were overwritten before being read.
  std::vector<MemEvent> events_since(std::uint64_t after_seq, std::uint64_t* dropped = nullptr) const;
  Snapshot snapshot(bool with_events = true) const;
  // Per-tier pool statistics (capacity, used, reserved, free, ...).
  PoolStats pool_stats(Tier t) const;
  bool has_tier(Tier t) const;
  const Device& device() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::tiering
