// Chunks on the device: gathering working params (prefetched or on demand), keeping or dropping them on
// release, device room, and the gradient path off the device.
//
// Note [Gather]: a gather makes chunk c's working params readable by the ops as fp32 on the device:
//   1. room for the fp32 copy (dropping gathered chunks that are not held, furthest next use first);
//   2. the source: the params at home on the device or in pinned memory, or — at home on NVMe — their
//      pinned copy, read by the tier manager (one of offload_param.buffer_count reads in flight; kept as a
//      cache afterwards while the cached elements stay within offload_param.max_in_cpu);
//   3. one host function on the gather stream waits for that read and widens the source into the fp32
//      copy, then the stream records the chunk's `ready` event.
// acquire() waits on `ready` (through the prefetcher, which counts the wait). A failed read or widening
// is stored in the slot and raised by the acquire that waits for it.
//
// Note [Gradients off the device]: the model adds each chunk's gradients into a zeroed fp32 buffer on the
// device (acquire_grads). release_grads hands that buffer to the chunk's fp32 gradient shard: copied when
// the shard is still empty this step, added element by element otherwise — the same arithmetic whether
// the shard is on the device (done at once on the training thread) or in pinned host memory (done on the
// gradient stream, overlapping the next chunk's backward; the buffer is freed when that pass has run).
#include <algorithm>
#include <cstring>
#include <limits>

#include "core/log.h"
#include "kernels/cpu/ops.h"
#include "zero3/engine_impl.h"

namespace strata::zero3 {
namespace {

using detail::cat;

void widen(float* dst, const void* src, std::size_t n, tiering::Dtype wd) {
  namespace kc = kernels::cpu;
  switch (wd) {
    case tiering::Dtype::bf16:
      kc::cast_bf16_to_f32(dst, static_cast<const kc::bf16_t*>(src), n);
      break;
    case tiering::Dtype::fp16:
      kc::cast_f16_to_f32(dst, static_cast<const kc::fp16_t*>(src), n);
      break;
    default:
      std::memcpy(dst, src, n * sizeof(float));
  }
}

void accumulate(float* dst, const float* src, std::size_t n, bool fresh) {
  if (fresh) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  for (std::size_t i = 0; i < n; ++i) dst[i] += src[i];
}

}  // namespace

// ----------------------------------------------------------------------------- prefetch::FetchTarget

std::uint64_t Engine::Impl::numel(int c) const {
  return slots[std::size_t(c)].numel;
}

std::uint64_t Engine::Impl::live_numel() const {
  std::uint64_t n = 0;
  for (const ChunkSlot& s : slots)
    if (s.g != ChunkSlot::Gather::absent) n += s.numel;
  return n;
}

prefetch::Residency Engine::Impl::residency(int c) {
  ChunkSlot& s = slots[std::size_t(c)];
  switch (s.g) {
    case ChunkSlot::Gather::absent:
      return prefetch::Residency::absent;
    case ChunkSlot::Gather::in_flight:
      if (!s.ready->query()) return prefetch::Residency::in_flight;
      finish_fetch(s);
      return prefetch::Residency::resident;
    default:
      return prefetch::Residency::resident;
  }
}

bool Engine::Impl::evictable(const ChunkSlot& s, bool demand, std::int64_t for_position) const {
  if (s.g != ChunkSlot::Gather::ready || s.id == acquiring) return false;
  if (demand || !in_pass) return true;
  const std::int64_t next = pf->next_use(s.id);
  return next < 0 || (for_position >= 0 && next > for_position);
}

bool Engine::Impl::make_room(std::uint64_t bytes, bool demand, std::int64_t for_position) {
  const tiering::PoolStats ps = tm->pool_stats(Tier::device);
  std::uint64_t used = ps.used.current;
  if (ps.capacity == 0 || used + bytes <= ps.capacity) return true;
  std::vector<std::pair<std::int64_t, ChunkSlot*>> cands;
  for (ChunkSlot& s : slots) {
    if (!evictable(s, demand, for_position)) continue;
    const std::int64_t next = in_pass ? pf->next_use(s.id) : -1;
    cands.push_back({next < 0 ? std::numeric_limits<std::int64_t>::max() : next, &s});
  }
  std::sort(cands.begin(), cands.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second->last_use < b.second->last_use;
  });
  for (auto& [next, s] : cands) {
    if (used + bytes <= ps.capacity) break;
    used -= std::min<std::uint64_t>(used, s->numel * 4);
    drop_gathered(*s);
  }
  return demand || used + bytes <= ps.capacity;
}

