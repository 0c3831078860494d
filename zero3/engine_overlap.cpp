// The CPU optimizer overlapped with backward.
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
// (overlap_settle), and so does everything that reads the state (step(), checkpoints, read_params,
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
#include <algorithm>
#include <cstring>
#include <limits>

#include "core/log.h"
#include "core/topology.h"
#include "zero3/engine_impl.h"

namespace strata::zero3 {

using detail::cat;
using State = OptimizerOverlap::State;

namespace {

constexpr std::size_t kCopyAlign = 64;

}  // namespace

std::vector<std::pair<void*, std::size_t>> Engine::Impl::overlap_regions(ChunkSlot& s) const {
  const std::size_t n = s.shard.numel;
  std::vector<std::pair<void*, std::size_t>> r{{s.master, n * sizeof(float)}};
  if (cfg.optimizer.type != OptimizerType::Adagrad) r.emplace_back(s.exp_avg, n * sizeof(float));
  if (cfg.optimizer.type != OptimizerType::Lion) r.emplace_back(s.exp_avg_sq, n * sizeof(float));
  if (s.route.params != UpdateRoute::Params::staged) r.emplace_back(my_params(s), n * wd_bytes());
  return r;
}

std::byte* Engine::Impl::overlap_staging(const ChunkSlot& s) const {
  const std::size_t states = std::size_t(1 + n_states) * s.shard.numel * sizeof(float);
  return overlap->backup.get() + overlap->backup_at[std::size_t(s.id)] + states;
}

void Engine::Impl::plan_overlap() {
  using OV = StrataConfig::Overlap;
  const OV mode = cfg.strata.overlap_optimizer;
  // "auto": where the model computes on a device and the optimizer in pinned host memory — the CPU is
  // otherwise idle during backward. On the host backend only when the optimizer has cores of its own
  // (strata.cpu_optim.cores, Note [Cores] in engine.cpp): sharing them, the early updates slow backward
  // as much as they save (measured: bench/RESULTS.md).
  if (mode == OV::off ||
      (mode == OV::automatic && (homes.master != Tier::pinned || (dev->caps().backend == BackendKind::host &&
                                                                  cfg.strata.cpu_optim.cores == 0))))
    return;
  auto o = std::make_unique<OptimizerOverlap>();
  const std::size_t C = slots.size();
  // Bytes of host memory the copies may take: half of what the plans of the ranks on this machine leave
  // of check_fits' 90% of RAM, shared evenly between those ranks (the other half stays free: with all of
  // it, 13 of the 720m-byte model's 16 chunks overlapped on this 23 GiB machine and backward slowed under
  // the memory pressure as much as the step gained). The least over ranks (Note [Ranks agree] in
  // engine.cpp): every rank overlaps the same chunks.
  const std::uint64_t per = 4 * std::uint64_t(1 + n_states) + wd_bytes();
  const std::uint64_t ram = physical_memory();
  const std::uint64_t host = host_need_here;
  const std::vector<std::uint64_t> rooms = every_ranks(
      ram == 0 ? std::numeric_limits<std::uint64_t>::max()
               : (ram / 10 * 9 > host ? (ram / 10 * 9 - host) / 2 / std::uint64_t(ranks_here) : 0));
  const std::uint64_t room = *std::min_element(rooms.begin(), rooms.end());
  const auto copy_bytes = [&](int c) {
    return (slots[std::size_t(c)].shard.numel * per + kCopyAlign - 1) / kCopyAlign * kCopyAlign;
  };
  // The plan decides which chunks (Note [Update routes] in placement.cpp).
  std::vector<UpdateRoute> routes(C);
  for (std::size_t i = 0; i < C; ++i) routes[i] = slots[i].route;
  const OverlapDecision d = zero3::plan_overlap(routes, plan, planned, room, copy_bytes);
  if (d.chunks == 0) {
    if (comm->rank() == 0 && (!d.ratio_keeps_all || mode == OV::on))
      STRATA_LOG_WARN("zero3: strata.overlap_optimizer is true but ", d.why_not);
    return;
  }
  std::uint64_t total = 0;
  o->backup_at.assign(C, 0);
  for (std::size_t i = C; i-- > 0;) {
    slots[i].route = routes[i];
    if (!routes[i].overlap) continue;
    o->backup_at[i] = total;
    total += copy_bytes(int(i));
  }
  const int chunks = d.chunks;
  o->backup = std::make_unique<std::byte[]>(total);
  o->state.assign(C, State::idle);
  o->copied.assign(C, 0);
  o->grad_stats.assign(C, {});
  o->deferred.assign(C, 0);
  o->before.resize(C);
  o->final_grads.resize(C);
  for (std::size_t i = 0; i < C; ++i) o->final_grads[i] = dev->create_event();
  overlap = std::move(o);
  if (comm->rank() == 0)
    STRATA_LOG_INFO("zero3: optimizer overlapped with backward for ", chunks, " of ", C, " chunks (",
                    plan.overlap_groups, " of ", groups.size(), " sub-groups); rollback copies ",
                    format_size(total), " of host memory");
}

void Engine::Impl::overlap_begin_backward() {
  if (!overlap) return;
  OptimizerOverlap& o = *overlap;
  // A second backward ending the accumulation before step() (more micro-batches than configured): what
  // the first one updated is undone, and this one updates again with every gradient.
  overlap_undo(false);
  for (auto& st : o.grad_stats) st.ready = false;
  o.armed = micro_steps + 1 >= cfg.gradient_accumulation_steps;
  if (o.armed && o.last_clipped) {
    o.armed = false;
    ++o.stats.waited;
  }
  if (!o.armed) return;
  o.lr = sched.lr();
  o.factor = float(1.0 / scaler.scale());  // grad_scale's factor when clipping does not fire
  o.step_no = applied_steps + 1;
}

void Engine::Impl::overlap_end_backward(bool ok) {
  if (!overlap) return;
  OptimizerOverlap& o = *overlap;
  o.armed = false;
  if (!ok) overlap_undo(false);
}

void Engine::Impl::overlap_handed_off(ChunkSlot& s, Stream& on) {
  if (!overlap) return;
  OptimizerOverlap& o = *overlap;
  const std::size_t c = std::size_t(s.id);
  const int seen = handoffs_seen[c], expected = handoffs_expected[c];  // this one counted
  // Chunks the optimizer does not update here still get their gradient statistics taken early, where the
  // CPU reduces their gradients.
  const bool stats_only = !s.route.overlap && s.route.stepper != UpdateRoute::Stepper::device_ops;
  if (!o.armed || !(s.route.overlap || stats_only) || expected == 0) return;
  if (seen > expected) {
    // More hand-offs than the last backward made: this pass has another shape, and the chunk's update
    // was made too early. Undo them all; this step updates after backward.
    STRATA_LOG_DEBUG("zero3: chunk ", s.name, " got gradients after its update; the step waits");
    overlap_undo(false);
    o.armed = false;
    return;
  }
  if (seen < expected) return;
  on.record(*o.final_grads[c]);
  {
    std::lock_guard<std::mutex> lk(o.mu);
    o.state[c] = State::queued;
    o.queue.push_back(int(c));
    ++o.early_pending;
  }
  o.cv.notify_all();
  if (!o.worker.joinable()) o.worker = std::thread([this] { overlap_worker(); });
}

void Engine::Impl::overlap_worker() {
  OptimizerOverlap& o = *overlap;
  // Its updates write device homes and wait for events (Note [thread device] in core/device.h).
  try {
    dev->bind_thread();
  } catch (...) {
    std::lock_guard<std::mutex> lk(o.mu);
    if (!o.error) o.error = std::current_exception();
  }
  // With cores of its own (Note [Cores] in engine.cpp) the worker's copies run there too, not on the
  // model's cpus.
  if (cfg.strata.cpu_optim.cores > 0 && cfg.strata.cpu_optim.pin_threads) {
    try {
      pin_current_thread(optimizer_cpus);
    } catch (const Error& e) {
      STRATA_WARN_ONCE("zero3: cannot pin the optimizer overlap's worker (", e.what(), "); running unpinned");
    }
  }
  std::unique_lock<std::mutex> lk(o.mu);
  for (;;) {
    o.cv.wait(lk, [&] { return o.stop || !o.queue.empty(); });
    if (o.queue.empty()) return;  // stopping, and drained
    const int c = o.queue.front();
    o.queue.pop_front();
    ++o.running;
    lk.unlock();
    std::exception_ptr err;
    const bool deferred = o.deferred[std::size_t(c)] != 0;  // set before queueing, cleared below
    try {
      if (deferred) {
        ChunkSlot& s = slots[std::size_t(c)];
        update_chunk(s, s.master, s.exp_avg, s.exp_avg_sq, my_params(s), o.deferred_lr, o.deferred_factor,
                     o.deferred_step);
      } else if (slots[std::size_t(c)].route.overlap) {
        overlap_update(c);
      } else {
        overlap_grad_stats(c);
      }
    } catch (...) {
      err = std::current_exception();
    }
    lk.lock();
    --o.running;
    if (deferred) {
      o.deferred[std::size_t(c)] = 0;
      --o.deferred_pending;
      if (err && !o.deferred_error) o.deferred_error = err;
      o.cv.notify_all();
      continue;
    }
    --o.early_pending;
    if (err) {
      o.state[std::size_t(c)] = State::failed;
      if (!o.error) o.error = err;
    } else {
      o.state[std::size_t(c)] = slots[std::size_t(c)].route.overlap ? State::done : State::idle;
    }
    o.cv.notify_all();
  }
}

// On the worker: chunk c's gradient statistics, as grad_stats() would take them.
void Engine::Impl::overlap_grad_stats(int c) {
  OptimizerOverlap& o = *overlap;
  ChunkSlot& s = slots[std::size_t(c)];
  o.final_grads[std::size_t(c)]->synchronize();
  OptimizerOverlap::GradStats& st = o.grad_stats[std::size_t(c)];
  if (world > 1) {
    st.blocks = opt->grad_block_sums(s.grad, DType::fp32, s.shard.numel, 1.0f);
  } else {
    const cpu_optim::GradStats g = opt->grad_stats(s.grad, DType::fp32, s.shard.numel, 1.0f);
    st.sum_sq = g.sum_sq;
    st.finite = g.finite;
  }
  st.ready = true;
}

// On the worker: chunk c's gradient statistics, its copies, then its update as step() would make it
// unclipped.
void Engine::Impl::overlap_update(int c) {
  OptimizerOverlap& o = *overlap;
  ChunkSlot& s = slots[std::size_t(c)];
  overlap_grad_stats(c);
  std::byte* b = o.backup.get() + o.backup_at[std::size_t(c)];
  for (const auto& [p, bytes] : overlap_regions(s)) {
    std::memcpy(b, p, bytes);
    b += bytes;
  }
  o.before[std::size_t(c)] = s.opt;
  o.copied[std::size_t(c)] = 1;  // from here on, undoing puts the copies back
  // Working params in place (pinned home, or a device the CPU addresses); a device home reached by stream
  // work only receives them at step(), from the staging after the copies.
  const bool staged = s.route.params == UpdateRoute::Params::staged;
  update_chunk(s, s.master, s.exp_avg, s.exp_avg_sq, staged ? overlap_staging(s) : my_params(s), o.lr,
               o.factor, o.step_no);
}

void Engine::Impl::overlap_wait() {
  if (!overlap) return;
  OptimizerOverlap& o = *overlap;
  std::exception_ptr err;
  {
    std::unique_lock<std::mutex> lk(o.mu);
    o.cv.wait(lk, [&] { return o.early_pending == 0; });
    std::swap(err, o.error);
  }
  if (err) {
    overlap_undo(false);
    std::rethrow_exception(err);
  }
}

bool Engine::Impl::overlap_done(std::size_t c) const {
  return overlap && overlap->state[c] == State::done;
}

void Engine::Impl::overlap_keep(std::size_t c) {
  OptimizerOverlap& o = *overlap;
  ChunkSlot& s = slots[c];
  if (s.route.params == UpdateRoute::Params::staged)
    to_device(my_params(s), overlap_staging(s), s.shard.numel * wd_bytes());
  o.state[c] = State::idle;
  o.copied[c] = 0;
  ++o.stats.updates;
}

void Engine::Impl::overlap_undo(bool rollback) {
  if (!overlap) return;
  OptimizerOverlap& o = *overlap;
  {
    std::unique_lock<std::mutex> lk(o.mu);
    o.cv.wait(lk, [&] { return o.early_pending == 0; });
    o.error = nullptr;  // the copies below undo whatever the failed update wrote
  }
  if (!rollback)  // gradients may still change before the step: their statistics are taken again
    for (auto& st : o.grad_stats) st.ready = false;
  const auto t0 = Clock::now();
  bool any = false;
  for (std::size_t c = 0; c < slots.size(); ++c) {
    if (o.state[c] == State::idle) continue;
    const bool wrote = o.copied[c] != 0;
    o.state[c] = State::idle;
    o.copied[c] = 0;
    if (!wrote) continue;
    any = true;
    ++o.stats.updates;
    ChunkSlot& s = slots[c];
    const std::byte* b = o.backup.get() + o.backup_at[c];
    for (const auto& [p, bytes] : overlap_regions(s)) {
      std::memcpy(p, b, bytes);
      b += bytes;
    }
    s.opt = o.before[c];
  }
  if (!any) return;
  if (rollback) {
    ++o.stats.rollbacks;
    o.stats.rollback_seconds += seconds_since(t0);
  } else {
    ++o.stats.cancelled;
  }
}

void Engine::Impl::overlap_defer(const std::vector<int>& chunks, double lr, float factor,
                                 std::int64_t step_no) {
  if (chunks.empty()) return;
  OptimizerOverlap& o = *overlap;
  {
    std::lock_guard<std::mutex> lk(o.mu);
    o.deferred_lr = lr;
    o.deferred_factor = factor;
    o.deferred_step = step_no;
    for (int c : chunks) {
      o.deferred[std::size_t(c)] = 1;
      ++o.deferred_pending;
      o.queue.push_back(c);
    }
    o.stats.deferred += chunks.size();
  }
  o.cv.notify_all();
  if (!o.worker.joinable()) o.worker = std::thread([this] { overlap_worker(); });
}

void Engine::Impl::overlap_settle(int c) {
  if (!overlap) return;
  OptimizerOverlap& o = *overlap;
  std::exception_ptr err;
  {
    std::unique_lock<std::mutex> lk(o.mu);
    if (c < 0)
      o.cv.wait(lk, [&] { return o.deferred_pending == 0; });
    else
      o.cv.wait(lk, [&] { return o.deferred[std::size_t(c)] == 0; });
    std::swap(err, o.deferred_error);
  }
  if (err) std::rethrow_exception(err);
}

void Engine::Impl::overlap_stop() {
  if (!overlap) return;
  OptimizerOverlap& o = *overlap;
  {
    std::lock_guard<std::mutex> lk(o.mu);
    o.stop = true;
  }
  o.cv.notify_all();
  if (o.worker.joinable()) o.worker.join();
}

}  // namespace strata::zero3
