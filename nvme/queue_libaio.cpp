// libaio backend (what DeepSpeed's aio uses): one kernel AIO context per engine worker.
#include <libaio.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <atomic>

#include <cerrno>
#include <vector>

#include "core/error.h"
#include "nvme/queue_impl.h"

namespace strata::nvme::detail {
namespace {

using strata::detail::cat;
using strata::detail::errno_text;

std::string aio_reason(int err) {
  std::string why = errno_text(err);
  if (err == EAGAIN)
    why +=
        "; the system-wide limit fs.aio-max-nr is exhausted (raise it with sysctl, or lower "
        "aio.queue_depth / aio.intra_op_parallelism)";
  else if (err == ENOSYS || err == EPERM)
    why += "; kernel AIO is not available to this process; set strata.aio.backend to io_uring or psync";
  return why;
}

class LibaioQueue final : public Queue {
 public:
  explicit LibaioQueue(unsigned depth) : iocbs_(depth), events_(depth + 1) {
    int r = io_setup(int(depth + 1), &ctx_);
    if (r < 0) throw BackendError(cat("libaio: io_setup(", depth + 1, ") failed: ", aio_reason(-r)));
    staged_.reserve(depth);
    // The wake-up is an IOCB_CMD_POLL on an eventfd (Linux 4.18+). Without it a worker blocked in
    // io_getevents notices new work only at its next completion, which is still correct.
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd_ >= 0) wakeable_ = arm_wake();
  }

  ~LibaioQueue() override {
    io_destroy(ctx_);  // waits for (or cancels) everything in flight, the wake-up poll included
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }

  QueueCaps caps() const override { return {.async = true, .fixed_buffers = false, .wakeable = wakeable_}; }

  void prepare(std::uint32_t slot, const IoDesc& d) override {
    iocb* cb = &iocbs_[slot];
    if (d.op == Op::read)
      io_prep_pread(cb, d.fd, d.buf, d.len, static_cast<long long>(d.off));
    else
      io_prep_pwrite(cb, d.fd, d.buf, d.len, static_cast<long long>(d.off));
    cb->data = reinterpret_cast<void*>(std::uintptr_t(slot));
    staged_.push_back(cb);
  }

  void submit() override {
    std::size_t done = 0;
    while (done < staged_.size()) {
      int r = io_submit(ctx_, long(staged_.size() - done), staged_.data() + done);
      if (r > 0) {
        done += std::size_t(r);
        in_kernel_ += std::size_t(r);
      } else if (r == -EINTR) {
        continue;
      } else if (r == -EAGAIN && in_kernel_ > 0) {
        break;  // out of request slots: retried after the next completions are reaped
      } else {
        // The first remaining iocb was rejected (e.g. EINVAL for a misaligned O_DIRECT transfer, or
        // EAGAIN with nothing in flight): it completes with that error and the rest go on.
        iocb* cb = staged_[done++];
        failed_.push_back(
            {std::uint32_t(reinterpret_cast<std::uintptr_t>(cb->data)), long(r == 0 ? -EIO : r)});
      }
    }
    staged_.erase(staged_.begin(), staged_.begin() + long(done));
  }

  std::size_t reap(std::size_t min, Completion* out, std::size_t cap) override {
    std::size_t n = 0;
    while (!failed_.empty() && n < cap) {
      out[n++] = failed_.back();
      failed_.pop_back();
    }
    if (n >= min || n == cap) return n;
    if (!staged_.empty()) submit();
    if (in_kernel_ == 0) {  // everything left was refused by submit(): report it instead of blocking
      while (!failed_.empty() && n < cap) {
        out[n++] = failed_.back();
        failed_.pop_back();
      }
      return n;
    }
    long want = long(std::min(min - n, in_kernel_ + (wakeable_ ? 1 : 0)));
    for (;;) {
      int r = io_getevents(ctx_, want, long(events_.size()), events_.data(), nullptr);
      if (r == -EINTR) continue;
      if (r < 0) throw BackendError(cat("libaio: io_getevents failed: ", errno_text(-r)));
      for (int i = 0; i < r; ++i) {
        const io_event& ev = events_[std::size_t(i)];
        if (ev.obj == &wake_iocb_) {
          std::uint64_t v;
          while (::read(wake_fd_, &v, sizeof v) < 0 && errno == EINTR) {
          }
          wakeable_ = arm_wake();
          continue;
        }
        --in_kernel_;
        out[n++] = {std::uint32_t(reinterpret_cast<std::uintptr_t>(ev.data)), long(ev.res)};
      }
      return n;
    }
  }

  void wake() override {
    if (!wakeable_) return;
    std::uint64_t one = 1;
    while (::write(wake_fd_, &one, sizeof one) < 0 && errno == EINTR) {
    }
  }

 private:
  bool arm_wake() {
    io_prep_poll(&wake_iocb_, wake_fd_, POLLIN);
    iocb* p = &wake_iocb_;
    for (;;) {
      int r = io_submit(ctx_, 1, &p);
      if (r == 1) return true;
      if (r != -EINTR) return false;
    }
  }

  io_context_t ctx_ = nullptr;
  std::vector<iocb> iocbs_;    // by slot
  std::vector<iocb*> staged_;  // prepared, not yet accepted by io_submit
  std::vector<Completion> failed_;
  std::vector<io_event> events_;
  std::size_t in_kernel_ = 0;  // accepted by io_submit, not yet reaped (wake-up poll excluded)
  int wake_fd_ = -1;
  iocb wake_iocb_{};
  // Whether the wake-up poll is armed: set by the worker thread (reap), read by the submitting thread
  // (wake), hence atomic.
  std::atomic<bool> wakeable_{false};
};

}  // namespace

std::unique_ptr<Queue> make_libaio_queue(unsigned depth) {
  return std::make_unique<LibaioQueue>(depth);
}

std::string probe_libaio() {
  io_context_t ctx = nullptr;
  int r = io_setup(1, &ctx);
  if (r < 0) return aio_reason(-r);
  io_destroy(ctx);
  return "";
}

}  // namespace strata::nvme::detail
