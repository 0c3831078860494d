// The CPU optimizer overlapped with backward (engine_overlap.h).
//
// Note [Optimizer overlap]: in the backward that ends a step's accumulation, a chunk's gradients are final
// at its last hand-off to the fp32 gradient shard (its reduce-scatter at N ranks included). From then on
// nothing in the pass reads that chunk's master, optimizer states or working params, so its update can
// run while backward goes on with the chunks before it: release_grads records an event after the
// hand-off and queues the chunk for a worker thread, which waits for the event and runs the same
// update_chunk the step would run. The unit is the chunk, not the optimizer sub-group: the in-memory
// update of a sub-group is its chunks' updates one after the other, so the bits are the same, and a
// stock config's single sub-group (sub_group_size 1e9) still overlaps.
//
// What the update needs but cannot know yet: whether the step applies (the fp16 overflow check, a
// non-finite norm) and the gradient factor (1 / loss scale, times the clipping coefficient once the
// global norm is known). The worker assumes the common case — the step applies unclipped, so the factor
// is 1 / loss scale — and keeps a copy of everything it overwrites (master, optimizer states and, in
// place, the working params; the chunk's ShardStep). step() computes the norm as before (the same sums
// in the same order), and when the assumption held the early updates stand: bit for bit the step without
// overlap. When it did not (clipping fired, an overflow skipped the step, the learning rate changed),
// the copies are put back and the step runs as without overlap: a rollback, counted in OverlapStats and
// in strata train's summary. Anything else that must see the state as it was before the step — a
// forward before step() (another micro-batch, an eval), a checkpoint, reading params, a backward that
// failed — puts the copies back first (a cancellation); a later step redoes the work.
//
// What it costs: host memory for the copies, 4 x (1 + states) + working-dtype bytes a parameter
// (AdamW in bf16: 14), pageable rather than pinned, and planned with the rest of host memory
// (MemoryPlan.overlap_host): the chunks are taken from the last (the first backward finishes) down while
// the copies fit in half of what check_fits leaves of 90% of RAM; the others are updated after backward
// as before. Time: a copy pass over the state on the worker, hidden behind backward when there is
// compute to hide behind, and a restore pass plus the redone update per rollback.
//
// When: strata.overlap_optimizer true, or "auto" with the optimizer offloaded to the CPU and the model
// computing on a GPU, or on the host backend with strata.cpu_optim.cores giving the optimizer cores of
// its own (sharing them, backward and the optimizer slow each other: measured in bench/RESULTS.md).
//
// After backward: step() leaves the chunks not updated during backward (no room for their copies, or the
// step waited after a clipped one) to the same worker, in chunk order, once the norm is known — their
// updates are final, nothing to undo — and returns. They run while the next forward starts: a chunk's
// gather (start_fetch) and its next gradient hand-off (release_grads) wait for its update
// (settle()), and so does everything that reads the state (step(), checkpoints, read_params,
// master_params). The first chunks are the last updated during backward's tail and the first the next
// forward needs, so the forward waits for about one chunk's update rather than all of them. Where the
// update cannot be made in place on the worker (NVMe, staged device params, the device optimizer,
// stages 1 and 2's all-gather), step() makes it as before. OverlapStats.deferred counts them.
//
// The norm: the worker also takes each chunk's gradient statistics (squared norm and finiteness, or at
// N ranks the per-block partials) as soon as its gradients are final — every chunk whose gradients the
// CPU reduces, updated early or not — so step() sums them instead of reading every gradient again after
// backward. The same function over the same bytes, summed in the same order: the same norm. They are
// taken again when a new backward starts or the early work is cancelled.
//
// Which steps: the last applied step's clipping predicts this one's, so after a clipped step the next
// is updated after backward (OverlapStats.waited) rather than rolled back again.
//
// Where it applies: the CPU optimizer updating state in addressable memory — offload_optimizer cpu, or
// none on the host backend — with working params at home in pinned host memory or on the device. Not
// overlapped (updated after backward, as before, with a log line): NVMe-resident optimizer states (the
// swap pipeline reads and writes them by sub-group after backward), NVMe-resident working params, and
// the device optimizer (offload_optimizer none, or the sub-groups offload_optimizer.ratio keeps on the
// device, where the device is reached by stream work only). A device home the CPU cannot address (cuda)
// receives the new working params at step(), from the copy area, when the updates stand.
#include "zero3/engine_overlap.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/log.h"
#include "core/topology.h"
#include "zero3/engine_update.h"

