// Internal to zero3: the optimizer overlapped with backward — Note [Optimizer overlap] in
// engine_overlap.cpp. The engine's part that updates chunks during backward on a worker thread, puts the
// state back when the step does not apply as assumed, and runs the updates step() leaves to it while the
// next forward starts.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "zero3/engine_gate.h"
#include "zero3/engine_state.h"

namespace strata::zero3 {

class Updater;

// How the model's backward ended (end_backward): completed, or failed (its updates are cancelled).
enum class BackwardEnd : std::uint8_t { completed, failed };

// Note [Overlap locking]: one training thread calls every public method; the worker thread (started at
// the first hand-off or defer, joined by stop()) runs worker(), update() and take_grad_stats(), never a
// public method.
//   - Under `mu_` (both threads; `cv_` signals each change): queue_, running_, stop_, error_,
//     deferred_error_, early_pending_, deferred_pending_, the deferred_lr_ / deferred_factor_ /
//     deferred_step_ that defer() sets, deferred_[c] (set by defer() before it queues c, cleared by the
//     worker when c's update is done; the worker reads its own entry unlocked), and state_ while early
//     work is pending (handed_off queues, the worker marks done or failed).
//   - Handed over by the queue, no lock: while chunk c's early work is queued or running, the worker
//     alone touches c's master, optimizer states, working params and ShardStep, its copies in `backup_`,
//     before_[c], copied_[c] and grad_stats_[c], and reads c's final gradients (after final_grads_[c]),
//     lr_, factor_ and step_no_; nothing in the pass touches them then (Note [Optimizer overlap]). The
//     training thread reads or writes them (done, keep, early_stats, undo, begin_backward) only once
//     early_pending_ is 0 — after wait() or undo()'s own wait — and sets lr_ / factor_ / step_no_ only
//     then (begin_backward undoes first).
//   - The same for a deferred update: while deferred_[c] is set the worker alone touches chunk c's state,
//     and every reader of it settles c first (settle, or settle_all: the gather, the gradient hand-off,
//     step(), checkpoints, reading params). defer() is called only with none pending (step() settles them
//     all first), so the deferred rate, factor and number do not change under a running update.
//   - Training thread only: on_, armed_, last_clipped_, stats_, worker_. Set once by plan(), before the
//     worker starts: backup_at_, backup_, the vectors' sizes and final_grads_'s events (recorded by
//     handed_off before it queues the chunk; the worker only waits for them).
//   - The CPU optimizer (EngineEnv::opt, through updater_) is called by both threads at once, which
//     cpu_optim allows (its header: "Several threads may call one Optimizer at once").
// Public methods take `mu_` only for the members above and never call one another under it; the worker
// holds it only between chunks, never during an update.
class OptimizerOverlap {
 public:
  OptimizerOverlap(const EngineEnv& env, Updater& updater) : env_(env), updater_(updater) {}
  ~OptimizerOverlap() { stop(); }
  OptimizerOverlap(const OptimizerOverlap&) = delete;
  OptimizerOverlap& operator=(const OptimizerOverlap&) = delete;

  // After the plan chose the chunks updated during backward (their routes' `overlap`, Note [Update
  // routes]; the engine's choose_overlap): their rollback copies' host memory and the events. With none,
  // every call below does nothing.
  void open();
  bool on() const { return on_; }

