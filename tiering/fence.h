// strata/tiering/fence.h: "this memory is still being read or written" — what a freed block waits on
// before any pool hands it out again.
//
// Example:
//   auto ev = dev.create_event();
//   d2h.copy_async(host, block, n, CopyKind::device_to_host);
//   d2h.record(*ev);
//   allocator.free(block, std::make_shared<EventFence>(std::move(ev)));   // reusable once the copy is done
//
// A fence is signalled by the device (an Event) or by the worker that finishes a move (a Flag), never by
// code that needs a pool's or the tier manager's lock, so waiting on one while holding such a lock cannot
// deadlock (see Note [fenced reuse] in tiering/caching_allocator.cpp).
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>

#include "core/device.h"

namespace strata::tiering {

class Fence {
 public:
  virtual ~Fence() = default;
  virtual bool ready() const = 0;  // never blocks
  virtual void wait() const = 0;   // blocks the calling thread until ready()
};

// Completes when a recorded device Event does.
class EventFence final : public Fence {
 public:
  explicit EventFence(std::unique_ptr<Event> e) : e_(std::move(e)) {}
  bool ready() const override { return e_->query(); }
  void wait() const override { e_->synchronize(); }

 private:
  std::unique_ptr<Event> e_;
};

// Completes when someone calls signal(); thread-safe, one-shot.
class Flag final : public Fence {
 public:
  void signal() {
    {
      std::lock_guard<std::mutex> lk(m_);
      set_ = true;
    }
    cv_.notify_all();
  }
  bool ready() const override {
    std::lock_guard<std::mutex> lk(m_);
    return set_;
  }
  void wait() const override {
    std::unique_lock<std::mutex> lk(m_);
    cv_.wait(lk, [&] { return set_; });
  }

 private:
  mutable std::mutex m_;
  mutable std::condition_variable cv_;
  bool set_ = false;
};

}  // namespace strata::tiering
