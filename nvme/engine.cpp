// AioEngine: backend choice, request table, splitting requests into per-worker parts, fixed buffers.
// The per-piece work happens in worker.cpp.
#include <sys/uio.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "nvme/engine_impl.h"

namespace strata::nvme {

using strata::detail::cat;

void Request::fail(const std::string& msg) {
  std::lock_guard<std::mutex> lock(mu);
  if (failed.load(std::memory_order_relaxed)) return;
  error = msg;
  failed.store(true, std::memory_order_release);
}

int FixedRegions::find(const char* p, std::size_t len) const {
  std::shared_lock<std::shared_mutex> lock(mu);
  for (const Region& r : regions) {
    if (p < r.base || p + len > r.base + r.bytes) continue;
    std::size_t first = std::size_t(p - r.base) / detail::kFixedBufferSlotBytes;
    std::size_t last = std::size_t(p + len - 1 - r.base) / detail::kFixedBufferSlotBytes;
    return first == last ? int(r.first_slot + first) : -1;
  }
  return -1;
}

// ---- backend choice -------------------------------------------------------------------------------

bool backend_available(Backend b, std::string* why) {
  std::string reason;
  switch (b) {
    case Backend::io_uring:
      reason = detail::probe_uring();
      break;
    case Backend::libaio:
      reason = detail::probe_libaio();
      break;
    case Backend::psync:
    case Backend::auto_select:
      break;
  }
  if (why) *why = reason;
  return reason.empty();
}

Backend resolve_backend(Backend requested) {
  if (requested != Backend::auto_select) return requested;
  if (backend_available(Backend::io_uring)) return Backend::io_uring;
  if (backend_available(Backend::libaio)) return Backend::libaio;
  return Backend::psync;
}

namespace {

Backend choose(Backend requested) {
  if (requested != Backend::auto_select) {
    std::string why;
    if (!backend_available(requested, &why))
      throw BackendError(cat("strata.aio.backend is ", to_string(requested), " but it cannot be used here: ",
                             why, ". Set strata.aio.backend to auto to fall back automatically."));
    return requested;
  }
  std::string uring_why, aio_why;
  Backend b = Backend::psync;
  if (backend_available(Backend::io_uring, &uring_why))
    b = Backend::io_uring;
  else if (backend_available(Backend::libaio, &aio_why))
    b = Backend::libaio;
  // Said once per process, and again only if a later probe comes out differently.
  static std::atomic<int> logged{-1};
  if (logged.exchange(int(b)) != int(b)) {
    if (b == Backend::io_uring)
      STRATA_LOG_INFO("aio backend: io_uring (strata.aio.backend auto; io_uring probed first and works)");
    else if (b == Backend::libaio)
      STRATA_LOG_WARN("aio backend: libaio (strata.aio.backend auto; io_uring unavailable: ", uring_why, ")");
    else
      STRATA_LOG_WARN("aio backend: psync (strata.aio.backend auto; io_uring unavailable: ", uring_why,
                      "; libaio unavailable: ", aio_why, "). NVMe throughput will be limited to what ",
                      "blocking pread/pwrite threads reach.");
  }
  return b;
}

std::atomic<detail::QueueFactory> g_queue_factory{nullptr};

std::unique_ptr<detail::Queue> make_queue(Backend b, const AioOptions& o) {
  if (detail::QueueFactory f = g_queue_factory.load()) return f(unsigned(o.queue_depth));
  switch (b) {
    case Backend::io_uring:
      return detail::make_uring_queue(unsigned(o.queue_depth), o.sqpoll);
    case Backend::libaio:
      return detail::make_libaio_queue(unsigned(o.queue_depth));
    default:
      return detail::make_psync_queue(unsigned(o.queue_depth));
  }
}

std::uint64_t round_down(std::uint64_t v, std::uint64_t a) {
  return v - v % a;
}

}  // namespace

detail::QueueFactory detail::exchange_queue_factory(QueueFactory factory) {
  return g_queue_factory.exchange(factory);
}

// ---- engine ---------------------------------------------------------------------------------------

AioEngine::AioEngine(const AioOptions& opts) : impl_(std::make_unique<Impl>()) {
  opts.validate();
  impl_->opts = opts;
  impl_->backend = choose(opts.backend);
  impl_->opts.backend = impl_->backend;
  if (impl_->opts.sqpoll && impl_->backend != Backend::io_uring) impl_->opts.sqpoll = false;
  for (int i = 0; i < opts.intra_op_parallelism; ++i)
    impl_->workers.push_back(
        std::make_unique<Worker>(*impl_, make_queue(impl_->backend, impl_->opts), impl_->opts));
  detail::QueueCaps qc = impl_->workers.front()->queue().caps();
  impl_->caps = {impl_->backend, qc.async, qc.fixed_buffers, qc.wakeable};
}

AioEngine::~AioEngine() {
  try {
    wait_all();
  } catch (const std::exception& e) {
    STRATA_LOG_ERROR("aio engine shut down with failed requests nobody waited for: ", e.what());
  }
  impl_->workers.clear();  // joins
}

Backend AioEngine::backend() const {
  return impl_->backend;
}
const AioOptions& AioEngine::options() const {
  return impl_->opts;
}
EngineCaps AioEngine::caps() const {
  return impl_->caps;
}

IoHandle AioEngine::submit_read(const File& file, void* dst, std::size_t bytes, std::uint64_t offset) {
  const Segment s{&file, offset, bytes, dst};
  return impl_->submit(detail::Op::read, {&s, 1});
}

IoHandle AioEngine::submit_write(const File& file, const void* src, std::size_t bytes, std::uint64_t offset) {
  const Segment s{&file, offset, bytes, const_cast<void*>(src)};
  return impl_->submit(detail::Op::write, {&s, 1});
}

IoHandle AioEngine::submit_read(std::span<const Segment> segments) {
  return impl_->submit(detail::Op::read, segments);
}

IoHandle AioEngine::submit_write(std::span<const Segment> segments) {
  return impl_->submit(detail::Op::write, segments);
}

IoHandle AioEngine::Impl::submit(detail::Op op, std::span<const Segment> segments) {
  const char* verb = op == detail::Op::read ? "read" : "write";
  std::size_t total = 0;
  for (const Segment& s : segments) {
    STRATA_CHECK(s.file != nullptr, verb, " of ", s.bytes, " bytes at offset ", s.offset, ": no file given");
    STRATA_CHECK(s.file->is_open(), verb, " of ", s.bytes, " bytes at offset ", s.offset,
                 ": the file is not open");
    STRATA_CHECK(s.buf != nullptr || s.bytes == 0, verb, " of ", s.bytes, " bytes at offset ", s.offset,
                 " in ", s.file->path(), ": null buffer");
    STRATA_CHECK(s.offset + s.bytes >= s.offset, verb, " in ", s.file->path(), ": offset ", s.offset, " + ",
                 s.bytes, " bytes overflows");
    total += s.bytes;
  }
  auto req = std::make_shared<Request>();
  req->id = next_id.fetch_add(1, std::memory_order_relaxed);
  req->op = op;
  req->files.reserve(segments.size());
  for (const Segment& s : segments) req->files.push_back(s.file);
  req->len = total;
  counters.requests.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu);
    pending.emplace(req->id, req);
  }
  started();
  IoHandle h{req->id};
  if (total == 0) {
    req->parts_left.store(1);
    complete(*req);
    return h;
  }

  // Split every segment into up to one part per worker at multiples of the block size (whole pages at
  // least), so that every part starts where a piece would have started anyway; deal the parts of all
  // segments out to the workers in turn, each worker's parts handed over together.
  const std::size_t n = workers.size();
  std::vector<std::unique_ptr<Part>> parts;
  for (const Segment& s : segments) {
    if (s.bytes == 0) continue;
    const File& file = *s.file;
    std::uint64_t unit = opts.block_size;
    if (file.direct() && unit % file.page_align() != 0) unit = file.page_align();
    std::vector<std::uint64_t> cuts{s.offset};
    for (std::size_t k = 1; k < n; ++k) {
      std::uint64_t c = round_down(s.offset + s.bytes * k / n, unit);
      if (c > cuts.back() && c < s.offset + s.bytes) cuts.push_back(c);
    }
    cuts.push_back(s.offset + s.bytes);
    for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
      auto p = std::make_unique<Part>();
      p->req = req;
      p->file = &file;
      p->buf = static_cast<char*>(s.buf);
      p->seg_off = s.offset;
      p->seg_len = s.bytes;
      p->pos = cuts[i];
      p->end = cuts[i + 1];
      parts.push_back(std::move(p));
    }
  }
  req->parts_left.store(std::uint32_t(parts.size()), std::memory_order_relaxed);
  const std::size_t first = next_worker.fetch_add(1, std::memory_order_relaxed);
  std::vector<std::vector<std::unique_ptr<Part>>> dealt(std::min(n, parts.size()));
  for (std::size_t i = 0; i < parts.size(); ++i) dealt[i % dealt.size()].push_back(std::move(parts[i]));
  for (std::size_t w = 0; w < dealt.size(); ++w) workers[(first + w) % n]->enqueue(std::move(dealt[w]));
  return h;
}