namespace strata::zero3 {

using detail::cat;

std::vector<std::pair<void*, std::size_t>> OptimizerOverlap::regions(const ChunkSlot& s) const {
  const std::size_t n = s.shard.numel;
  std::vector<std::pair<void*, std::size_t>> r{{s.master, n * sizeof(float)}};
  if (env_.rule.keeps_exp_avg()) r.emplace_back(s.exp_avg, n * sizeof(float));
  if (env_.rule.keeps_exp_avg_sq()) r.emplace_back(s.exp_avg_sq, n * sizeof(float));
  if (s.route.params != UpdateRoute::Params::staged)
    r.emplace_back(env_.my_params(s), n * env_.working_dtype_bytes());
  return r;
}

std::byte* OptimizerOverlap::staging(const ChunkSlot& s) const {
  const std::size_t states = std::size_t(1 + env_.rule.states()) * s.shard.numel * sizeof(float);
  return backup_.get() + backup_at_[std::size_t(s.id)] + states;
}

void OptimizerOverlap::open() {
  const std::size_t C = env_.slots.size();
  // The copies of the chunks the plan overlaps (UpdateRoute.overlap), the last chunk's first.
  std::uint64_t total = 0;
  int chunks = 0;
  backup_at_.assign(C, 0);
  for (std::size_t i = C; i-- > 0;) {
    if (!env_.slots[i].route.overlap) continue;
    backup_at_[i] = total;
    total += overlap_copy_bytes(env_.planned, env_.slots[i].shard.numel);
    ++chunks;
  }
  if (chunks == 0) return;
  backup_ = std::make_unique<std::byte[]>(total);
  state_.assign(C, State::idle);
  copied_.assign(C, 0);
  grad_stats_.assign(C, {});
  deferred_.assign(C, 0);
  before_.resize(C);
  final_grads_.resize(C);
  for (std::size_t i = 0; i < C; ++i) final_grads_[i] = env_.dev->create_event();
  on_ = true;
  if (env_.comm->rank() == 0)
    STRATA_LOG_INFO("zero3: optimizer overlapped with backward for ", chunks, " of ", C, " chunks (",
                    env_.plan.overlap_groups, " of ", env_.groups.size(), " sub-groups); rollback copies ",
                    format_size(total), " of host memory");
}

void OptimizerOverlap::begin_backward(const BackwardStart& b) {
  if (!on_) return;
  // A second backward ending the accumulation before step() (more micro-batches than configured): what
  // the first one updated is undone, and this one updates again with every gradient.
  undo(UndoAs::cancellation);
  for (auto& st : grad_stats_) st.valid = false;
  armed_ = b.ends_step;
  if (armed_ && last_clipped_) {
    armed_ = false;
    ++stats_.waited;
  }
  if (!armed_) return;
  lr_ = b.lr;
  factor_ = b.unclipped_factor;
  step_no_ = b.step_no;
}

void OptimizerOverlap::end_backward(BackwardEnd how) {
  if (!on_) return;
  armed_ = false;
  if (how == BackwardEnd::failed) undo(UndoAs::cancellation);
}

void OptimizerOverlap::handed_off(const ChunkSlot& s, Stream& on, int seen, int expected) {
  if (!on_) return;
  const std::size_t c = std::size_t(s.id);
  // Chunks the optimizer does not update here still get their gradient statistics taken early, where the
  // CPU reduces their gradients.
  const bool stats_only = !s.route.overlap && s.route.stepper != UpdateRoute::Stepper::device_ops;
  if (!armed_ || !(s.route.overlap || stats_only) || expected == 0) return;
  if (seen > expected) {
    // More hand-offs than the last backward made: this pass has another shape, and the chunk's update
    // was made too early. Undo them all; this step updates after backward.
    STRATA_LOG_DEBUG("zero3: chunk ", s.name, " got gradients after its update; the step waits");
    undo(UndoAs::cancellation);
    armed_ = false;
    return;
  }
  if (seen < expected) return;
  on.record(*final_grads_[c]);
  {
    std::lock_guard<std::mutex> lk(mu_);
    state_[c] = State::queued;
    queue_.push_back(int(c));
    ++early_pending_;
  }
  cv_.notify_all();
  if (!worker_.joinable()) worker_ = std::thread([this] { worker(); });
}

void OptimizerOverlap::worker() {
  // Its updates write device homes and wait for events (Note [thread device] in core/device.h).
  try {
    env_.dev->bind_thread();
  } catch (...) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!error_) error_ = std::current_exception();
  }
  // With cores of its own (Note [Cores] in engine_plan.cpp) the worker's copies run there too, not on the
  // model's cpus.
  if (env_.cfg.strata.cpu_optim.cores > 0 && env_.cfg.strata.cpu_optim.pin_threads) {
    try {
      pin_current_thread(env_.optimizer_cpus);
    } catch (const Error& e) {
      STRATA_WARN_ONCE("zero3: cannot pin the optimizer overlap's worker (", e.what(), "); running unpinned");
    }
  }
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and drained
    const int c = queue_.front();
    queue_.pop_front();
    ++running_;
    lk.unlock();
    std::exception_ptr err;
    const bool deferred = deferred_[std::size_t(c)] != 0;  // set before queueing, cleared below
    try {
      if (deferred) {
        const ChunkSlot& s = env_.slots[std::size_t(c)];
        updater_.update_chunk(s, s.grad, s.master, s.exp_avg, s.exp_avg_sq, env_.my_params(s), deferred_lr_,
                              deferred_factor_, deferred_step_);
      } else if (env_.slots[std::size_t(c)].route.overlap) {
        update(c);
      } else {
        take_grad_stats(c);
      }
    } catch (...) {
      err = std::current_exception();
    }
    lk.lock();
    --running_;
    if (deferred) {
      deferred_[std::size_t(c)] = 0;
      --deferred_pending_;
      if (err && !deferred_error_) deferred_error_ = err;
      cv_.notify_all();
      continue;
    }
    --early_pending_;
    if (err) {
      state_[std::size_t(c)] = State::failed;
      if (!error_) error_ = err;
    } else {
      state_[std::size_t(c)] = env_.slots[std::size_t(c)].route.overlap ? State::done : State::idle;
    }
    cv_.notify_all();
  }
}

