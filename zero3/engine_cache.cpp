// The chunk cache (engine_cache.h): gathering working params onto the device (prefetched or on demand),
// keeping or dropping them on release, device room, and NVMe-resident params' pinned copies.
//
// Note [Device room]: the device holds the state the config puts there, the working set and the chunk
// cache (MemoryPlan; the formula is in docs/train.md, "Device memory"). Every device byte is counted as
// the allocator's block (exact segments, so no fragmentation can refuse what the count allows).
//   - working set: what the model holds — acquired chunks and their gradient buffers;
//   - cache: gathered chunks not held: released ones kept for reuse (stage3_max_reuse_distance,
//     stage3_max_live_parameters, and every chunk below stage3_param_persistence_threshold) and
//     prefetches, in flight or arrived. It never exceeds plan.device_cache.
// A demand allocation (the chunk being acquired, a gradient buffer) may drop any cached chunk, the one
// used furthest in the future first (in flight ones after their copy ends). A prefetch must fit the
// cache's budget and may drop only chunks used after the use it is for; otherwise it is declined. A
// release that keeps its chunk trims the cache back to its budget the same way. So the cache is a cache,
// never a reservation: the step's peak is state + working set + cache <= the device's capacity.
//
// Note [Gather]: a gather makes chunk c's working params readable by the ops as fp32 on the device:
//   1. room for the fp32 copy (Note [Device room]);
//   2. the source: the params at home on the device or in pinned memory, or — at home on NVMe — their
//      pinned copy, read by the tier manager (one of offload_param.buffer_count reads in flight; kept as a
//      cache afterwards while the cached elements stay within the plan's param_cache:
//      offload_param.max_in_cpu, or none when pinned memory holds buffers only, Note [Host memory bounded by
//      buffers]);
//   3. on the gather stream: a host function waits for that read (NVMe only), then the compute
//      interface casts the source into the gathered block in the ops' activation dtype, and the stream
//      records the chunk's `ready` event.
// acquire() makes the compute stream wait on `ready` (through the prefetcher, which counts the chunk as
// late): the host does not wait, so the model's ops for the chunk are enqueued while its gather runs. A
// gather from an NVMe home is the exception: the host waits for it, since it must know the read landed
// (a failed read is stored in the slot and raised by that acquire) before it unpins the pinned copy.
//
// Note [Ranks]: with N ranks (stage 3) rank r holds slice r of every chunk. A gather casts the local
// shard into its place in the gathered block and all-gathers the rest in place on the gather stream; a
// gradient hand-off reduce-scatters the buffer (sum; the model scaled its gradients by 1 / (N x
// accumulation)) in place on the gradient stream and hands on this rank's slice. Collectives on one
// communicator must be issued in the same order on every rank, so each stream has its own (dup) and
// every decision that issues one is a function of the program's order, never of timing: a gather in
// flight stays "in flight" for the prefetcher until acquired or dropped (residency() does not poll its
// event), and the cache and allocator decisions depend only on what was allocated and freed (the
// allocator waits for pending frees before refusing). The training thread's collectives (norm,
// overflow, loss, checkpoints) use the engine's own communicator.
#include "zero3/engine_cache.h"

#include <algorithm>
#include <limits>

#include "core/log.h"