void* Engine::Impl::device_alloc(tiering::TensorId id, std::uint64_t bytes, bool demand,
                                 std::int64_t for_position) {
  if (!make_room(bytes, demand, for_position)) return nullptr;
  for (;;) {
    try {
      return tm->allocate(id, Tier::device);
    } catch (const OutOfMemory&) {
      // The caching allocator's rounding can refuse what the byte count allowed: drop one more gathered
      // chunk and retry; with none left, a prefetch declines and a demand fails.
      ChunkSlot* victim = nullptr;
      for (ChunkSlot& s : slots)
        if (evictable(s, demand, for_position) && (!victim || s.last_use < victim->last_use)) victim = &s;
      if (!victim) {
        if (!demand) return nullptr;
        throw;
      }
      drop_gathered(*victim);
    }
  }
}

bool Engine::Impl::start_fetch(int c, bool demand) {
  ChunkSlot& s = slots[std::size_t(c)];
  STRATA_CHECK(s.g == ChunkSlot::Gather::absent, "zero3: chunk ", s.name, " gathered twice");
  const bool from_nvme = homes.param == Tier::nvme;
  const auto& z = cfg.zero_optimization;
  if (from_nvme && !demand && nvme_param_reads >= z.offload_param.buffer_count) {
    // Is the pinned copy cached? Then no read buffer is needed.
    if (!tiering::has(tm->info(s.t.param).valid, Tier::pinned)) return false;
  }
  const std::uint64_t bytes = s.numel * sizeof(float);
  void* g = device_alloc(s.gathered, bytes, demand, in_pass ? pf->upcoming(c) : -1);
  if (!g) return false;
  s.gptr = static_cast<float*>(g);

  const void* src = s.param_home;
  tiering::Move read;
  if (from_nvme) {
    tm->pin(s.t.param);
    s.pins_param = true;
    read = tm->fetch(s.t.param, Tier::pinned);
    src = tm->data(s.t.param, Tier::pinned);
    if (read) {
      s.counts_nvme_read = true;
      ++nvme_param_reads;
    }
  }
  if (!s.ready) s.ready = dev->create_event();
  s.error = nullptr;
  float* dst = s.gptr;
  const std::size_t n = s.shard.numel;
  const tiering::Dtype dtype = wd;
  std::exception_ptr* err = &s.error;
  // World size 1: this rank's shard is the whole chunk (an all-gather would assemble it here).
  gather_stream->host_fn([read, src, dst, n, dtype, err] {
    try {
      read.wait();
      widen(dst, src, n, dtype);
    } catch (...) {
      *err = std::current_exception();
    }
  });
  gather_stream->record(*s.ready);
  s.g = ChunkSlot::Gather::in_flight;
  ++transfers.gathers;
  transfers.gather_bytes += n * wd_bytes();
  return true;
}

void Engine::Impl::finish_fetch(ChunkSlot& s) {
  s.g = ChunkSlot::Gather::ready;
  if (s.counts_nvme_read) {
    --nvme_param_reads;
    s.counts_nvme_read = false;
  }
  if (s.pins_param) {
    tm->unpin(s.t.param);
    s.pins_param = false;
    // The pinned copy stays as a cache, least recently used first out, within max_in_cpu elements.
    auto it = std::find(param_cache.begin(), param_cache.end(), s.id);
    if (it == param_cache.end())
      param_cache_numel += s.shard.numel;
    else
      param_cache.erase(it);
    param_cache.push_back(s.id);
    trim_param_cache();
  }
  if (s.error) {
    std::exception_ptr e = s.error;
    s.error = nullptr;
    drop_gathered(s);
    std::rethrow_exception(e);
  }
}

void Engine::Impl::trim_param_cache() {
  const std::uint64_t limit = cfg.zero_optimization.offload_param.max_in_cpu;
  while (param_cache_numel > limit && !param_cache.empty()) {
    ChunkSlot& old = slots[std::size_t(param_cache.front())];
    if (old.pins_param) break;  // its gather is still reading the pinned copy
    param_cache.pop_front();
    param_cache_numel -= old.shard.numel;
    tm->evict(old.t.param, Tier::pinned, Tier::nvme);  // a valid NVMe copy exists: just dropped
  }
}

void Engine::Impl::wait_fetch(int c) {
  ChunkSlot& s = slots[std::size_t(c)];
  STRATA_CHECK(s.g == ChunkSlot::Gather::in_flight, "zero3: wait for chunk ", s.name,
               " with no gather in flight");
  s.ready->synchronize();
  finish_fetch(s);
}