void AioEngine::Impl::started() {
  std::lock_guard<std::mutex> lock(busy_mu);
  if (in_flight++ == 0) busy_since = std::chrono::steady_clock::now();
}

void AioEngine::Impl::finished() {
  std::lock_guard<std::mutex> lock(busy_mu);
  if (--in_flight == 0) busy += std::chrono::steady_clock::now() - busy_since;
}

void AioEngine::Impl::complete(Request& r) {
  finished();
  if (r.failed.load(std::memory_order_acquire)) {
    counters.failed_requests.fetch_add(1, std::memory_order_relaxed);
  } else if (r.op == detail::Op::read) {
    counters.bytes_read.fetch_add(r.len, std::memory_order_relaxed);
  } else {
    counters.bytes_written.fetch_add(r.len, std::memory_order_relaxed);
  }
  r.done.store(1, std::memory_order_release);
  r.done.notify_all();
}

std::shared_ptr<Request> AioEngine::Impl::find(IoHandle h, const char* what) const {
  std::lock_guard<std::mutex> lock(mu);
  auto it = pending.find(h.id);
  if (it == pending.end())
    throw Error(
        cat("aio ", what, ": handle ", h.id,
            " is not pending on this engine (already collected by wait/wait_all, or never submitted here)"));
  return it->second;
}

