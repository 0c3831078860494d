// strata/core/device.h: the device runtime — Device, Stream, Event — behind one interface, two backends.
//
// Example:
//   auto dev = strata::open_device({.backend = "auto", .memory_cap = 1ull << 30});   // act as a 1 GiB GPU
//   void* d = dev->allocate(bytes);                          // OutOfMemory past the cap
//   strata::PinnedBuffer h(*dev, bytes);                     // page-locked host staging memory
//   auto h2d = dev->create_stream("h2d");
//   auto done = dev->create_event();
//   h2d->copy_async(d, h.data(), bytes, strata::CopyKind::host_to_device);
//   h2d->record(*done);
//   ... compute on the caller thread while the copy runs ...
//   compute->wait(*done);   // or done->synchronize() from any thread
//
// Backends (capabilities in DeviceCaps, STYLE.md item 5):
//   cuda — a real GPU: cudaMalloc, cudaMemcpyAsync on CUDA streams, CUDA events, cudaHostAlloc.
//   host — an accelerator made of host memory so the whole runtime runs without a GPU: allocations count
//          against a capacity, every stream is an in-order worker thread (a copy enqueued on a stream
//          really runs while the caller computes), events complete in stream order and can be waited on
//          from any thread or stream.
//
// Semantics shared by both (CUDA's): an Event that was never recorded counts as complete; wait(e) and
// synchronize() refer to the most recent record(e) made before the call; work on one stream runs in
// enqueue order; work on different streams is unordered unless an event joins them.
//
// Locking contract: Device and Event methods are thread-safe. A Stream may be used from several threads,
// but the relative order of two enqueues made concurrently from different threads is unspecified.
//
// Note [thread device]: CUDA keeps a current device per thread, device 0 until the thread chooses one,
// and since CUDA 12 choosing a device (or calling almost any runtime API on a thread that chose none)
// creates that device's primary context, hundreds of MiB of its memory. `strata launch` leaves every GPU
// visible to every rank (comm/devices.h, Note [STRATA_LOCAL_DEVICES]), so a thread that calls CUDA
// without choosing runs on, and takes memory of, GPU 0 — another rank's GPU. The rule: a rank uses one
// device, and every thread that calls into it (the Device, its streams and events, or a CUDA library for
// it) calls Device::bind_thread() first.
//   - open_device() binds the thread that opens the device; each stream's worker binds itself (so
//     Stream::host_fn functions run bound).
//   - Threads the runtime starts bind at their start: the tier manager's movers, the memprof trace
//     writer, the engine's optimizer worker. NVMe workers never call the device.
//   - The cuda backend also makes its device current inside every entry point and, leaving, gives a thread
//     back only a context it already had (CudaDeviceGuard, core/cuda_check.h, Note [device guard]), so a
//     missed bind costs no context on another GPU there; CUDA calls outside the Device rely on the bind.
//   - The host backend emulates the per-thread current device so that a missed bind is found without a
//     GPU: each thread has a current ordinal (0 until bound, as in CUDA), and with
//     DeviceOptions::check_thread_device every entry point called from a thread whose current ordinal is
//     not the device's throws strata::Error naming the call, the thread and both ordinals. Checked: every
//     Device method but caps() and memory_stats(), every Stream method that enqueues or waits, and
//     Event::query / synchronize (what calls CUDA on the cuda backend); not destructors. Off (the
//     default), the entry points cost one untaken branch.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace strata {

enum class BackendKind { host, cuda };
const char* to_string(BackendKind k);

enum class CopyKind { host_to_device, device_to_host, device_to_device, host_to_host };

struct DeviceCaps {
  BackendKind backend = BackendKind::host;
  std::string name;  // "host", "NVIDIA H100 80GB HBM3"
  int ordinal = 0;
  std::size_t physical_bytes = 0;  // what the hardware has (host: physical RAM)
  std::size_t capacity = 0;        // the cap in force: min(physical, configured cap)
  // Device memory kept out of `capacity` for what allocates beside the Device (cuda: the CUDA libraries'
  // later allocations, Note [cuda device capacity]; the host backend: 0).
  std::size_t reserved = 0;
  int cc_major = 0, cc_minor = 0;  // compute capability (cuda only)
  int multiprocessors = 0;         // SMs (cuda only)
  int numa_node = -1;              // NUMA node nearest the device, -1 unknown
  bool host_addressable = false;   // device pointers can be dereferenced on the CPU (host backend)
};

// Tracks completion of the work a stream had enqueued when record() was called.
class Event {
 public:
  virtual ~Event() = default;
  virtual bool query() const = 0;        // true once complete (or never recorded)
  virtual void synchronize() const = 0;  // blocks the calling thread until complete
};

class Stream {
 public:
  virtual ~Stream() = default;
  virtual void copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind) = 0;
  virtual void memset_async(void* dst, int value, std::size_t bytes) = 0;
  // Runs fn on a host thread after all earlier work on this stream and before any later work. fn must not
  // enqueue work on this stream. An exception from fn is reported by the next synchronize().
  virtual void host_fn(std::function<void()> fn) = 0;
  virtual void record(Event& e) = 0;
  virtual void wait(const Event& e) = 0;  // later work on this stream starts after e completes
  virtual void synchronize() = 0;         // blocks until all enqueued work completed
  virtual void* native_handle() = 0;      // cudaStream_t on cuda, nullptr on host
  // Seconds this stream has spent running work (copies, memsets, host functions) since it was created,
  // the work running now included, and not waiting for events of other streams. The host backend
  // measures it; cuda returns 0 (not measured), so a caller's "idle while blocked" figure stays the
  // blocked time there.
  virtual double busy_seconds() const { return 0.0; }
  const std::string& name() const { return name_; }

 protected:
  explicit Stream(std::string name) : name_(std::move(name)) {}

 private:
  std::string name_;
};

