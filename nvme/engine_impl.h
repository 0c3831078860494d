// strata/nvme/engine_impl.h: AioEngine's requests, parts and worker threads. Not part of the public API.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "nvme/engine.h"
#include "nvme/queue_impl.h"

namespace strata::nvme {

// One submitted read or write, over one or more segments. Shared by the engine's table (until
// collected) and by its parts.
struct Request {
  std::uint64_t id = 0;
  detail::Op op = detail::Op::read;
  std::vector<const File*> files;  // every segment's file, for drain()
  std::size_t len = 0;             // bytes over all segments
  std::atomic<std::uint32_t> parts_left{0};
  std::atomic<std::uint32_t> done{0};  // 0 while pending; 1 once every part finished (waitable)
  std::atomic<bool> failed{false};
  std::mutex mu;      // guards error
  std::string error;  // the first failure, set before failed becomes true

  void fail(const std::string& msg);
};

// The slice [pos, end) of one segment of a request that one worker performs.
struct Part {
  std::shared_ptr<Request> req;
  // The segment this slice belongs to: file offset seg_off of `file` is buf[0]; seg_len for messages.
  const File* file = nullptr;
  char* buf = nullptr;  // (seg_len) bytes, caller-owned
  std::uint64_t seg_off = 0;
  std::size_t seg_len = 0;
  std::uint64_t pos = 0;  // next file offset to issue
  std::uint64_t end = 0;
  std::uint32_t in_flight = 0;  // pieces issued and not yet completed
};

// Registered io_uring fixed-buffer regions, shared by all workers.
struct FixedRegions {
  struct Region {
    char* base;
    std::size_t bytes;
    unsigned first_slot;
    unsigned slots;
  };
  mutable std::shared_mutex mu;
  std::vector<Region> regions;
  std::vector<bool> used = std::vector<bool>(detail::kFixedBufferSlots, false);

  // The slot holding [p, p+len) entirely, or -1.
  int find(const char* p, std::size_t len) const;
};

// Counters behind IoStats.
struct EngineCounters {
  std::atomic<std::uint64_t> requests{0}, failed_requests{0}, bytes_read{0}, bytes_written{0}, pieces{0},
      direct_pieces{0}, bounce_pieces{0}, fixed_pieces{0}, retries{0}, short_transfers{0};
};

// One worker thread with its own Queue. Locking: enqueue() and stop() take mu_; everything else runs on
// the worker thread only and takes no lock except to splice new parts in.
class Worker {
 public:
  Worker(AioEngine::Impl& engine, std::unique_ptr<detail::Queue> queue, const AioOptions& opts);
  ~Worker();  // stops and joins
  // Hands the worker its parts of one request, all at once (Note [parts in turn] in worker.cpp).
  void enqueue(std::vector<std::unique_ptr<Part>> parts);
  detail::Queue& queue() { return *queue_; }

 private:
  struct Slot {
    std::list<Part>::iterator part;
    detail::IoDesc desc;          // what the kernel was (last) given, advanced on short transfers
    char* user = nullptr;         // where this piece's bytes live in the caller's buffer
    std::uint64_t piece_off = 0;  // the piece as first cut, for messages and copy-out
    std::size_t piece_len = 0;
    bool bounce = false;  // desc.buf is bounce_buf, copied to/from user
    int retries = 0;
    char* bounce_buf = nullptr;  // (block_size) bytes, page-aligned, allocated on first use
  };

  void run();
  void loop();
  void take_incoming();
  std::list<Part>::iterator next_turn();
  bool cut_piece(std::uint32_t slot);
  void stage(std::uint32_t slot);
  void handle(const detail::Completion& c);
  void release(std::uint32_t slot);
  void finish_part(std::list<Part>::iterator it);
  void flush_finished();
  void fail_everything(const std::string& why);

  AioEngine::Impl& engine_;
  std::unique_ptr<detail::Queue> queue_;
  const std::size_t block_;
  const std::uint32_t depth_;
  const bool single_submit_, overlap_;
  bool fixed_ = false;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Part>> incoming_;                             // guarded by mu_
  bool idle_ = false, stop_ = false, wake_sent_ = false, broken_ = false;  // guarded by mu_
  bool wants_work_ = false;  // guarded by mu_: blocked on completions with a free slot
  std::string broken_why_;   // guarded by mu_

  // Worker-thread state.
  std::list<Part> parts_;             // in arrival order; finished parts are erased
  std::list<Part>::iterator cursor_;  // first part with pieces left to issue (or end)
  std::list<Part>::iterator turn_;    // where the search for the next piece starts (Note [parts in turn])
  std::vector<Slot> slots_;
  std::vector<std::uint32_t> free_slots_;
  std::uint32_t in_flight_ = 0;
  bool unsubmitted_ = false;                        // pieces staged since the last submit()
  std::vector<std::shared_ptr<Request>> finished_;  // completed, callers not yet woken

  std::thread thread_;
};

struct AioEngine::Impl {
  AioOptions opts;
  Backend backend = Backend::psync;
  EngineCaps caps;
  EngineCounters counters;
  FixedRegions fixed;
  std::vector<std::unique_ptr<Worker>> workers;

  std::atomic<std::uint64_t> next_id{1};
  std::atomic<std::uint32_t> next_worker{0};
  mutable std::mutex mu;  // guards pending
  std::unordered_map<std::uint64_t, std::shared_ptr<Request>> pending;
  // Busy time (IoStats::busy_seconds): requests between submission and completion, since when there
  // have been any, and the closed busy intervals' sum.
  mutable std::mutex busy_mu;
  std::uint64_t in_flight = 0;
  std::chrono::steady_clock::time_point busy_since;
  std::chrono::steady_clock::duration busy{};
  void started();
  void finished();

  IoHandle submit(detail::Op op, std::span<const Segment> segments);
  std::shared_ptr<Request> find(IoHandle h, const char* what) const;
  void collect(std::uint64_t id);
  // Called by the worker that finished a request's last part.
  void complete(Request& r);
};

}  // namespace strata::nvme
