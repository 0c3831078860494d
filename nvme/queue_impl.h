// strata/nvme/queue_impl.h: the backend interface under AioEngine. Not part of the public API.
//
// Each engine worker thread owns one Queue: an io_uring ring, a libaio context, or (psync) a list of
// pieces it performs itself with pread/pwrite. The worker stages pieces by slot, submits them, and reaps
// completions; every piece it staged comes back exactly once as a Completion, failures included (as
// -errno), so the worker never has to ask the backend what became of a piece.
//
// Locking: prepare/submit/reap are called only by the owning worker. wake() and set_buffers() may be
// called from any thread.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace strata::nvme::detail {

enum class Op : std::uint8_t { read, write };

// One contiguous transfer: `len` bytes between `buf` and file offset `off` of descriptor `fd`.
struct IoDesc {
  Op op = Op::read;
  int fd = -1;
  char* buf = nullptr;
  std::size_t len = 0;
  std::uint64_t off = 0;
  int buf_index = -1;  // io_uring fixed-buffer slot holding [buf, buf+len), or -1
};

struct Completion {
  std::uint32_t slot = 0;
  long result = 0;  // bytes moved, or -errno
};

// What a backend can do; optional parts default to "no".
struct QueueCaps {
  bool async = false;          // the kernel runs several pieces at once (psync: no)
  bool fixed_buffers = false;  // set_buffers() registers memory and IoDesc::buf_index is honoured
  bool wakeable = false;       // wake() interrupts a blocking reap()
};

class Queue {
 public:
  virtual ~Queue() = default;
  virtual QueueCaps caps() const = 0;
  // Stages `d` under `slot` (< the depth the queue was made for); the kernel sees it after submit().
  virtual void prepare(std::uint32_t slot, const IoDesc& d) = 0;
  // Hands every staged piece to the kernel. Transient refusals (EAGAIN, EINTR) keep the pieces staged
  // for the next submit or reap; a piece the kernel rejects outright completes with its -errno.
  virtual void submit() = 0;
  // Blocks until at least `min` completions are available or wake() is called, writes up to `cap` of
  // them to `out` and returns how many it wrote (possibly 0 after a wake).
  virtual std::size_t reap(std::size_t min, Completion* out, std::size_t cap) = 0;
  // Makes a reap() that is blocked (or the next one) return; no-op where caps().wakeable is false.
  virtual void wake() {}
  // Points fixed-buffer slots [first, first+n) at `iov` (iov_len 0 clears a slot). False when the
  // kernel refused; the engine then uses plain reads and writes for that memory.
  virtual bool set_buffers(unsigned /*first*/, const iovec* /*iov*/, unsigned /*n*/) { return false; }
};

// Fixed-buffer slots each io_uring ring reserves (each slot covers at most 1 GiB of memory).
constexpr unsigned kFixedBufferSlots = 1024;
constexpr std::size_t kFixedBufferSlotBytes = std::size_t(1) << 30;

// Factories raise BackendError with the kernel's reason when the interface is unavailable.
std::unique_ptr<Queue> make_uring_queue(unsigned depth, bool sqpoll);
std::unique_ptr<Queue> make_libaio_queue(unsigned depth);
std::unique_ptr<Queue> make_psync_queue(unsigned depth);

// Test seam: while set, every new engine worker takes its queue from `factory` instead of its backend
// (tests inject EINTR, EAGAIN and short transfers this way). Returns the previous one; nullptr resets.
using QueueFactory = std::unique_ptr<Queue> (*)(unsigned depth);
QueueFactory exchange_queue_factory(QueueFactory factory);

// "" when the interface works here, else why not (errno text and the likely cause).
std::string probe_uring();
std::string probe_libaio();

}  // namespace strata::nvme::detail