// On the worker: chunk c's gradient statistics, as GradientPath::stats() would take them.
void OptimizerOverlap::take_grad_stats(int c) {
  const ChunkSlot& s = env_.slots[std::size_t(c)];
  final_grads_[std::size_t(c)]->synchronize();
  grad_stats_[std::size_t(c)] = shard_norm(s.route, *env_.opt, s.grad, s.shard.numel);
}

// On the worker: chunk c's gradient statistics, its copies, then its update as step() would make it
// unclipped.
void OptimizerOverlap::update(int c) {
  const ChunkSlot& s = env_.slots[std::size_t(c)];
  take_grad_stats(c);
  std::byte* b = backup_.get() + backup_at_[std::size_t(c)];
  for (const auto& [p, bytes] : regions(s)) {
    std::memcpy(b, p, bytes);
    b += bytes;
  }
  before_[std::size_t(c)] = updater_.shard_step(c);
  copied_[std::size_t(c)] = 1;  // from here on, undoing puts the copies back
  // Working params in place (pinned home, or a device the CPU addresses); a device home reached by stream
  // work only receives them at step(), from the staging after the copies.
  const bool staged = s.route.params == UpdateRoute::Params::staged;
  updater_.update_chunk(s, s.grad, s.master, s.exp_avg, s.exp_avg_sq, staged ? staging(s) : env_.my_params(s),
                        lr_, factor_, step_no_);
}