void AioEngine::Impl::collect(std::uint64_t id) {
  std::lock_guard<std::mutex> lock(mu);
  pending.erase(id);
}

void AioEngine::wait(IoHandle h) {
  std::shared_ptr<Request> r = impl_->find(h, "wait");
  while (r->done.load(std::memory_order_acquire) == 0) r->done.wait(0, std::memory_order_acquire);
  impl_->collect(h.id);
  if (r->failed.load(std::memory_order_acquire)) throw IoError(r->error);
}

bool AioEngine::poll(IoHandle h) const {
  return impl_->find(h, "poll")->done.load(std::memory_order_acquire) != 0;
}

void AioEngine::wait_all() {
  std::vector<std::shared_ptr<Request>> all;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    all.reserve(impl_->pending.size());
    for (auto& [id, r] : impl_->pending) all.push_back(r);
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a->id < b->id; });
  std::string first_error;
  std::size_t failed = 0;
  for (auto& r : all) {
    while (r->done.load(std::memory_order_acquire) == 0) r->done.wait(0, std::memory_order_acquire);
    impl_->collect(r->id);
    if (r->failed.load(std::memory_order_acquire) && failed++ == 0) first_error = r->error;
  }
  if (failed == 1) throw IoError(first_error);
  if (failed > 1) throw IoError(cat(first_error, " (and ", failed - 1, " more failed requests)"));
}

void AioEngine::drain(const File& file) {
  std::vector<std::shared_ptr<Request>> on_file;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (auto& [id, r] : impl_->pending)
      if (std::find(r->files.begin(), r->files.end(), &file) != r->files.end()) on_file.push_back(r);
  }
  for (auto& r : on_file)
    while (r->done.load(std::memory_order_acquire) == 0) r->done.wait(0, std::memory_order_acquire);
}

