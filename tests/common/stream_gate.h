// A gate that holds a stream: a host function waits at it, so the stream's later work cannot start, and
// an event recorded after it cannot complete, until the test opens it. "Not complete yet" is then certain
// rather than a race against a sleep. Header only; for any Stream (core/device.h).
//
// Example:
//   auto s = dev->create_stream("s");
//   test::StreamGate gate;       // after the stream: destroyed (and so opened) before it
//   s->host_fn(gate.wait_fn());
//   s->record(*e);
//   EXPECT_FALSE(e->query());    // the gate is closed
//   gate.open();
//   e->synchronize();
#pragma once

#include <functional>
#include <future>

namespace strata::test {

class StreamGate {
 public:
  StreamGate() = default;
  // Opens the gate if the test has not, so that a failing test never leaves a stream held (declare the gate
  // after the streams it holds: it is destroyed first).
  ~StreamGate() { open(); }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;

  // A host function that returns once the gate is open.
  std::function<void()> wait_fn() const {
    return [opened = opened_] { opened.wait(); };
  }
  void open() {
    if (open_) return;
    open_ = true;
    promise_.set_value();
  }

 private:
  std::promise<void> promise_;
  std::shared_future<void> opened_ = promise_.get_future().share();
  bool open_ = false;
};

}  // namespace strata::test
