// io_uring backend: one ring per engine worker, sized queue_depth + 1 (the extra entry is the wake-up read).
#include <liburing.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "nvme/queue_impl.h"

namespace strata::nvme::detail {
namespace {

using strata::detail::cat;
using strata::detail::errno_text;

constexpr std::uint64_t kWakeTag = ~std::uint64_t(0);

std::string uring_reason(int err) {
  std::string why = errno_text(err);
  if (err == EPERM || err == EACCES)
    why +=
        "; io_uring is disabled for this process (sysctl kernel.io_uring_disabled, a seccomp filter or a "
        "container runtime); set strata.aio.backend to libaio or psync, or allow io_uring";
  else if (err == ENOSYS)
    why += "; this kernel has no io_uring (Linux 5.1+ needed); set strata.aio.backend to libaio or psync";
  else if (err == ENOMEM)
    why += "; the ring could not be allocated (RLIMIT_MEMLOCK on kernels before 5.12)";
  return why;
}

int init_ring(unsigned entries, bool sqpoll, io_uring* ring) {
  io_uring_params p{};
  if (sqpoll) {
    p.flags |= IORING_SETUP_SQPOLL;
    p.sq_thread_idle = 50;  // ms the poller spins before it sleeps
  }
  // COOP_TASKRUN (Linux 5.19+) lets completions run when the worker next enters the kernel instead of
  // interrupting it; older kernels reject the flag and get the default.
  io_uring_params q = p;
  q.flags |= IORING_SETUP_COOP_TASKRUN;
  int r = io_uring_queue_init_params(entries, ring, &q);
  if (r == -EINVAL) r = io_uring_queue_init_params(entries, ring, &p);
  return r;
}

class UringQueue final : public Queue {
 public:
  UringQueue(unsigned depth, bool sqpoll) {
    int r = init_ring(depth + 1, sqpoll, &ring_);
    if (r < 0)
      throw BackendError(cat("io_uring: cannot set up a ring of ", depth + 1, " entries",
                             sqpoll ? " with SQPOLL" : "", ": ", uring_reason(-r)));
    fixed_ok_ = io_uring_register_buffers_sparse(&ring_, kFixedBufferSlots) == 0;
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
    if (wake_fd_ < 0) {
      int err = errno;
      io_uring_queue_exit(&ring_);
      throw BackendError(cat("io_uring: eventfd for the worker wake-up failed: ", errno_text(err)));
    }
    arm_wake();
    submit();
  }

  ~UringQueue() override {
    io_uring_queue_exit(&ring_);  // cancels the pending wake-up read
    ::close(wake_fd_);
  }

  QueueCaps caps() const override { return {.async = true, .fixed_buffers = fixed_ok_, .wakeable = true}; }

  void prepare(std::uint32_t slot, const IoDesc& d) override {
    io_uring_sqe* sqe = get_sqe();
    if (d.buf_index >= 0) {
      if (d.op == Op::read)
        io_uring_prep_read_fixed(sqe, d.fd, d.buf, unsigned(d.len), d.off, d.buf_index);
      else
        io_uring_prep_write_fixed(sqe, d.fd, d.buf, unsigned(d.len), d.off, d.buf_index);
    } else {
      if (d.op == Op::read)
        io_uring_prep_read(sqe, d.fd, d.buf, unsigned(d.len), d.off);
      else
        io_uring_prep_write(sqe, d.fd, d.buf, unsigned(d.len), d.off);
    }
    io_uring_sqe_set_data64(sqe, slot);
  }

  void submit() override {
    for (;;) {
      int r = io_uring_submit(&ring_);
      if (r >= 0 || (r != -EINTR && r != -EAGAIN && r != -EBUSY)) {
        if (r < 0) throw BackendError(cat("io_uring_submit failed: ", errno_text(-r)));
        return;
      }
      if (r != -EINTR) return;  // EAGAIN/EBUSY: the entries stay in the ring; the next reap submits them
    }
  }

  std::size_t reap(std::size_t min, Completion* out, std::size_t cap) override {
    std::size_t n = 0;
    bool woke = false;
    for (;;) {
      io_uring_cqe* cqe;
      unsigned head, seen = 0;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        if (n == cap) break;
        ++seen;
        std::uint64_t tag = io_uring_cqe_get_data64(cqe);
        if (tag == kWakeTag) {
          woke = true;
          arm_wake();
        } else {
          out[n++] = {std::uint32_t(tag), long(cqe->res)};
        }
      }
      io_uring_cq_advance(&ring_, seen);
      if (n >= min || n == cap || woke) return n;
      int r = io_uring_submit_and_wait(&ring_, unsigned(min - n));
      if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY && r != -ETIME)
        throw BackendError(cat("io_uring_submit_and_wait failed: ", errno_text(-r)));
    }
  }