struct DeviceMemoryStats {
  std::size_t in_use = 0;         // bytes currently allocated through allocate()
  std::size_t peak_in_use = 0;    // high-water mark of in_use
  std::size_t allocations = 0;    // live allocation count
  std::size_t pinned_in_use = 0;  // bytes of pinned host memory allocated through this device
};

class Device {
 public:
  virtual ~Device() = default;
  virtual const DeviceCaps& caps() const = 0;

  // Makes this device the calling thread's current device (Note [thread device]): cuda: cudaSetDevice
  // (checked); host: the thread's emulated current ordinal. Cheap when it already is; call it first in
  // every thread that uses the device.
  virtual void bind_thread() const = 0;

  // Reads the device's free memory again and sets caps().capacity (and reserved) from it, as at open:
  // call it once what takes device memory beside the Device (NCCL communicators, the cuBLASLt and cuDNN
  // handles) exists, before planning with the capacity (cuda: Note [cuda device capacity]). The host
  // backend's capacity is its cap and does not change.
  virtual void measure_capacity() {}

  // Lowers caps().capacity to at most `bytes` (never raises it), and keeps that bound through a later
  // measure_capacity(): the engine agrees one capacity over its ranks, the least, so that every rank
  // makes the same plan (Note [Ranks agree] in zero3/engine_plan.cpp).
  virtual void limit_capacity(std::size_t bytes) = 0;

  // Device memory, counted against caps().capacity; OutOfMemory names capacity, in use and requested
  // bytes and the setting to change. `what` names the allocation in that message.
  virtual void* allocate(std::size_t bytes, const char* what = nullptr) = 0;
  virtual void deallocate(void* p) = 0;
  virtual DeviceMemoryStats memory_stats() const = 0;

  // Page-locked host memory usable by this device's copies (cuda: cudaHostAlloc; host: mmap + mlock,
  // falling back to unlocked memory with one warning when RLIMIT_MEMLOCK is too small). Page-aligned.
  virtual void* allocate_pinned(std::size_t bytes) = 0;
  virtual void deallocate_pinned(void* p) = 0;

  virtual std::unique_ptr<Stream> create_stream(const std::string& name) = 0;
  virtual std::unique_ptr<Event> create_event() = 0;
  virtual void synchronize() = 0;  // all streams of this device
};

struct DeviceOptions {
  std::string backend = "auto";  // "auto" (cuda if a GPU is visible, else host), "host", "cuda"
  // CUDA device ordinal. The host backend keeps it as its identity (caps().ordinal) for Note [thread
  // device]; it must be >= 0.
  int ordinal = 0;
  std::size_t memory_cap = 0;  // 0: the whole device (host: physical RAM)
  // Host backend: every entry point refuses a thread that has not bound this device (Note [thread
  // device]), to find a missed Device::bind_thread() without a GPU; use an ordinal other than 0, the
  // ordinal every thread starts with. Default off. The cuda backend ignores it.
  bool check_thread_device = false;
};

// Opens the device and binds the calling thread to it (Device::bind_thread).
std::unique_ptr<Device> open_device(const DeviceOptions& opts);

// Number of CUDA devices visible; 0 when the cuda backend is not built or none is visible, with the
// reason in *why ("cuda backend not built", "cudaGetDeviceCount: no CUDA-capable device is detected").
int cuda_device_count(std::string* why = nullptr);
bool cuda_backend_built();

// RAII owner of pinned host memory from a Device.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(Device& dev, std::size_t bytes) : dev_(&dev), p_(dev.allocate_pinned(bytes)), n_(bytes) {}
  PinnedBuffer(PinnedBuffer&& o) noexcept { swap(o); }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    PinnedBuffer t(std::move(o));
    swap(t);
    return *this;
  }
  ~PinnedBuffer() {
    if (p_) dev_->deallocate_pinned(p_);
  }
  void* data() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  void swap(PinnedBuffer& o) noexcept {
    std::swap(dev_, o.dev_);
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
  }
  Device* dev_ = nullptr;
  void* p_ = nullptr;
  std::size_t n_ = 0;
};

// RAII owner of device memory.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Device& dev, std::size_t bytes, const char* what = nullptr)
      : dev_(&dev), p_(dev.allocate(bytes, what)), n_(bytes) {}
  DeviceBuffer(DeviceBuffer&& o) noexcept { swap(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    DeviceBuffer t(std::move(o));
    swap(t);
    return *this;
  }
  ~DeviceBuffer() {
    if (p_) dev_->deallocate(p_);
  }
  void* data() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  void swap(DeviceBuffer& o) noexcept {
    std::swap(dev_, o.dev_);
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
  }
  Device* dev_ = nullptr;
  void* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace strata
