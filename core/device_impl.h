// Internal to core: backend factories and helpers shared by the two device backends.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

#include "core/device.h"

namespace strata::detail {

std::unique_ptr<Device> make_host_device(const DeviceOptions& opts);
#ifdef STRATA_WITH_CUDA
std::unique_ptr<Device> make_cuda_device(const DeviceOptions& opts);
int cuda_count(std::string* why);
#endif

// The OutOfMemory message every backend raises for an over-cap allocation (STYLE.md item 7).
std::string device_oom_message(const DeviceCaps& caps, std::size_t in_use, std::size_t requested,
                               const char* what, const std::string& backend_detail);

std::size_t physical_ram_bytes();

// One completion, set once (by the stream that recorded it, or a host function's worker); any number of
// threads may wait for it.
struct Completion {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  void set() {
    {
      std::lock_guard<std::mutex> lk(m);
      done = true;
    }
    cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lk(m);
    cv.wait(lk, [&] { return done; });
  }
  bool ready() {
    std::lock_guard<std::mutex> lk(m);
    return done;
  }
};

}  // namespace strata::detail