  void wake() override {
    std::uint64_t one = 1;
    while (::write(wake_fd_, &one, sizeof one) < 0 && errno == EINTR) {
    }
  }

  bool set_buffers(unsigned first, const iovec* iov, unsigned n) override {
    if (!fixed_ok_) return false;
    int r = io_uring_register_buffers_update_tag(&ring_, first, iov, nullptr, n);
    if (r < 0) {
      STRATA_WARN_ONCE("io_uring: registering ", n, " buffer slot(s) as fixed buffers failed (",
                       errno_text(-r),
                       "); those buffers use plain reads and writes. Raise RLIMIT_MEMLOCK (ulimit -l) to "
                       "let the kernel pin them.");
      return false;
    }
    return true;
  }

 private:
  io_uring_sqe* get_sqe() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    while (!sqe) {  // only when earlier submits were refused with EAGAIN: push them out first
      io_uring_submit(&ring_);
      sqe = io_uring_get_sqe(&ring_);
    }
    return sqe;
  }

  void arm_wake() {
    io_uring_sqe* sqe = get_sqe();
    io_uring_prep_read(sqe, wake_fd_, &wake_value_, sizeof wake_value_, 0);
    io_uring_sqe_set_data64(sqe, kWakeTag);
  }

  io_uring ring_{};
  int wake_fd_ = -1;
  std::uint64_t wake_value_ = 0;
  bool fixed_ok_ = false;
};

}  // namespace

std::unique_ptr<Queue> make_uring_queue(unsigned depth, bool sqpoll) {
  return std::make_unique<UringQueue>(depth, sqpoll);
}

namespace {

// Submits the one entry prepared on `ring` and waits for it: the completion's result (bytes, or -errno),
// the submission's error, or -ETIME when nothing completed.
int run_one(io_uring& ring) {
  int r = io_uring_submit_and_wait(&ring, 1);
  if (r < 0) return r;
  io_uring_cqe* cqe = nullptr;
  if (io_uring_peek_cqe(&ring, &cqe) != 0 || !cqe) return -ETIME;
  r = cqe->res;
  io_uring_cqe_seen(&ring, cqe);
  return r;
}

// What a probe operation that did not move `want` bytes says.
std::string op_failed(const char* op, int r, int want) {
  if (r == -ETIME) return cat("a ", op, " submitted to a new ring never completed");
  if (r < 0) return cat("a ", op, " through io_uring failed: ", uring_reason(-r));
  return cat("a ", op, " through io_uring moved ", r, " of ", want, " bytes");
}

}  // namespace

// Note [io_uring probe]: a ring can be created yet every operation refused (some sandboxes filter
// io_uring_enter), or a NOP complete while the data operations are refused (gVisor implements a subset of
// io_uring's operations). So the probe makes a NOP round trip, then writes and reads back 4 KiB of a
// memory file with the operations the queue submits (read and write; the fixed-buffer variants fall back
// to them by themselves when registration is refused).
std::string probe_uring() {
  io_uring ring{};
  int r = io_uring_queue_init(4, &ring, 0);
  if (r < 0) return uring_reason(-r);
  std::string why;
  io_uring_prep_nop(io_uring_get_sqe(&ring));
  r = run_one(ring);
  if (r < 0) why = op_failed("NOP", r, 0);
  const int fd = why.empty() ? ::memfd_create("strata-uring-probe", MFD_CLOEXEC) : -1;
  if (fd >= 0) {  // without a memory file (an old kernel) the NOP is all the probe can check
    constexpr int kBytes = 4096;
    std::vector<unsigned char> out(kBytes), in(kBytes);
    for (int i = 0; i < kBytes; ++i) out[std::size_t(i)] = static_cast<unsigned char>(i * 7 + 1);
    io_uring_prep_write(io_uring_get_sqe(&ring), fd, out.data(), kBytes, 0);
    if (r = run_one(ring); r != kBytes) {
      why = op_failed("write", r, kBytes);
    } else {
      io_uring_prep_read(io_uring_get_sqe(&ring), fd, in.data(), kBytes, 0);
      if (r = run_one(ring); r != kBytes)
        why = op_failed("read", r, kBytes);
      else if (in != out)
        why = "a read through io_uring returned other bytes than were written";
    }
    ::close(fd);
  }
  io_uring_queue_exit(&ring);
  return why;
}

}  // namespace strata::nvme::detail