void OptimizerOverlap::wait() {
  if (!on_) return;
  std::exception_ptr err;
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return early_pending_ == 0; });
    std::swap(err, error_);
  }
  if (err) {
    undo(UndoAs::cancellation);
    std::rethrow_exception(err);
  }
}

bool OptimizerOverlap::done(std::size_t c) const {
  return on_ && state_[c] == State::done;
}

bool OptimizerOverlap::assumed(float factor, double lr, std::int64_t step_no) const {
  return factor == factor_ && lr == lr_ && step_no == step_no_;
}

void OptimizerOverlap::keep(std::size_t c) {
  const ChunkSlot& s = env_.slots[c];
  if (s.route.params == UpdateRoute::Params::staged)
    env_.to_device(env_.my_params(s), staging(s), s.shard.numel * env_.working_dtype_bytes());
  state_[c] = State::idle;
  copied_[c] = 0;
  ++stats_.updates;
}

void OptimizerOverlap::undo(UndoAs as) {
  if (!on_) return;
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return early_pending_ == 0; });
    error_ = nullptr;  // the copies below undo whatever the failed update wrote
  }
  if (as ==
      UndoAs::cancellation)  // gradients may still change before the step: their statistics are taken again
    for (auto& st : grad_stats_) st.valid = false;
  const auto t0 = Clock::now();
  bool any = false;
  for (std::size_t c = 0; c < env_.slots.size(); ++c) {
    if (state_[c] == State::idle) continue;
    const bool wrote = copied_[c] != 0;
    state_[c] = State::idle;
    copied_[c] = 0;
    if (!wrote) continue;
    any = true;
    ++stats_.updates;
    const ChunkSlot& s = env_.slots[c];
    const std::byte* b = backup_.get() + backup_at_[c];
    for (const auto& [p, bytes] : regions(s)) {
      std::memcpy(p, b, bytes);
      b += bytes;
    }
    updater_.set_shard_step(int(c), before_[c]);
  }
  if (!any) return;
  if (as == UndoAs::rollback) {
    ++stats_.rollbacks;
    stats_.rollback_seconds += seconds_since(t0);
  } else {
    ++stats_.cancelled;
  }
}

void OptimizerOverlap::defer(const std::vector<int>& chunks, double lr, float factor, std::int64_t step_no) {
  if (chunks.empty()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    deferred_lr_ = lr;
    deferred_factor_ = factor;
    deferred_step_ = step_no;
    for (int c : chunks) {
      deferred_[std::size_t(c)] = 1;
      ++deferred_pending_;
      queue_.push_back(c);
    }
    stats_.deferred += chunks.size();
  }
  cv_.notify_all();
  if (!worker_.joinable()) worker_ = std::thread([this] { worker(); });
}

void OptimizerOverlap::settle(int c) {
  if (!on_) return;
  settle_until([&] { return deferred_[std::size_t(c)] == 0; });
}

void OptimizerOverlap::settle_all() {
  if (!on_) return;
  settle_until([&] { return deferred_pending_ == 0; });
}

void OptimizerOverlap::settle_until(const std::function<bool()>& settled) {
  std::exception_ptr err;
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, settled);
    std::swap(err, deferred_error_);
  }
  if (err) std::rethrow_exception(err);
}

void OptimizerOverlap::stop() {
  if (!on_) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

}  // namespace strata::zero3
