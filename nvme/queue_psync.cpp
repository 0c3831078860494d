// psync backend: the worker performs each piece itself with pread/pwrite. It is the oracle the other
// backends are tested against and the fallback where neither io_uring nor libaio is permitted, so it is
// kept as plain as possible: one system call per piece, in the order the pieces were staged.
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "nvme/queue_impl.h"

namespace strata::nvme::detail {
namespace {

class PsyncQueue final : public Queue {
 public:
  explicit PsyncQueue(unsigned depth) { staged_.reserve(depth); }

  QueueCaps caps() const override { return {}; }

  void prepare(std::uint32_t slot, const IoDesc& d) override { staged_.push_back({slot, d}); }

  void submit() override {}

  std::size_t reap(std::size_t /*min*/, Completion* out, std::size_t cap) override {
    std::size_t n = 0;
    for (; n < staged_.size() && n < cap; ++n) {
      const IoDesc& d = staged_[n].desc;
      ssize_t r = d.op == Op::read ? ::pread(d.fd, d.buf, d.len, off_t(d.off))
                                   : ::pwrite(d.fd, d.buf, d.len, off_t(d.off));
      out[n] = {staged_[n].slot, r < 0 ? -long(errno) : long(r)};
    }
    staged_.erase(staged_.begin(), staged_.begin() + long(n));
    return n;
  }

 private:
  struct Staged {
    std::uint32_t slot;
    IoDesc desc;
  };
  std::vector<Staged> staged_;
};

}  // namespace

std::unique_ptr<Queue> make_psync_queue(unsigned depth) {
  return std::make_unique<PsyncQueue>(depth);
}

}  // namespace strata::nvme::detail
