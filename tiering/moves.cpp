// Transfers between tiers: issuing the first step under the manager's mutex, finishing the rest on a
// mover thread, and the Move handle callers wait on.
//
// Note [the six paths]
//   pinned -> device   one H2D copy on the manager's H2D stream            (source used in place)
//   device -> pinned   one D2H copy on the D2H stream                      (destination used in place)
//   nvme   -> pinned   one SwapStore read straight into the pinned block
//   pinned -> nvme     one SwapStore write straight from the pinned block
//   nvme   -> device   read into a pinned staging block, then H2D from it
//   device -> nvme     D2H into a pinned staging block, then write from it
// The first step is issued by the caller (so it starts at once); a mover thread waits for each step,
// issues the next and posts the completion. A caller's `after` event is honoured by making our stream
// wait for it (copies), or by recording it on our stream as a gate the mover waits for before it
// submits the I/O (I/O-first paths). Each move has two moments the manager cares about: the source has
// been read (read_done: an evicted source block may be reused) and the data is in place (done).
// A mover waits for the device's events and issues H2D copies, so it binds the manager's device before
// each job (Note [thread device] in core/device.h; binding an already bound thread is one cheap call).
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "tiering/manager_impl.h"

namespace strata::tiering {

using detail::MoveJob;
using detail::Tensor;

// ---------------------------------------------------------------- Move

bool Move::done() const {
  return !job_ || job_->done.ready();
}

void Move::wait() const {
  if (!job_) return;
  job_->done.wait();
  if (job_->error) std::rethrow_exception(job_->error);
}

void Move::enqueue_wait(Stream& s) const {
  if (!job_ || job_->done.ready()) return;
  if (job_->copy_recorded.load(std::memory_order_acquire)) {
    s.wait(*job_->copy_done);
    return;
  }
  s.host_fn([j = job_] { j->done.wait(); });
}

TensorId Move::tensor() const {
  return job_ ? job_->id : 0;
}
Tier Move::from() const {
  return job_ ? job_->from : Tier::device;
}
Tier Move::to() const {
  return job_ ? job_->to : Tier::device;
}
std::uint64_t Move::bytes() const {
  return job_ ? job_->bytes : 0;
}

// ---------------------------------------------------------------- Mover

namespace detail {

Mover::Mover(std::string name, Run run)
    : name_(std::move(name)), run_(std::move(run)), thread_([this] { loop(); }) {}

Mover::~Mover() {
  {
    std::lock_guard<std::mutex> lk(m_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Mover::push(std::shared_ptr<MoveJob> j) {
  {
    std::lock_guard<std::mutex> lk(m_);
    q_.push_back(std::move(j));
  }
  cv_.notify_one();
}

void Mover::loop() {
  for (;;) {
    std::shared_ptr<MoveJob> j;
    {
      std::unique_lock<std::mutex> lk(m_);
      cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;  // stopping, and drained
      j = std::move(q_.front());
      q_.pop_front();
    }
    run_(j);
  }
}

}  // namespace detail

// ---------------------------------------------------------------- issue (manager mutex held)

Move TierManager::Impl::issue(Tensor& t, Tier from, Tier to, bool drop_source, const Event* after) {
  detail::Busy busy(t);  // its blocks are not eviction candidates while we place the others
  auto j = std::make_shared<MoveJob>();
  j->id = t.id;
  j->from = from;
  j->to = to;
  j->kind = t.desc.kind;
  j->bytes = t.desc.bytes;
  j->drop_source = drop_source;
  j->src = t.block[int(from)];
  STRATA_CHECK(j->src, "tiering: \"", t.desc.name, "\" has no block on ", to_string(from), " to move from");
  if (!t.block[int(to)]) t.block[int(to)] = place(to, j->bytes, j->kind, t.id, t.desc.name);
  j->dst = t.block[int(to)];
  bool staged = (from == Tier::device && to == Tier::nvme) || (from == Tier::nvme && to == Tier::device);
  if (staged) j->staging = place(Tier::pinned, j->bytes, Kind::staging, t.id, t.desc.name);
  j->copy_done = dev.create_event();
  j->t_issue = now();

  const std::size_t n = j->bytes;
  auto gate = [&] {
    j->gate = dev.create_event();
    d2h->wait(*after);
    d2h->record(*j->gate);
  };
  if (from == Tier::pinned && to == Tier::device) {
    if (after) h2d->wait(*after);
    h2d->copy_async(j->dst.ptr, j->src.ptr, n, CopyKind::host_to_device);
    h2d->record(*j->copy_done);
    j->copy_recorded.store(true, std::memory_order_release);
  } else if (from == Tier::device && to == Tier::pinned) {
    if (after) d2h->wait(*after);
    d2h->copy_async(j->dst.ptr, j->src.ptr, n, CopyKind::device_to_host);
    d2h->record(*j->copy_done);
    j->copy_recorded.store(true, std::memory_order_release);
  } else if (from == Tier::device && to == Tier::nvme) {
    if (after) d2h->wait(*after);
    d2h->copy_async(j->staging.ptr, j->src.ptr, n, CopyKind::device_to_host);
    d2h->record(*j->copy_done);
  } else if (after) {
    gate();  // the mover submits the I/O once the caller's work is done
  } else if (from == Tier::nvme && to == Tier::pinned) {
    j->io = swap->read(j->src.extent, j->dst.ptr);
  } else if (from == Tier::pinned && to == Tier::nvme) {
    j->io = swap->write(j->dst.extent, j->src.ptr);
  } else {  // nvme -> device
    j->io = swap->read(j->src.extent, j->staging.ptr);
  }

  record(EventType::move_issued, from, to, j->kind, t.id, n, j->t_issue);
  t.flight = j;
  if (drop_source) {
    // The source's bytes are accounted as freed when the mover reports the read done (process_completions).
    pools[int(from)]->free(j->src, std::shared_ptr<const Fence>(j, &j->read_done));
    t.block[int(from)] = {};
    t.valid &= TierMask(~bit(from));
  }
  if (staged) pools[int(Tier::pinned)]->free(j->staging, std::shared_ptr<const Fence>(j, &j->done));
  (int(to) < int(from) ? up : down)->push(j);
  return Move(j);
}

// ---------------------------------------------------------------- run (a mover thread)

void TierManager::Impl::post(const std::shared_ptr<MoveJob>& j, bool finished) {
  std::lock_guard<std::mutex> lk(done_mu);
  completed.push_back({j, finished});
}

void TierManager::Impl::run_job(const std::shared_ptr<MoveJob>& jp) {
  MoveJob& j = *jp;
  bool read = false;
  // The source has been read: post before signalling, so that whoever reuses the block (after waiting
  // for read_done) finds this completion already posted and accounts the free first.
  auto source_read = [&] {
    if (read) return;
    read = true;
    j.t_read = now();
    if (j.drop_source) post(jp, false);
    j.read_done.signal();
  };
  auto submit = [&] {
    if (j.gate) j.gate->synchronize();
    if (j.io) return;
    if (j.from == Tier::nvme)
      j.io = swap->read(j.src.extent, j.to == Tier::pinned ? j.dst.ptr : j.staging.ptr);
    else
      j.io = swap->write(j.dst.extent, j.from == Tier::pinned ? j.src.ptr : j.staging.ptr);
  };
  try {
    dev.bind_thread();
    if ((j.from == Tier::pinned && j.to == Tier::device) ||
        (j.from == Tier::device && j.to == Tier::pinned)) {
      j.copy_done->synchronize();
      source_read();
    } else if (j.from == Tier::device) {  // device -> nvme
      j.copy_done->synchronize();
      source_read();
      submit();
      swap->wait(j.io);
    } else {  // nvme -> pinned, pinned -> nvme, nvme -> device
      submit();
      swap->wait(j.io);
      source_read();
      if (j.to == Tier::device) {
        h2d->copy_async(j.dst.ptr, j.staging.ptr, j.bytes, CopyKind::host_to_device);
        h2d->record(*j.copy_done);
        j.copy_recorded.store(true, std::memory_order_release);
        j.copy_done->synchronize();
      }
    }
  } catch (...) {
    j.error = std::current_exception();
  }
  source_read();
  j.t_done = now();
  post(jp, true);
  j.done.signal();
}

}  // namespace strata::tiering
