// strata/nvme/engine.h: the asynchronous I/O engine (io_uring, libaio or psync behind one interface).
//
// Example:
//   strata::nvme::AioOptions opts;                      // DeepSpeed's aio defaults, backend auto
//   strata::nvme::AioEngine engine(opts);               // logs "aio backend: io_uring (auto ...)"
//   auto f = strata::nvme::File::open(path, strata::nvme::OpenMode::create);
//   engine.register_buffers(pool, pool_bytes);          // pinned pool -> io_uring fixed buffers
//   strata::nvme::IoHandle w = engine.submit_write(f, src, bytes, 0);
//   strata::nvme::IoHandle r = engine.submit_read(f, dst, bytes, 1 << 20);
//   engine.wait(w);                                      // IoError naming file, offset, length, errno
//   strata::nvme::Segment s[] = {{&f, 0, half, dst}, {&g, 0, bytes - half, dst + half}};
//   engine.wait(engine.submit_read(s));                  // one request over two files (two drives)
//   if (engine.poll(r)) ...;                             // non-blocking
//   engine.wait_all();
//
// How a request runs: it is split into aio.intra_op_parallelism contiguous parts, one per worker thread;
// each worker cuts its part into aio.block_size pieces and keeps aio.queue_depth of them in flight on its
// own ring or context (pieces of later requests fill the queue as earlier ones drain). A request over
// several segments (the stripes of a swap extent, one file per drive) splits every segment that way and
// deals all the parts out to the workers in turn; a worker holding several parts of one request takes
// their pieces in turn, so that every drive has pieces in flight at once (Note [parts in turn] in
// worker.cpp). Pieces that come
// back short are resubmitted for the rest, EINTR and EAGAIN are retried, and any other failure fails the
// request; wait() raises only after every piece of the request has come back, so the buffer is free
// again when the exception arrives. O_DIRECT alignment is handled per piece: see nvme/file.h.
//
// Locking: every public method may be called from any thread. Buffers must stay valid, and must not be
// touched by the caller, until the request is waited for (or poll() returned true); a File must stay
// open while requests on it are pending.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/error.h"
#include "nvme/file.h"
#include "nvme/options.h"

namespace strata::nvme {

// Names one submitted request until wait() (or wait_all()) has collected it. 0 is "no request".
struct IoHandle {
  std::uint64_t id = 0;
  explicit operator bool() const { return id != 0; }
  friend bool operator==(IoHandle a, IoHandle b) { return a.id == b.id; }
};

// One piece of a request spanning several files: `bytes` at `offset` of `file`, to or from `buf`.
struct Segment {
  const File* file = nullptr;
  std::uint64_t offset = 0;
  std::size_t bytes = 0;
  void* buf = nullptr;  // (bytes) bytes, caller-owned; read from (never written) by submit_write
};

// What the chosen backend can do (optional parts default to false).
struct EngineCaps {
  Backend backend = Backend::psync;
  bool async = false;          // the kernel runs several pieces per thread at once (io_uring, libaio)
  bool fixed_buffers = false;  // register_buffers() makes io_uring fixed buffers
  bool wakeable = false;       // a worker blocked on completions picks up new requests at once
};

// Counters since construction; all are SUM (monotonic) unless marked.
struct IoStats {
  std::uint64_t requests = 0;         // requests submitted
  std::uint64_t failed_requests = 0;  // requests that completed with an error
  std::uint64_t bytes_read = 0;       // bytes of successfully completed read requests
  std::uint64_t bytes_written = 0;    // bytes of successfully completed write requests
  std::uint64_t pieces = 0;           // pieces handed to the kernel, resubmissions included
  std::uint64_t direct_pieces = 0;    // of which through the O_DIRECT descriptor
  std::uint64_t bounce_pieces = 0;    // of which through an aligned bounce buffer (misaligned memory)
  std::uint64_t fixed_pieces = 0;     // of which from io_uring fixed (registered) buffers
  std::uint64_t retries = 0;          // EINTR / EAGAIN resubmissions
  std::uint64_t short_transfers = 0;  // short reads or writes resubmitted for the rest
  std::uint64_t pending = 0;          // CURRENT: requests submitted and not yet collected
  // Seconds during which at least one request was between submission and completion: the disk's busy
  // time as this engine sees it (bytes over it: the rate achieved while there was work for the drive).
  double busy_seconds = 0;
};

class AioEngine {
 public:
  // Validates `opts` (ConfigError), resolves backend auto (io_uring, then libaio, then psync; logs the
  // choice once per process) and starts opts.intra_op_parallelism worker threads. A backend named
  // explicitly that the kernel refuses raises BackendError with the reason and the setting to change.
  explicit AioEngine(const AioOptions& opts = {});
  // Waits for every pending request (failures are logged, not thrown) and stops the workers.
  ~AioEngine();
  AioEngine(const AioEngine&) = delete;
  AioEngine& operator=(const AioEngine&) = delete;

  Backend backend() const;  // never auto_select
  const AioOptions& options() const;
  EngineCaps caps() const;

  // Reads `bytes` at file offset `offset` into `dst`. Any size, offset and address; see nvme/file.h.
  IoHandle submit_read(const File& file, void* dst, std::size_t bytes, std::uint64_t offset);
  // Writes `bytes` from `src` at file offset `offset`; the file grows as needed.
  IoHandle submit_write(const File& file, const void* src, std::size_t bytes, std::uint64_t offset);
  // One request over several segments (several files, e.g. the stripes of a swap extent): one handle,
  // done when every segment is; wait() raises the first failure, naming its file, offset, length and
  // errno. Segments are checked as the single-file forms check their arguments (strata::Error); empty
  // ones move nothing, and a request whose segments are all empty completes at once. The byte counters
  // count the request's total. Segments must not overlap in memory (reads) or in a file.
  IoHandle submit_read(std::span<const Segment> segments);
  IoHandle submit_write(std::span<const Segment> segments);

  // Blocks until the request is done and collects it; raises IoError if it failed. A handle that is
  // unknown (already collected, or from another engine) raises strata::Error.
  void wait(IoHandle h);
  // True when the request is done (successfully or not); does not collect it. Unknown handle: Error.
  bool poll(IoHandle h) const;
  // Waits for and collects every pending request; raises the first failure (saying how many failed)
  // after all of them are done.
  void wait_all();

  // Blocks until no request on `file` (in any of its segments) is still running; collects nothing (the
  // handles stay valid for wait()). For an owner about to close a file whose requests other code collects.
  void drain(const File& file);

  // Synchronous forms: submit and wait.
  void read(const File& file, void* dst, std::size_t bytes, std::uint64_t offset);
  void write(const File& file, const void* src, std::size_t bytes, std::uint64_t offset);

  // Registers [ptr, ptr+bytes) (e.g. the pinned pool) as io_uring fixed buffers on every worker's ring,
  // so that pieces inside it skip the per-I/O page pinning. Returns false when the backend has no fixed
  // buffers or the kernel refused (RLIMIT_MEMLOCK): I/O on that memory then works as on any other.
  // The region must stay allocated until unregister_buffers(ptr).
  bool register_buffers(void* ptr, std::size_t bytes);
  // Drops a region registered at `ptr`; no request on that memory may be pending.
  void unregister_buffers(void* ptr);

  IoStats stats() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Whether `b` works in this process; on false, `why` (if given) says why and what to change.
bool backend_available(Backend b, std::string* why = nullptr);

// What auto_select resolves to here (io_uring, else libaio, else psync); other values are returned as is.
Backend resolve_backend(Backend requested);

}  // namespace strata::nvme
