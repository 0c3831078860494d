// Engine worker: cuts parts into pieces, keeps the queue full, handles every completion.
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "nvme/engine_impl.h"

namespace strata::nvme {

using detail::Completion;
using detail::IoDesc;
using detail::Op;
using strata::detail::cat;

namespace {

// EINTR / EAGAIN on one piece are retried this many times in a row before they count as failures.
constexpr int kMaxRetries = 1000;

std::uint64_t round_up(std::uint64_t v, std::uint64_t a) {
  return (v + a - 1) / a * a;
}
std::uint64_t round_down(std::uint64_t v, std::uint64_t a) {
  return v - v % a;
}

std::string hint(int err, bool direct, const File& f) {
  switch (err) {
    case ENOSPC:
      return "; the file system holding it is full: free space there, or point nvme_path at a larger device";
    case EDQUOT:
      return "; the disk quota is exhausted: raise it, or point nvme_path elsewhere";
    case EFBIG:
      return "; the file size limit was reached (RLIMIT_FSIZE / ulimit -f, or the file system's maximum)";
    case EIO:
      return "; the device reported an I/O error: check the kernel log (dmesg) for the drive";
    case EINVAL:
      return direct ? cat("; O_DIRECT rejected the transfer (file system alignment: offsets ",
                          f.offset_align(), ", buffers ", f.mem_align(), ")")
                    : std::string();
    default:
      return "";
  }
}

}  // namespace

Worker::Worker(AioEngine::Impl& engine, std::unique_ptr<detail::Queue> queue, const AioOptions& opts)
    : engine_(engine),
      queue_(std::move(queue)),
      block_(opts.block_size),
      depth_(std::uint32_t(opts.queue_depth)),
      single_submit_(opts.single_submit),
      overlap_(opts.overlap_events) {
  fixed_ = queue_->caps().fixed_buffers;
  slots_.resize(depth_);
  for (std::uint32_t i = depth_; i-- > 0;) free_slots_.push_back(i);
  cursor_ = turn_ = parts_.end();
  thread_ = std::thread([this] { run(); });
}

Worker::~Worker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (Slot& s : slots_) std::free(s.bounce_buf);
}

void Worker::enqueue(std::vector<std::unique_ptr<Part>> parts) {
  std::unique_lock<std::mutex> lock(mu_);
  if (broken_) {
    const std::string why = broken_why_;
    lock.unlock();
    for (auto& part : parts) {
      std::shared_ptr<Request> r = part->req;
      r->fail(why);
      if (r->parts_left.fetch_sub(1, std::memory_order_acq_rel) == 1) engine_.complete(*r);
    }
    return;
  }
  for (auto& part : parts) incoming_.push_back(std::move(part));
  if (idle_) {
    lock.unlock();
    cv_.notify_one();
  } else if (wants_work_ && !wake_sent_) {
    // The worker may be blocked waiting for completions; one wake-up per batch of new parts is enough
    // (it clears wake_sent_ when it takes them).
    wake_sent_ = true;
    queue_->wake();
  }
}

void Worker::run() {
  try {
    loop();
  } catch (const std::exception& e) {
    fail_everything(e.what());
  }
}

void Worker::take_incoming() {
  wake_sent_ = false;
  while (!incoming_.empty()) {
    auto it = parts_.insert(parts_.end(), std::move(*incoming_.front()));
    incoming_.pop_front();
    if (cursor_ == parts_.end()) cursor_ = it;
  }
}

void Worker::loop() {
  std::vector<Completion> done(depth_);
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      while (incoming_.empty() && in_flight_ == 0 && cursor_ == parts_.end() && finished_.empty()) {
        if (stop_) return;
        idle_ = true;
        cv_.wait(lock);
        idle_ = false;
      }
      take_incoming();
    }
    // overlap_events: refill as soon as anything completed; otherwise only once the batch has drained.
    if (overlap_ || in_flight_ == 0) {
      while (!free_slots_.empty()) {
        std::uint32_t s = free_slots_.back();
        if (!cut_piece(s)) break;
        free_slots_.pop_back();
        ++in_flight_;
        stage(s);
      }
    }
    if (unsubmitted_) {
      unsubmitted_ = false;
      queue_->submit();
    }
    // Waking the callers of finished requests comes after the next pieces are in the kernel: on a busy
    // machine the woken thread may take this core, and the drive should not idle meanwhile.
    flush_finished();
    if (in_flight_ > 0) {
      {
        // A wake-up is worth its system calls only while a slot is free to take new work; with every
        // slot busy, the next completion brings the worker back anyway.
        std::lock_guard<std::mutex> lock(mu_);
        const bool can_issue = overlap_ && !free_slots_.empty();
        if (can_issue && !incoming_.empty()) continue;  // arrived since the top of the loop
        wants_work_ = can_issue;
      }
      std::size_t n = queue_->reap(overlap_ ? 1 : in_flight_, done.data(), done.size());
      for (std::size_t i = 0; i < n; ++i) handle(done[i]);
    }
  }
}

