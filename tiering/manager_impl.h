// Internal to tiering: the tier manager's state, the move jobs and the mover threads.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "tiering/fence.h"
#include "tiering/manager.h"
#include "tiering/pool.h"

namespace strata::tiering {
namespace detail {

// One transfer of a whole tensor from one tier to another. Written by the issuing thread before the job
// is handed to a mover, then only by that mover until `done` is signalled; read by the manager after.
struct MoveJob {
  TensorId id = 0;
  Tier from = Tier::pinned, to = Tier::device;
  Kind kind = Kind::param;
  std::uint64_t bytes = 0;
  bool drop_source = false;  // an eviction: the source block was freed at issue, fenced by read_done
  PoolBlock src, dst, staging;
  std::unique_ptr<Event> gate;       // the caller's `after`, re-recorded on our stream (I/O-first moves)
  std::unique_ptr<Event> copy_done;  // the device copy of this move
  std::atomic<bool> copy_recorded{false};  // copy_done recorded for the copy that ends the move
  nvme::IoHandle io;
  std::exception_ptr error;
  std::int64_t t_issue = 0, t_read = 0, t_done = 0;
  Flag read_done;  // the source has been read: its block may be reused
  Flag done;       // the data is in place (or the move failed)
};

// Something a mover finished, for the manager to account for at its next public call.
struct Completion {
  std::shared_ptr<MoveJob> job;
  bool finished = false;  // false: only the source read is done (evictions)
};

// A thread that finishes jobs in FIFO order: waits for each step, issues the next, posts completions.
// It never takes the manager's mutex (see the locking contract in manager.h).
class Mover {
 public:
  using Run = std::function<void(const std::shared_ptr<MoveJob>&)>;
  Mover(std::string name, Run run);
  ~Mover();  // finishes every queued job, then stops
  void push(std::shared_ptr<MoveJob> j);

 private:
  void loop();
  std::string name_;
  Run run_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<MoveJob>> q_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

struct Tensor {
  TensorId id = 0;
  TensorDesc desc;
  std::array<PoolBlock, kTierCount> block;  // storage per tier, valid or stale
  TierMask valid = 0;
  std::int32_t pins = 0;
  std::uint64_t last_use = 0;       // LRU clock
  std::shared_ptr<MoveJob> flight;  // the move in flight, if any
  bool busy = false;                // a public call is setting up a move of it: not evictable
  std::string lost;                 // why its data is gone
};

// Marks a tensor as part of a move being set up (not evictable) for a scope; nests.
struct Busy {
  explicit Busy(Tensor& t) : t(t), was(t.busy) { t.busy = true; }
  ~Busy() { t.busy = was; }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;
  Tensor& t;
  bool was;
};

}  // namespace detail

struct TierManager::Impl {
  Impl(Device& dev, TierOptions opts, nvme::SwapStore* nvme);
  ~Impl();

  Device& dev;
  TierOptions opts;
  nvme::SwapStore* swap = nullptr;
  std::array<std::unique_ptr<TierPool>, kTierCount> pools;  // nvme: null without a store
  std::unique_ptr<Stream> h2d, d2h;
  std::chrono::steady_clock::time_point epoch = std::chrono::steady_clock::now();

  mutable std::mutex mu;  // guards everything below, and all pool-and-tensor state transitions
  std::unordered_map<TensorId, detail::Tensor> tensors;
  std::unordered_map<TensorId, TensorDesc> described;  // every tensor ever registered
  TensorId next_id = 1;
  std::uint64_t clock = 0;
  std::int64_t step = 0;
  Phase phase = Phase::idle;
  Accounting acct;
  EventRing ring;

  // Completions posted by the movers; own mutex, never held with `mu` by a mover.
  std::mutex done_mu;
  std::vector<detail::Completion> completed;

  // Declared last: destroyed first, finishing their queues while everything above still exists.
  std::unique_ptr<detail::Mover> up, down;  // fetches (towards the device), evictions (away from it)

  // ---- private helpers: `mu` is held ----
  std::int64_t now() const;
  void record(EventType type, Tier tier, Tier to, Kind kind, TensorId id, std::uint64_t bytes,
              std::int64_t t = -1);
  detail::Tensor& get(TensorId id, const char* what);
  TensorId add(const TensorDesc& d);
  State state_of(const detail::Tensor& t) const;
  void touch(detail::Tensor& t) { t.last_use = ++clock; }
  void process_completions();
  // Waits (releasing `lk`) until `id` has no move in flight; returns it, completions processed.
  detail::Tensor& settle(std::unique_lock<std::mutex>& lk, TensorId id, const char* what);

  PoolBlock place(Tier tier, std::uint64_t bytes, Kind kind, TensorId id, const std::string& name);
  void release(detail::Tensor& t, Tier tier, std::shared_ptr<const Fence> last_use);
  detail::Tensor* victim(Tier tier);
  void evict_one(detail::Tensor& v, Tier tier);
  [[noreturn]] void out_of_memory(Tier tier, std::uint64_t bytes, Kind kind, const std::string& name);
  std::shared_ptr<const Fence> fence_after(const Event* after);

  Move issue(detail::Tensor& t, Tier from, Tier to, bool drop_source, const Event* after);
  void run_job(const std::shared_ptr<detail::MoveJob>& j);  // on a mover thread
  void post(const std::shared_ptr<detail::MoveJob>& j, bool finished);

  TierSnapshot tier_snapshot(Tier t) const;
};

}  // namespace strata::tiering