  // The backward: before the model's (whether it ends the step's accumulation, and what the step would be
  // if it applied unclipped) and after it.
  void begin_backward(const BackwardStart& b);
  void end_backward(BackwardEnd how);
  // A gradient hand-off of chunk s was enqueued on `on`, the `seen`-th of this backward where the last
  // complete one made `expected`: the chunk's last one starts its update (on the worker).
  void handed_off(const ChunkSlot& s, Stream& on, int seen, int expected);
  // Waits for the worker; rethrows the first failed update (after undoing every update).
  void wait();
  // Undoes every update made during backward (exactly: the copies are put back), counting it `as` a
  // rollback (step) or a cancellation (anything else). No-op when there is none.
  void undo(UndoAs as);
  // step(): whether chunk c was updated during this backward (after wait()), and that its update stands
  // (its new working params to a device home).
  bool done(std::size_t c) const;
  void keep(std::size_t c);
  // step(): the step's factor, rate and number, against what the updates during backward assumed.
  bool assumed(float factor, double lr, std::int64_t step_no) const;
  // step(): whether the applied step clipped (the next one then waits for backward).
  void clipped(bool c) {
    if (on_) last_clipped_ = c;
  }
  void count_kept_step() { ++stats_.steps; }
  // step(): leaves the updates of `chunks` (their routes defer them) to the worker, in order.
  void defer(const std::vector<int>& chunks, double lr, float factor, std::int64_t step_no);
  // Waits for chunk c's deferred update (settle_all: every one); rethrows one that failed.
  void settle(int c);
  void settle_all();
  // Chunk c's gradient statistics taken on the worker from its final gradients, or null (not taken).
  const ShardNorm* early_stats(std::size_t c) const {
    return on_ && grad_stats_[c].valid ? &grad_stats_[c] : nullptr;
  }
  const OverlapStats& stats() const { return stats_; }
  void stop();  // joins the worker

 private:
  enum class State : std::uint8_t { idle, queued, done, failed };
  void worker();
  void update(int c);
  void take_grad_stats(int c);  // on the worker: chunk c's ShardNorm
  // Waits under `mu_` until `settled()`; rethrows a deferred update that failed.
  void settle_until(const std::function<bool()>& settled);
  // What a chunk's copies hold, in their order in `backup_`: master, the optimizer's states, and the
  // working params unless they are staged (UpdateRoute::Params::staged: a device home reached by stream
  // work only), whose new values then follow the copies (staging()).
  std::vector<std::pair<void*, std::size_t>> regions(const ChunkSlot& s) const;
  std::byte* staging(const ChunkSlot& s) const;

  const EngineEnv& env_;
  Updater& updater_;
  bool on_ = false;
  // Where the rollback copies of the chunks updated during backward (UpdateRoute.overlap) are in `backup_`
  // (byte offsets; the copies of a chunk are its master, optimizer states and working params, in that
  // order).
  std::vector<std::size_t> backup_at_;   // per chunk (overlapped chunks only)
  std::unique_ptr<std::byte[]> backup_;  // plan.overlap_host bytes
  // The pass.
  bool armed_ = false;  // this backward ends the step's accumulation: final hand-offs start updates
  // The last applied step clipped: the next one probably will too, so it is not updated early.
  bool last_clipped_ = false;
  // What the updates made during this backward assumed: the step applies unclipped.
  double lr_ = 0;
  float factor_ = 1;
  std::int64_t step_no_ = 0;
  std::vector<std::unique_ptr<Event>> final_grads_;  // per chunk: its last hand-off, on its stream
  std::vector<cpu_optim::ShardStep> before_;         // per chunk: its ShardStep before the update
  std::vector<char> copied_;  // per chunk: the worker has started overwriting (its copies are whole)
  // Per chunk: its gradients' statistics, taken by the worker from the final gradients (every chunk whose
  // gradients the CPU reduces, overlapped or not), for step()'s norm: the same function on the same bytes.
  // Ready until the next backward or a cancellation.
  std::vector<ShardNorm> grad_stats_;
  // The worker thread and its queue of chunks (Note [Overlap locking]).
  std::vector<State> state_;
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> queue_;
  int running_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;  // the first update that failed
  // Work made during backward (updates, gradient statistics) queued or running: what undo and wait wait
  // for.
  int early_pending_ = 0;
  // Updates step() left to the worker (deferred_[c]), with the step's rate, factor and number; they run
  // while the next forward starts, each chunk before its gather or gradients (settle).
  std::vector<char> deferred_;
  int deferred_pending_ = 0;
  double deferred_lr_ = 0;
  float deferred_factor_ = 1;
  std::int64_t deferred_step_ = 0;
  std::exception_ptr deferred_error_;
  OverlapStats stats_;
};

}  // namespace strata::zero3