namespace strata::zero3 {

void ChunkCache::open() {
  const auto& z = engine_.cfg.zero_optimization;
  prefetch::PrefetchOptions po;
  po.bucket_numel = z.stage3_prefetch_bucket_size;
  po.max_live_numel = z.stage3_max_live_parameters;
  po.max_reuse_distance = z.stage3_max_reuse_distance;
  pf_ = std::make_unique<prefetch::Prefetcher>(*this, po);
}

// ----------------------------------------------------------------------------- prefetch::FetchTarget

std::uint64_t ChunkCache::numel(int c) const {
  return engine_.slots[std::size_t(c)].numel;
}

std::uint64_t ChunkCache::live_numel() const {
  std::uint64_t n = 0;
  for (const ChunkSlot& s : engine_.slots)
    if (s.gather != ChunkSlot::Gather::absent) n += s.numel;
  return n;
}

prefetch::Residency ChunkCache::residency(int c) {
  ChunkSlot& s = engine_.slots[std::size_t(c)];
  switch (s.gather) {
    case ChunkSlot::Gather::absent:
      return prefetch::Residency::absent;
    case ChunkSlot::Gather::in_flight:
      // With N ranks the answer must not depend on timing (Note [Ranks]): a gather stays in flight until
      // its acquire (or drop) waits for it.
      if (s.route.lockstep || !s.ready->query()) return prefetch::Residency::in_flight;
      finish_fetch(s);
      return prefetch::Residency::resident;
    default:
      return prefetch::Residency::resident;
  }
}

bool ChunkCache::cached(const ChunkSlot& s) const {
  return s.id != acquiring_ &&
         (s.gather == ChunkSlot::Gather::ready || s.gather == ChunkSlot::Gather::in_flight);
}

std::uint64_t ChunkCache::cache_bytes() const {
  std::uint64_t b = 0;
  for (const ChunkSlot& s : engine_.slots)
    if (cached(s)) b += s.gather_block;
  return b;
}

std::int64_t ChunkCache::next_use(const ChunkSlot& s) const {
  return engine_.in_pass ? pf_->upcoming(s.id) : -1;
}

ChunkSlot* ChunkCache::victim(std::int64_t for_position) {
  constexpr std::int64_t never = std::numeric_limits<std::int64_t>::max();
  ChunkSlot* best = nullptr;
  std::int64_t best_next = 0;
  for (ChunkSlot& s : engine_.slots) {
    if (!cached(s)) continue;
    const std::int64_t q = next_use(s);
    const std::int64_t next = q < 0 ? never : q;
    if (for_position >= 0 && next <= for_position) continue;
    if (!best || next > best_next || (next == best_next && s.last_use < best->last_use)) {
      best = &s;
      best_next = next;
    }
  }
  return best;
}

bool ChunkCache::fit_cache(std::uint64_t more, std::int64_t for_position) {
  if (more > engine_.plan.device_cache) return false;
  std::uint64_t bytes = cache_bytes();
  while (bytes + more > engine_.plan.device_cache) {
    ChunkSlot* v = victim(for_position);
    if (!v) return false;
    bytes -= v->gather_block;
    drop_gathered(*v);
  }
  return true;
}

void* ChunkCache::device_alloc(tiering::TensorId id, AllocFor who) {
  for (;;) {
    try {
      return engine_.tm->allocate(id, Tier::device);
    } catch (const OutOfMemory&) {
      // A prefetch never takes room from the cache's budget that is not there; a demand (the chunk being
      // acquired, a gradient buffer) may take the whole cache. With none left, the model holds more at
      // once than the plan's working set.
      if (who == AllocFor::prefetch) return nullptr;
      ChunkSlot* v = victim(kAnyCached);
      if (!v) throw;
      drop_gathered(*v);
    }
  }
}

bool ChunkCache::start_fetch(int c, bool demand) {
  ChunkSlot& s = engine_.slots[std::size_t(c)];
  STRATA_CHECK(s.gather == ChunkSlot::Gather::absent, "zero3: chunk ", s.name, " gathered twice");
  gate_.settle(c);  // the last step's update of this chunk, left to the worker, writes its params
  const bool from_nvme = s.route.param_home == Tier::nvme;
  const auto& z = engine_.cfg.zero_optimization;
  if (from_nvme && !demand && nvme_param_reads_ >= z.offload_param.buffer_count) {
    // Is the pinned copy cached? Then no read buffer is needed.
    if (!tiering::has(engine_.tm->info(s.tensors.param).valid, Tier::pinned)) return false;
  }
  // A prefetch goes into the cache: it must fit the cache's budget, making room only by dropping chunks
  // used after it. A demand fetch is for a chunk about to be held (the working set).
  if (!demand && !fit_cache(s.gather_block, std::max<std::int64_t>(0, next_use(s)))) return false;
  void* g = device_alloc(s.gathered, demand ? AllocFor::demand : AllocFor::prefetch);
  if (!g) return false;
  s.gptr = g;

  const void* src = s.param_home;
  tiering::Move read;
  if (from_nvme) {
    engine_.tm->pin(s.tensors.param);
    s.pins_param = true;
    read = engine_.tm->fetch(s.tensors.param, Tier::pinned);
    src = engine_.tm->data(s.tensors.param, Tier::pinned);
    if (read) {
      s.counts_nvme_read = true;
      ++nvme_param_reads_;
    }
  }
  if (!s.ready) s.ready = engine_.dev->create_event();
  s.error = nullptr;
  const std::size_t n =
      engine_.param_numel(s);  // replicated (stages 1 and 2): the whole chunk, no all-gather
  std::exception_ptr* err = &s.error;
  if (read) {
    // The NVMe read must land in the pinned copy before the cast reads it; its failure is kept for the
    // acquire that waits for this gather.
    engine_.gather_stream->host_fn([read, err] {
      try {
        read.wait();
      } catch (...) {
        *err = std::current_exception();
      }
    });
  }
  // The source is device memory or pinned host memory; the cast widens this rank's shard to the ops'
  // dtype at its place in the chunk, on the gather stream. With N ranks the all-gather (in place) then
  // brings the other ranks' shards.
  char* mine =
      static_cast<char*>(s.gptr) + (s.route.all_gather ? s.shard.offset : 0) * dtype_bytes(engine_.act);
  engine_.gather_ops->cast(kernels::Tensor{mine, engine_.act, n},
                           kernels::Tensor{const_cast<void*>(src), engine_.working_dtype, n});
  if (s.route.all_gather)
    engine_.gather_comm->all_gather(mine, s.gptr, n, engine_.act, engine_.gather_stream.get());
  engine_.gather_stream->record(*s.ready);
  s.reader = s.ready.get();
  s.gather = ChunkSlot::Gather::in_flight;
  ++engine_.transfers.gathers;
  engine_.transfers.gather_bytes += n * engine_.working_dtype_bytes();
  return true;
}

void ChunkCache::finish_fetch(ChunkSlot& s) {
  s.gather = ChunkSlot::Gather::ready;
  if (s.counts_nvme_read) {
    --nvme_param_reads_;
    s.counts_nvme_read = false;
  }
  if (s.pins_param) {
    engine_.tm->unpin(s.tensors.param);
    s.pins_param = false;
    // The pinned copy stays as a cache, least recently used first out, within plan.param_cache elements.
    auto it = std::find(param_cache_.begin(), param_cache_.end(), s.id);
    if (it == param_cache_.end())
      param_cache_numel_ += s.shard.numel;
    else
      param_cache_.erase(it);
    param_cache_.push_back(s.id);
    trim_param_cache();
  }
  if (s.error) {
    std::exception_ptr e = s.error;
    s.error = nullptr;
    drop_gathered(s);
    std::rethrow_exception(e);
  }
}

void ChunkCache::trim_param_cache() {
  const std::uint64_t limit = engine_.plan.param_cache;
  while (param_cache_numel_ > limit && !param_cache_.empty()) {
    ChunkSlot& old = engine_.slots[std::size_t(param_cache_.front())];
    if (old.pins_param) break;  // its gather is still reading the pinned copy
    param_cache_.pop_front();
    param_cache_numel_ -= old.shard.numel;
    engine_.tm->evict(old.tensors.param, Tier::pinned, Tier::nvme);  // a valid NVMe copy exists: just dropped
  }
}

void ChunkCache::wait_fetch(int c) {
  ChunkSlot& s = engine_.slots[std::size_t(c)];
  STRATA_CHECK(s.gather == ChunkSlot::Gather::in_flight, "zero3: wait for chunk ", s.name,
               " with no gather in flight");
  // Note [Gather]: the compute stream waits for the gather; the host waits only where it reads, for a
  // gather from an NVMe home (its read's outcome, and the pinned copy it unpins).
  if (s.pins_param) {
    s.ready->synchronize();
    ++engine_.transfers.gather_host_waits;
  } else {
    engine_.compute_stream->wait(*s.ready);
  }
  finish_fetch(s);
}

void ChunkCache::drop_gathered(ChunkSlot& s) {
  // A gather from NVMe still in flight holds a read buffer and a pin: the host settles it first.
  if (s.gather == ChunkSlot::Gather::in_flight && s.pins_param) s.ready->synchronize(), finish_fetch(s);
  // Never marked valid on the device (nothing moves it), so this frees the block without a copy — once its
  // last reader is done: the compute stream's ops enqueued before its release (which waited for the
  // gather), or the gather itself when no acquire came.
  if (s.gptr) engine_.tm->evict(s.gathered, Tier::device, Tier::pinned, s.reader);
  s.gptr = nullptr;
  s.reader = nullptr;
  s.gather = ChunkSlot::Gather::absent;
}

void ChunkCache::drop_all_gathered() {
  for (ChunkSlot& s : engine_.slots) {
    STRATA_CHECK(s.gather != ChunkSlot::Gather::held, "zero3: chunk ", s.name,
                 " is still held at the optimizer step");
    if (s.gather != ChunkSlot::Gather::absent) drop_gathered(s);
  }
}

void ChunkCache::all_gather_params() {
  for (ChunkSlot& s : engine_.slots)
    engine_.gather_comm->all_gather(engine_.my_params(s), s.param_home, s.shard.numel, engine_.working_dtype,
                                    engine_.gather_stream.get());
}

void ChunkCache::params_written(ChunkSlot& s, std::vector<tiering::Move>& writes) {
  engine_.tm->mark_written(s.tensors.param, Tier::pinned);
  engine_.tm->unpin(s.tensors.param);
  auto it = std::find(param_cache_.begin(), param_cache_.end(), s.id);
  const bool cached = it != param_cache_.end();
  if (cached) param_cache_.erase(it);
  const std::uint64_t others = param_cache_numel_ - (cached ? s.shard.numel : 0);
  if (others + s.shard.numel <= engine_.plan.param_cache) {
    writes.push_back(
        engine_.tm->fetch(s.tensors.param, Tier::nvme));  // write through; the pinned copy stays a cache
    param_cache_.push_back(s.id);
    param_cache_numel_ = others + s.shard.numel;
  } else {
    writes.push_back(engine_.tm->evict(s.tensors.param, Tier::pinned, Tier::nvme));
    param_cache_numel_ = others;
  }
}

// --------------------------------------------------------------------------------- ChunkProvider

model::ChunkView ChunkCache::acquire(int c) {
  STRATA_CHECK(c >= 0 && c < int(engine_.slots.size()), "zero3: chunk ", c, " does not exist");
  ChunkSlot& s = engine_.slots[std::size_t(c)];
  STRATA_CHECK(s.gather != ChunkSlot::Gather::held, "zero3: chunk ", s.name, " acquired while already held");
  // A forward outside a training pass (an evaluation, even between the last backward and step()) sees
  // the last step's weights: the early updates are undone first (Note [Optimizer overlap]).
  if (!engine_.in_pass) gate_.undo(UndoAs::cancellation);
  const WaitTimer t0(*engine_.compute_stream);
  // While the prefetcher makes c resident and then starts the fetches after it, c must not be chosen to
  // make room for them.
  acquiring_ = c;
  try {
    if (engine_.in_pass) {
      pf_->acquire(c);
    } else {  // outside training (weight export): on demand
      if (residency(c) == prefetch::Residency::absent) start_fetch(c, true);
      if (s.gather == ChunkSlot::Gather::in_flight) wait_fetch(c);
    }
  } catch (...) {
    acquiring_ = -1;
    throw;
  }
  acquiring_ = -1;
  engine_.times.wait += t0.idle_seconds();
  STRATA_CHECK(s.gather == ChunkSlot::Gather::ready && s.gptr, "zero3: chunk ", s.name,
               " is not resident after acquire");
  s.gather = ChunkSlot::Gather::held;
  s.last_use = ++use_clock_;
  return model::ChunkView{&engine_.layout.chunk(c), s.gptr, engine_.act};
}

void ChunkCache::release(int c) {
  ChunkSlot& s = engine_.slots[std::size_t(c)];
  STRATA_CHECK(s.gather == ChunkSlot::Gather::held, "zero3: chunk ", s.name, " released but not held");
  s.gather = ChunkSlot::Gather::ready;
  s.reader =
      &engine_.computed(s);  // the last op reading the gathered copy: drop_gathered frees the block after it
  const bool keep = engine_.in_pass && (s.persistent || pf_->keep_after_release(c)) &&
                    live_numel() <= engine_.cfg.zero_optimization.stage3_max_live_parameters;
  if (!keep) {
    drop_gathered(s);
    return;
  }
  // Kept for reuse, it joins the cache, which must stay within its budget: the chunks used furthest in
  // the future leave first (this one, if its reuse is the furthest).
  fit_cache(0, kAnyCached);
}

}  // namespace strata::zero3
