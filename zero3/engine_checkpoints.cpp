// The model's checkpointed block inputs in pinned host memory, moved by the tier manager: Note
// [Checkpoints off the device] in engine_checkpoints.h.
#include "zero3/engine_checkpoints.h"

#include "core/error.h"

namespace strata::zero3 {

using detail::cat;

void CheckpointOffload::plan(int count, std::size_t bytes, Tier home) {
  planned_count_ = count;
  planned_bytes_ = bytes;
  home_ = home;
}

CheckpointOffload::Entry& CheckpointOffload::at(int i) {
  STRATA_CHECK(i >= 0 && i < int(entries_.size()), "CheckpointOffload: checkpoint ", i, " of ",
               entries_.size());
  return entries_[std::size_t(i)];
}

void CheckpointOffload::hold(Entry& e) {
  if (!e.held) env_.tm->pin(e.id), e.held = true;
}

void CheckpointOffload::let_go(Entry& e) {
  if (e.held) env_.tm->unpin(e.id), e.held = false;
}

void CheckpointOffload::begin(int count, std::size_t bytes) {
  tiering::TierManager& tm = *env_.tm;
  if (count != int(entries_.size()) || bytes > bytes_) {
    // The first forward, or a longer one than the tensors hold: (re)registered, at least the plan's size.
    reset();
    if (!entries_.empty()) {
      Event& after = *entries_.front().done;
      env_.compute_stream->record(after);
      for (Entry& e : entries_) let_go(e), tm.unregister_tensor(e.id, &after);
    }
    entries_.clear();
    bytes_ = std::max(bytes, planned_bytes_);
    entries_.resize(std::size_t(count));
    for (int i = 0; i < count; ++i) {
      Entry& e = entries_[std::size_t(i)];
      e.id = tm.register_tensor({.name = cat("activations.", i),
                                 .kind = tiering::Kind::activation,
                                 .dtype = DType::u8,
                                 .bytes = bytes_,
                                 .home = home_});
      e.written = env_.dev->create_event();
      e.done = env_.dev->create_event();
    }
    return;
  }
  reset();
}

void CheckpointOffload::free_done(std::size_t keep) {
  std::vector<int> still;
  for (std::size_t k = 0; k < leaving_.size(); ++k) {
    Entry& e = at(leaving_[k]);
    const bool wait = leaving_.size() - k > keep;  // the oldest beyond `keep`
    if (!wait && e.out && !e.out.done()) {
      still.push_back(leaving_[k]);
      continue;
    }
    e.out = {};
    // The pinned copy is valid once the copy out is done (the manager waits for it where it has not):
    // only the device block goes, after the compute stream's last read (e.done).
    env_.tm->evict(e.id, Tier::device, Tier::pinned, e.done.get());
    // On to NVMe, where that is home: the pinned copy goes once written there.
    if (home_ == Tier::nvme) env_.tm->evict(e.id, Tier::pinned, Tier::nvme);
  }
  leaving_ = std::move(still);
}

void CheckpointOffload::reset() {
  free_done(0);
  for (int i = 0; i < int(entries_.size()); ++i) {
    Entry& e = entries_[std::size_t(i)];
    e.back = {};
    e.out = {};
    let_go(e);
    if (last(i)) {  // never copied out: its data is dead with the forward's
      if (env_.tm->data(e.id, Tier::device) != nullptr) {
        env_.compute_stream->record(*e.done);
        env_.tm->discard(e.id, Tier::device, e.done.get());
      }
      continue;
    }
    if (env_.tm->data(e.id, Tier::device) != nullptr) {
      // Free it after the compute stream's work so far; a copy with no valid home copy is kept first.
      env_.compute_stream->record(*e.done);
      env_.tm->evict(e.id, Tier::device, home_, e.done.get());
    }
  }
}

void* CheckpointOffload::put(int i) {
  // Room for this one: at most kCheckpointWindow - 1 others on the device (the one being read); one whose
  // copy out may still run is waited for here (it has had the whole of the last block's forward).
  free_done(std::size_t(kCheckpointWindow) - 2);
  Entry& e = at(i);
  void* p = env_.tm->allocate(e.id, Tier::device);
  hold(e);
  return p;
}

void CheckpointOffload::written(int i) {
  Entry& e = at(i);
  env_.tm->mark_written(e.id, Tier::device);
  if (last(i)) return;
  env_.compute_stream->record(*e.written);
  e.out = env_.tm->fetch(e.id, Tier::pinned, e.written.get());  // out beside the next block's forward
  ++moved_out_;
}

void CheckpointOffload::forward_done(int i) {
  Entry& e = at(i);
  if (last(i)) return;
  let_go(e);
  env_.compute_stream->record(*e.done);
  leaving_.push_back(i);
  free_done(1);
}

void* CheckpointOffload::get(int i, int next) {
  tiering::TierManager& tm = *env_.tm;
  free_done(0);  // backward: every copy out has long ended
  Entry& e = at(i);
  if (!e.back && !last(i)) {
    e.back = tm.fetch(e.id, Tier::device);
    if (e.back) ++moved_back_;
  }
  hold(e);
  e.back.enqueue_wait(*env_.compute_stream);
  e.back = {};
  void* p = tm.data(e.id, Tier::device);
  STRATA_CHECK(p != nullptr, "CheckpointOffload: checkpoint ", i, " is not on the device");
  if (next >= 0 && !last(next)) {
    Entry& n = at(next);
    n.back = tm.fetch(n.id, Tier::device);  // back beside this block's backward
    if (n.back) ++moved_back_;
    hold(n);
  }
  return p;
}

void CheckpointOffload::backward_done(int i) {
  Entry& e = at(i);
  let_go(e);
  env_.compute_stream->record(*e.done);
  if (last(i)) {  // never copied out, and read for the last time
    env_.tm->discard(e.id, Tier::device, e.done.get());
    return;
  }
  // Its home copy (pinned, or on NVMe) is valid: only the device block goes.
  env_.tm->evict(e.id, Tier::device, home_, e.done.get());
}

}  // namespace strata::zero3