// Note [parts in turn]: a request over several segments (a swap extent striped over several drives)
// gives a worker one part per segment, each on its own file. Taken one after another, the parts would
// keep one drive busy at a time (all of a worker's queue_depth pieces on the first segment's file); so
// the next piece comes from the part after the one that gave the last piece, among the parts of the
// request at the cursor, and every file has pieces in flight at once. A worker's parts of one request
// arrive in one enqueue(), so that it does not start on the first file before it knows of the others.
// Parts of different requests are never interleaved: an earlier request still finishes first. A
// request with one part per worker (any single-file request) goes as before: the search always ends
// at the cursor.
std::list<Part>::iterator Worker::next_turn() {
  const Request* r = cursor_->req.get();
  for (auto it = turn_; it != parts_.end() && it->req.get() == r; ++it)
    if (it->pos < it->end) return it;
  return cursor_;  // from the top: the cursor's part has pieces left
}

bool Worker::cut_piece(std::uint32_t s) {
  while (cursor_ != parts_.end()) {
    Part& p = *cursor_;
    if (p.pos < p.end && !p.req->failed.load(std::memory_order_acquire)) break;
    p.pos = p.end;  // a failed request issues nothing more
    auto it = cursor_++;
    if (it->in_flight == 0) finish_part(it);
  }
  if (cursor_ == parts_.end()) return false;

  const std::list<Part>::iterator at = next_turn();
  turn_ = std::next(at);
  Part& p = *at;
  Request& r = *p.req;
  const File& f = *p.file;
  const std::uint64_t pos = p.pos, end = p.end;
  std::uint64_t stop;
  bool direct = false;
  if (f.direct()) {
    // Whole pages go direct; a partial page at either end goes through the buffered descriptor (Note
    // [direct and buffered halves] in nvme/file.h).
    const std::uint64_t pg = f.page_align();
    if (pos % pg != 0) {
      stop = std::min(round_up(pos, pg), end);
    } else if (end - pos < pg) {
      stop = end;
    } else {
      direct = true;
      std::uint64_t blk = block_ % pg == 0 ? block_ : std::max<std::uint64_t>(round_down(block_, pg), pg);
      stop = std::min(pos + blk, round_down(end, pg));
    }
  } else {
    stop = std::min<std::uint64_t>(pos + block_, end);
  }

  Slot& sl = slots_[s];
  sl.part = at;
  sl.user = p.buf + (pos - p.seg_off);
  sl.piece_off = pos;
  sl.piece_len = std::size_t(stop - pos);
  sl.retries = 0;
  IoDesc& d = sl.desc;
  d.op = r.op;
  d.off = pos;
  d.len = sl.piece_len;
  d.fd = direct ? f.direct_fd() : f.buffered_fd();
  sl.bounce = direct && reinterpret_cast<std::uintptr_t>(sl.user) % f.mem_align() != 0;
  if (sl.bounce) {
    // Note [bounce buffers]: memory that O_DIRECT cannot address (a pointer not aligned to the file
    // system's dio_mem_align) is staged through a page-aligned per-slot buffer. Aligned memory, such as
    // the pinned pool, never takes this copy.
    if (!sl.bounce_buf) {
      std::size_t cap = std::max<std::size_t>(block_, f.page_align());
      cap = std::max<std::size_t>(cap, round_up(block_, 4096));
      if (posix_memalign(reinterpret_cast<void**>(&sl.bounce_buf), 4096, cap) != 0) sl.bounce_buf = nullptr;
      if (!sl.bounce_buf)
        throw OutOfMemory(cat("aio: cannot allocate a ", format_bytes(cap),
                              " bounce buffer for misaligned I/O on ", f.path(), "; pass buffers aligned to ",
                              f.mem_align(), " bytes to avoid bounce buffers"));
    }
    d.buf = sl.bounce_buf;
    if (r.op == Op::write) std::memcpy(sl.bounce_buf, sl.user, sl.piece_len);
    engine_.counters.bounce_pieces.fetch_add(1, std::memory_order_relaxed);
  } else {
    d.buf = sl.user;
  }
  d.buf_index = fixed_ && !sl.bounce ? engine_.fixed.find(d.buf, d.len) : -1;
  p.pos = stop;
  ++p.in_flight;
  return true;
}

