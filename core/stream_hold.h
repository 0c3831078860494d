// strata/core/stream_hold.h: a test's mark that it holds a stream closed, so that the host backend refuses
// the copies that would deadlock on cuda (Note [held streams]). Tests use it through tests/common/
// stream_gate.h; the product never marks a stream, and an unmarked stream behaves as before.
//
// Example (what StreamGate::hold and StreamGate::open do):
//   auto hold = std::make_shared<strata::detail::StreamHold>();
//   strata::detail::hold_stream(*s, hold);       // first, then the host function that waits
//   s->host_fn([opened] { opened.wait(); });     // s's later work waits for the test
//   s->copy_async(d, pinned, n, CopyKind::host_to_device);      // queued
//   s->copy_async(d, vec.data(), n, CopyKind::host_to_device);  // host backend: strata::Error
//   hold->release();                             // as the test opens the gate
//
// Note [held streams]: a test holds a stream closed with a host function that waits for the test, so that
// "not run yet" is certain. On cuda, cudaMemcpyAsync with pageable host memory (memory neither
// cudaHostAlloc'd nor registered) is not asynchronous: a host-to-device copy synchronises the stream before
// the copy starts, a device-to-host copy returns only once the copy is done, a host-to-host copy is fully
// synchronous. Such a copy queued on a held stream therefore waits, in the calling thread, for the gate
// that this same thread has yet to open: a deadlock until the test binary's time box. On the host backend
// the copy is only queued, so CI would never see it. So the host backend refuses it:
//   - a stream is held from hold_stream() until the StreamHold is released, and also while it waits
//     (Stream::wait) for an event recorded on a held stream, until that hold is released: on cuda such a
//     stream cannot reach a later copy either;
//   - while held, copy_async whose host side (the source of host_to_device, the destination of
//     device_to_host, both of host_to_host) is pageable — [p, p + bytes) not inside one of this device's
//     allocate_pinned() or allocate() allocations (on the host backend device memory is host memory too) —
//     throws strata::Error naming the stream, at the call;
//   - cost: copy_async and record() read one atomic, wait() one pointer it reads anyway; the allocation
//     lookup (a map search under the device's mutex) runs only on a held stream.
// The cuda backend does nothing here (hold_stream is a no-op for its streams): there the copy would really
// wait, and the host backend's check in CI is what keeps such a copy out of the tests. Limits: a stream
// that waits for a held one through a host function (tiering's Move::enqueue_wait) rather than an event
// is not seen as held.
#pragma once

#include <atomic>
#include <memory>

#include "core/device.h"

namespace strata::detail {

// One hold, shared by the gate that releases it and the streams it holds. Thread-safe.
class StreamHold {
 public:
  void release() { released_.store(true, std::memory_order_release); }
  bool released() const { return released_.load(std::memory_order_acquire); }

 private:
  std::atomic<bool> released_{false};
};

// Marks `s` held until `hold` is released (Note [held streams]). Host backend: from now on, and while the
// hold lasts, a copy_async on `s` with a pageable host side throws strata::Error. Other backends: nothing.
// A stream may carry several holds; it is held while any of them is unreleased.
void hold_stream(Stream& s, std::shared_ptr<const StreamHold> hold);

}  // namespace strata::detail