void Engine::Impl::drop_gathered(ChunkSlot& s) {
  if (s.g == ChunkSlot::Gather::in_flight) s.ready->synchronize(), finish_fetch(s);
  // Never marked valid on the device (nothing moves it), so this frees the block without a copy.
  if (s.gptr) tm->evict(s.gathered, Tier::device, Tier::pinned);
  s.gptr = nullptr;
  s.g = ChunkSlot::Gather::absent;
}

void Engine::Impl::drop_all_gathered() {
  for (ChunkSlot& s : slots) {
    STRATA_CHECK(s.g != ChunkSlot::Gather::held, "zero3: chunk ", s.name,
                 " is still held at the optimizer step");
    if (s.g != ChunkSlot::Gather::absent) drop_gathered(s);
  }
}

// --------------------------------------------------------------------------------- ChunkProvider

model::ChunkView Engine::Impl::acquire(int c) {
  STRATA_CHECK(c >= 0 && c < int(slots.size()), "zero3: chunk ", c, " does not exist");
  ChunkSlot& s = slots[std::size_t(c)];
  STRATA_CHECK(s.g != ChunkSlot::Gather::held, "zero3: chunk ", s.name, " acquired while already held");
  auto t0 = Clock::now();
  // While the prefetcher makes c resident and then starts the fetches after it, c must not be chosen to
  // make room for them.
  acquiring = c;
  try {
    if (in_pass) {
      pf->acquire(c);
    } else {  // outside training (weight export): on demand
      if (residency(c) == prefetch::Residency::absent) start_fetch(c, true);
      if (s.g == ChunkSlot::Gather::in_flight) wait_fetch(c);
    }
  } catch (...) {
    acquiring = -1;
    throw;
  }
  acquiring = -1;
  times.wait += seconds_since(t0);
  STRATA_CHECK(s.g == ChunkSlot::Gather::ready && s.gptr, "zero3: chunk ", s.name,
               " is not resident after acquire");
  s.g = ChunkSlot::Gather::held;
  s.last_use = ++use_clock;
  return model::ChunkView{&layout.chunk(c), s.gptr};
}

void Engine::Impl::release(int c) {
  ChunkSlot& s = slots[std::size_t(c)];
  STRATA_CHECK(s.g == ChunkSlot::Gather::held, "zero3: chunk ", s.name, " released but not held");
  s.g = ChunkSlot::Gather::ready;
  const bool keep = in_pass && (s.persistent || pf->keep_after_release(c)) &&
                    live_numel() <= cfg.zero_optimization.stage3_max_live_parameters;
  if (!keep) drop_gathered(s);
}

float* Engine::Impl::acquire_grads(int c) {
  ChunkSlot& s = slots[std::size_t(c)];
  STRATA_CHECK(s.gbuf == nullptr, "zero3: gradients of chunk ", s.name, " acquired while held");
  const std::uint64_t bytes = s.numel * sizeof(float);
  s.gbuf = static_cast<float*>(device_alloc(s.gradbuf, bytes, true, -1));
  std::memset(s.gbuf, 0, bytes);
  return s.gbuf;
}

void Engine::Impl::release_grads(int c) {
  ChunkSlot& s = slots[std::size_t(c)];
  STRATA_CHECK(s.gbuf != nullptr, "zero3: gradients of chunk ", s.name, " released but not held");
  // World size 1: the reduce-scatter leaves this rank's slice, the whole buffer.
  const float* src = s.gbuf + s.shard.offset;
  const std::size_t n = s.shard.numel;
  const bool fresh = s.grads_fresh;
  s.grads_fresh = false;
  ++transfers.grad_handoffs;
  transfers.grad_bytes += n * sizeof(float);
  if (homes.grad == Tier::device) {
    accumulate(s.grad, src, n, fresh);
    tm->evict(s.gradbuf, Tier::device, Tier::pinned);  // frees the block (never valid: no copy)
  } else {
    float* dst = s.grad;
    grad_stream->host_fn([this, dst, src, n, fresh] {
      try {
        accumulate(dst, src, n, fresh);
      } catch (...) {
        std::lock_guard<std::mutex> lk(grad_mu);
        if (!grad_error) grad_error = std::current_exception();
      }
    });
    auto done = dev->create_event();
    grad_stream->record(*done);
    tm->evict(s.gradbuf, Tier::device, Tier::pinned, done.get());  // the block is reused after the pass
  }
  s.gbuf = nullptr;
}

void Engine::Impl::sync_grads() {
  auto t0 = Clock::now();
  grad_stream->synchronize();
  times.wait += seconds_since(t0);
  std::lock_guard<std::mutex> lk(grad_mu);
  if (grad_error) {
    std::exception_ptr e = grad_error;
    grad_error = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace strata::zero3