void Worker::stage(std::uint32_t s) {
  const Slot& sl = slots_[s];
  queue_->prepare(s, sl.desc);
  EngineCounters& c = engine_.counters;
  c.pieces.fetch_add(1, std::memory_order_relaxed);
  if (sl.desc.fd == sl.part->file->direct_fd()) c.direct_pieces.fetch_add(1, std::memory_order_relaxed);
  if (sl.desc.buf_index >= 0) c.fixed_pieces.fetch_add(1, std::memory_order_relaxed);
  if (single_submit_)
    queue_->submit();
  else
    unsubmitted_ = true;
}

void Worker::handle(const Completion& c) {
  Slot& sl = slots_[c.slot];
  Part& p = *sl.part;
  Request& r = *p.req;
  IoDesc& d = sl.desc;
  const long res = c.result;

  if ((res == -EINTR || res == -EAGAIN) && sl.retries < kMaxRetries) {
    ++sl.retries;
    engine_.counters.retries.fetch_add(1, std::memory_order_relaxed);
    stage(c.slot);
    return;
  }
  const char* verb = r.op == Op::read ? "read" : "write";
  const File& f = *p.file;
  const bool direct = d.fd == f.direct_fd();
  auto context = [&] {
    return cat(" (piece ", sl.piece_off, "+", sl.piece_len, " of a ", p.seg_len, "-byte ", verb,
               " at offset ", p.seg_off, ", ", direct ? "O_DIRECT" : "buffered", ")");
  };
  if (res < 0) {
    int err = int(-res);
    r.fail(cat(verb, " of ", d.len, " bytes at offset ", d.off, " in ", f.path(),
               " failed: ", strata::detail::errno_text(err), hint(err, direct, f), context()));
    p.pos = p.end;
    release(c.slot);
    return;
  }
  const std::size_t got = std::size_t(res);
  if (got < d.len) {
    if (got == 0) {
      r.fail(r.op == Op::read ? cat("read of ", d.len, " bytes at offset ", d.off, " in ", f.path(),
                                    " reached the end of the file (", f.size(), " bytes)", context())
                              : cat("write of ", d.len, " bytes at offset ", d.off, " in ", f.path(),
                                    " wrote nothing and reported no error", context()));
      p.pos = p.end;
      release(c.slot);
      return;
    }
    // A short transfer: go on from where it stopped. A remainder that O_DIRECT cannot take (an
    // unaligned offset, length or address) continues through the buffered descriptor.
    d.buf += got;
    d.off += got;
    d.len -= got;
    if (direct && (d.off % f.offset_align() != 0 || d.len % f.offset_align() != 0 ||
                   reinterpret_cast<std::uintptr_t>(d.buf) % f.mem_align() != 0))
      d.fd = f.buffered_fd();
    sl.retries = 0;
    engine_.counters.short_transfers.fetch_add(1, std::memory_order_relaxed);
    stage(c.slot);
    return;
  }
  if (sl.bounce && r.op == Op::read) std::memcpy(sl.user, sl.bounce_buf, sl.piece_len);
  release(c.slot);
}

void Worker::release(std::uint32_t s) {
  auto it = slots_[s].part;
  --it->in_flight;
  --in_flight_;
  free_slots_.push_back(s);
  if (it->pos >= it->end && it->in_flight == 0) finish_part(it);
}

void Worker::finish_part(std::list<Part>::iterator it) {
  if (it == cursor_) ++cursor_;
  if (it == turn_) ++turn_;
  std::shared_ptr<Request> r = std::move(it->req);
  parts_.erase(it);
  if (r->parts_left.fetch_sub(1, std::memory_order_acq_rel) == 1) finished_.push_back(std::move(r));
}

void Worker::flush_finished() {
  for (auto& r : finished_) engine_.complete(*r);
  finished_.clear();
}

void Worker::fail_everything(const std::string& why) {
  // Only a backend that stops working (an unexpected error from io_uring_enter or io_getevents) gets
  // here. Every request this worker holds fails with the reason, and later ones fail at once.
  std::deque<std::unique_ptr<Part>> incoming;
  {
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = true;
    broken_why_ = cat("the aio worker stopped after a backend failure: ", why,
                      ". Set strata.aio.backend to psync to work around a misbehaving kernel interface.");
    incoming.swap(incoming_);
  }
  STRATA_LOG_ERROR(broken_why_);
  flush_finished();
  for (auto& p : incoming) parts_.push_back(std::move(*p));
  for (Part& p : parts_) {
    p.req->fail(broken_why_);
    if (p.req->parts_left.fetch_sub(1, std::memory_order_acq_rel) == 1) engine_.complete(*p.req);
  }
  parts_.clear();
  cursor_ = turn_ = parts_.end();
  in_flight_ = 0;
}

}  // namespace strata::nvme
