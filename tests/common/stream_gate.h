// A gate that holds streams: hold(s) enqueues a host function that waits at the gate, so s's later work
// cannot start, and an event recorded after it cannot complete, until the test opens it. "Not complete
// yet" is then certain rather than a race against a sleep. Header only; for any Stream (core/device.h).
//
// A held stream takes no copy to or from pageable host memory (a std::vector, a local): on cuda such a
// copy waits for the stream's queued work — the gate — in the thread that has yet to open it, a deadlock.
// Stage such data in pinned memory (strata::PinnedBuffer). The host backend refuses such a copy with a
// strata::Error, at the call, on a held stream and on one that waits for an event recorded behind a gate
// (Note [held streams] in core/stream_hold.h), so CI finds it. So hold streams only through a gate, never
// with a host function of the test's own that waits.
//
// Example:
//   auto s = dev->create_stream("s");
//   test::StreamGate gate;       // after the stream: destroyed (and so opened) before it
//   gate.hold(*s);
//   s->copy_async(d, pinned.data(), n, CopyKind::host_to_device);   // pinned: queued behind the gate
//   s->record(*e);
//   EXPECT_FALSE(e->query());    // the gate is closed
//   gate.open();
//   e->synchronize();
#pragma once

#include <functional>
#include <future>
#include <memory>
#include <utility>

#include "core/device.h"
#include "core/stream_hold.h"

namespace strata::test {

class StreamGate {
 public:
  StreamGate() = default;
  // Opens the gate if the test has not, so that a failing test never leaves a stream held (declare the gate
  // after the streams it holds: it is destroyed first).
  ~StreamGate() { open(); }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;

  // Holds `s` until the gate opens: marks it held (core/stream_hold.h), then enqueues a host function that
  // runs `first`, if given (e.g. to tell the test that the stream has reached the gate), and waits until
  // the gate is open. A gate may hold several streams; open() lets them all go.
  void hold(Stream& s, std::function<void()> first = nullptr) {
    detail::hold_stream(s, hold_);
    s.host_fn([opened = opened_, first = std::move(first)] {
      if (first) first();
      opened.wait();
    });
  }
  void open() {
    if (open_) return;
    open_ = true;
    hold_->release();  // first: whoever sees the gate open sees its streams no longer held
    promise_.set_value();
  }

 private:
  std::promise<void> promise_;
  std::shared_future<void> opened_ = promise_.get_future().share();
  std::shared_ptr<detail::StreamHold> hold_ = std::make_shared<detail::StreamHold>();
  bool open_ = false;
};

}  // namespace strata::test