void AioEngine::read(const File& file, void* dst, std::size_t bytes, std::uint64_t offset) {
  wait(submit_read(file, dst, bytes, offset));
}

void AioEngine::write(const File& file, const void* src, std::size_t bytes, std::uint64_t offset) {
  wait(submit_write(file, src, bytes, offset));
}

bool AioEngine::register_buffers(void* ptr, std::size_t bytes) {
  if (!impl_->caps.fixed_buffers || ptr == nullptr || bytes == 0) return false;
  FixedRegions& fx = impl_->fixed;
  std::unique_lock<std::shared_mutex> lock(fx.mu);
  for (const auto& r : fx.regions)
    STRATA_CHECK(r.base != ptr, "register_buffers: a region at ", ptr, " is already registered");
  const unsigned need = unsigned((bytes + detail::kFixedBufferSlotBytes - 1) / detail::kFixedBufferSlotBytes);
  unsigned first = 0, run = 0;
  for (unsigned i = 0; i < detail::kFixedBufferSlots && run < need; ++i) {
    if (fx.used[i]) {
      run = 0;
      first = i + 1;
    } else {
      ++run;
    }
  }
  if (run < need) {
    STRATA_WARN_ONCE("io_uring: no room for ", format_bytes(bytes), " more fixed buffers (",
                     detail::kFixedBufferSlots, " slots of 1 GiB); that memory uses plain reads and writes");
    return false;
  }
  std::vector<iovec> iov(need);
  char* base = static_cast<char*>(ptr);
  for (unsigned i = 0; i < need; ++i) {
    std::size_t at = std::size_t(i) * detail::kFixedBufferSlotBytes;
    iov[i] = {base + at, std::min(detail::kFixedBufferSlotBytes, bytes - at)};
  }
  std::size_t done = 0;
  for (; done < impl_->workers.size(); ++done)
    if (!impl_->workers[done]->queue().set_buffers(first, iov.data(), need)) break;
  if (done < impl_->workers.size()) {  // roll back the rings that accepted
    std::vector<iovec> empty(need, iovec{nullptr, 0});
    for (std::size_t w = 0; w < done; ++w) impl_->workers[w]->queue().set_buffers(first, empty.data(), need);
    return false;
  }
  for (unsigned i = 0; i < need; ++i) fx.used[first + i] = true;
  fx.regions.push_back({base, bytes, first, need});
  return true;
}

void AioEngine::unregister_buffers(void* ptr) {
  FixedRegions& fx = impl_->fixed;
  std::unique_lock<std::shared_mutex> lock(fx.mu);
  auto it = std::find_if(fx.regions.begin(), fx.regions.end(), [&](const auto& r) { return r.base == ptr; });
  if (it == fx.regions.end()) return;
  std::vector<iovec> empty(it->slots, iovec{nullptr, 0});
  for (auto& w : impl_->workers) w->queue().set_buffers(it->first_slot, empty.data(), it->slots);
  for (unsigned i = 0; i < it->slots; ++i) fx.used[it->first_slot + i] = false;
  fx.regions.erase(it);
}

IoStats AioEngine::stats() const {
  const EngineCounters& c = impl_->counters;
  IoStats s;
  s.requests = c.requests.load();
  s.failed_requests = c.failed_requests.load();
  s.bytes_read = c.bytes_read.load();
  s.bytes_written = c.bytes_written.load();
  s.pieces = c.pieces.load();
  s.direct_pieces = c.direct_pieces.load();
  s.bounce_pieces = c.bounce_pieces.load();
  s.fixed_pieces = c.fixed_pieces.load();
  s.retries = c.retries.load();
  s.short_transfers = c.short_transfers.load();
  {
    std::lock_guard<std::mutex> lock(impl_->busy_mu);
    std::chrono::steady_clock::duration busy = impl_->busy;
    if (impl_->in_flight > 0) busy += std::chrono::steady_clock::now() - impl_->busy_since;
    s.busy_seconds = std::chrono::duration<double>(busy).count();
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  s.pending = impl_->pending.size();
  return s;
}

}  // namespace strata::nvme
