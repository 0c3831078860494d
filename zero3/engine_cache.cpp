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

using Gather = CacheEntry::Gather;

void ChunkCache::open() {
  const auto& z = env_.cfg.zero_optimization;
  prefetch::PrefetchOptions po;
  po.bucket_numel = z.stage3_prefetch_bucket_size;
  po.max_live_numel = z.stage3_max_live_parameters;
  po.max_reuse_distance = z.stage3_max_reuse_distance;
  pf_ = std::make_unique<prefetch::Prefetcher>(*this, po);
  entries_.reserve(env_.slots.size());  // never moved: a gather's host function holds its `error`
}

void ChunkCache::add_chunk(const ChunkSlot& s) {
  STRATA_CHECK(std::size_t(s.id) == entries_.size(), "zero3: chunk ", s.name, " added out of order");
  CacheEntry& e = entries_.emplace_back();
  e.gathered = env_.tm->register_tensor({.name = s.name + ".gathered",
                                         .kind = tiering::Kind::param,
                                         .dtype = env_.act,
                                         .bytes = s.numel * dtype_bytes(env_.act),
                                         .home = Tier::device,
                                         .chunk = s.id,
                                         .shard = -1});
  env_.tm->pin(e.gathered);
}

void ChunkCache::begin_pass(bool repeat) {
  STRATA_CHECK(!in_pass_, "zero3: begin_pass inside a pass");
  in_pass_ = true;
  pf_->begin_pass(repeat);
}

void ChunkCache::end_pass() {
  STRATA_CHECK(in_pass_, "zero3: end_pass without begin_pass");
  in_pass_ = false;
  pf_->end_pass();
}

void ChunkCache::abandon_pass() {
  in_pass_ = false;
  pf_->abandon_pass();
}

// ----------------------------------------------------------------------------- prefetch::FetchTarget

std::uint64_t ChunkCache::numel(int c) const {
  return slot(c).numel;
}

std::uint64_t ChunkCache::live_numel() const {
  std::uint64_t n = 0;
  for (std::size_t c = 0; c < entries_.size(); ++c)
    if (entries_[c].gather != Gather::absent) n += env_.slots[c].numel;
  return n;
}

prefetch::Residency ChunkCache::residency(int c) {
  CacheEntry& e = entries_[std::size_t(c)];
  switch (e.gather) {
    case Gather::absent:
      return prefetch::Residency::absent;
    case Gather::in_flight:
      // With N ranks the answer must not depend on timing (Note [Ranks]): a gather stays in flight until
      // its acquire (or drop) waits for it.
      if (slot(c).route.lockstep || !e.ready->query()) return prefetch::Residency::in_flight;
      finish_fetch(c);
      return prefetch::Residency::resident;
    default:
      return prefetch::Residency::resident;
  }
}

bool ChunkCache::cached(int c) const {
  const Gather g = entries_[std::size_t(c)].gather;
  return c != acquiring_ && (g == Gather::ready || g == Gather::in_flight);
}

std::uint64_t ChunkCache::cache_bytes() const {
  std::uint64_t b = 0;
  for (std::size_t c = 0; c < entries_.size(); ++c)
    if (cached(int(c))) b += env_.slots[c].gather_block;
  return b;
}

std::int64_t ChunkCache::next_use(int c) const {
  return in_pass_ ? pf_->upcoming(c) : -1;
}

int ChunkCache::victim(std::int64_t for_position) const {
  constexpr std::int64_t never = std::numeric_limits<std::int64_t>::max();
  int best = -1;
  std::int64_t best_next = 0;
  for (int c = 0; c < int(entries_.size()); ++c) {
    if (!cached(c)) continue;
    const std::int64_t q = next_use(c);
    const std::int64_t next = q < 0 ? never : q;
    if (for_position >= 0 && next <= for_position) continue;
    if (best < 0 || next > best_next ||
        (next == best_next && entries_[std::size_t(c)].last_use < entries_[std::size_t(best)].last_use)) {
      best = c;
      best_next = next;
    }
  }
  return best;
}

bool ChunkCache::fit_cache(std::uint64_t more, std::int64_t for_position) {
  if (more > env_.plan.device_cache) return false;
  std::uint64_t bytes = cache_bytes();
  while (bytes + more > env_.plan.device_cache) {
    const int v = victim(for_position);
    if (v < 0) return false;
    bytes -= slot(v).gather_block;
    drop_gathered(v);
  }
  return true;
}

void* ChunkCache::device_alloc(tiering::TensorId id, AllocFor who) {
  for (;;) {
    try {
      return env_.tm->allocate(id, Tier::device);
    } catch (const OutOfMemory&) {
      // A prefetch never takes room from the cache's budget that is not there; a demand (the chunk being
      // acquired, a gradient buffer) may take the whole cache. With none left, the model holds more at
      // once than the plan's working set.
      if (who == AllocFor::prefetch) return nullptr;
      const int v = victim(kAnyCached);
      if (v < 0) throw;
      drop_gathered(v);
    }
  }
}

bool ChunkCache::start_fetch(int c, bool demand) {
  const ChunkSlot& s = slot(c);
  CacheEntry& e = entries_[std::size_t(c)];
  STRATA_CHECK(e.gather == Gather::absent, "zero3: chunk ", s.name, " gathered twice");
  gate_.settle(c);  // the last step's update of this chunk, left to the worker, writes its params
  const bool from_nvme = s.route.param_home == Tier::nvme;
  const auto& z = env_.cfg.zero_optimization;
  if (from_nvme && !demand && nvme_param_reads_ >= z.offload_param.buffer_count) {
    // Is the pinned copy cached? Then no read buffer is needed.
    if (!tiering::has(env_.tm->info(s.tensors.param).valid, Tier::pinned)) return false;
  }
  // A prefetch goes into the cache: it must fit the cache's budget, making room only by dropping chunks
  // used after it. A demand fetch is for a chunk about to be held (the working set).
  if (!demand && !fit_cache(s.gather_block, std::max<std::int64_t>(0, next_use(c)))) return false;
  void* g = device_alloc(e.gathered, demand ? AllocFor::demand : AllocFor::prefetch);
  if (!g) return false;
  e.gptr = g;

  const void* src = s.param_home;
  tiering::Move read;
  if (from_nvme) {
    env_.tm->pin(s.tensors.param);
    e.pins_param = true;
    read = env_.tm->fetch(s.tensors.param, Tier::pinned);
    src = env_.tm->data(s.tensors.param, Tier::pinned);
    if (read) {
      e.counts_nvme_read = true;
      ++nvme_param_reads_;
    }
  }
  if (!e.ready) e.ready = env_.dev->create_event();
  e.error = nullptr;
  const std::size_t n = s.param_numel;  // replicated (stages 1 and 2): the whole chunk, no all-gather
  std::exception_ptr* err = &e.error;
  if (read) {
    // The NVMe read must land in the pinned copy before the cast reads it; its failure is kept for the
    // acquire that waits for this gather.
    env_.gather_stream->host_fn([read, err] {
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
  char* mine = static_cast<char*>(e.gptr) + (s.route.all_gather ? s.shard.offset : 0) * dtype_bytes(env_.act);
  if (s.nf4)
    dequantize(s, src, e.gptr);
  else
    env_.gather_ops->cast(kernels::Tensor{mine, env_.act, n},
                          kernels::Tensor{const_cast<void*>(src), env_.working_dtype, n});
  if (s.route.all_gather) env_.gather_comm->all_gather(mine, e.gptr, n, env_.act, env_.gather_stream.get());
  env_.gather_stream->record(*e.ready);
  e.reader = e.ready.get();
  e.gather = Gather::in_flight;
  ++transfers_.gathers;
  transfers_.gather_bytes += env_.param_bytes(s);
  return true;
}

// Note [NF4 base] in model/nf4_chunk.h: the packed parts into the gathered chunk, in the ops' activation
// dtype, on the gather stream, read where the bytes are (device or pinned memory): 4 bits a quantised
// parameter cross the link.
void ChunkCache::dequantize(const ChunkSlot& s, const void* packed, void* gathered) {
  const auto* src = static_cast<const char*>(packed);
  const std::size_t act = std::size_t(dtype_bytes(env_.act));
  for (std::size_t i = 0; i < s.nf4->parts.size(); ++i) {
    const model::Nf4Part& p = s.nf4->parts[i];
    const kernels::Tensor out{static_cast<char*>(gathered) + p.at * act, env_.act, p.numel};
    switch (p.kind) {
      case model::Nf4Part::Kind::zero:
        env_.gather_ops->zero(out);
        break;
      case model::Nf4Part::Kind::raw:
        env_.gather_ops->cast(out, kernels::Tensor{const_cast<char*>(src + p.data), s.nf4->raw, p.numel});
        break;
      case model::Nf4Part::Kind::nf4:
        env_.gather_ops->dequantize_nf4(out, kernels::Nf4Blocks{.codes = src + p.data,
                                                                .absmax = src + p.absmax,
                                                                .absmax2 = src + p.absmax2,
                                                                .offset = s.nf4_offsets[i],
                                                                .double_quant = s.nf4->double_quant,
                                                                .blocksize = s.nf4->blocksize});
        break;
    }
  }
}

void ChunkCache::finish_fetch(int c) {
  const ChunkSlot& s = slot(c);
  CacheEntry& e = entries_[std::size_t(c)];
  e.gather = Gather::ready;
  if (e.counts_nvme_read) {
    --nvme_param_reads_;
    e.counts_nvme_read = false;
  }
  if (e.pins_param) {
    env_.tm->unpin(s.tensors.param);
    e.pins_param = false;
    // The pinned copy stays as a cache, least recently used first out, within plan.param_cache elements.
    auto it = std::find(param_cache_.begin(), param_cache_.end(), c);
    if (it == param_cache_.end())
      param_cache_numel_ += cache_numel(s);
    else
      param_cache_.erase(it);
    param_cache_.push_back(c);
    trim_param_cache();
  }
  if (e.error) {
    std::exception_ptr err = e.error;
    e.error = nullptr;
    drop_gathered(c);
    std::rethrow_exception(err);
  }
}

void ChunkCache::trim_param_cache() {
  const std::uint64_t limit = env_.plan.param_cache;
  while (param_cache_numel_ > limit && !param_cache_.empty()) {
    const int old = param_cache_.front();
    if (entries_[std::size_t(old)].pins_param) break;  // its gather is still reading the pinned copy
    param_cache_.pop_front();
    param_cache_numel_ -= cache_numel(slot(old));
    // A valid NVMe copy exists: just dropped.
    env_.tm->evict(slot(old).tensors.param, Tier::pinned, Tier::nvme);
  }
}

void ChunkCache::wait_fetch(int c) {
  CacheEntry& e = entries_[std::size_t(c)];
  STRATA_CHECK(e.gather == Gather::in_flight, "zero3: wait for chunk ", slot(c).name,
               " with no gather in flight");
  // Note [Gather]: the compute stream waits for the gather; the host waits only where it reads, for a
  // gather from an NVMe home (its read's outcome, and the pinned copy it unpins).
  if (e.pins_param) {
    e.ready->synchronize();
    ++transfers_.gather_host_waits;
  } else {
    env_.compute_stream->wait(*e.ready);
  }
  finish_fetch(c);
}

void ChunkCache::drop_gathered(int c) {
  CacheEntry& e = entries_[std::size_t(c)];
  // A gather from NVMe still in flight holds a read buffer and a pin: the host settles it first.
  if (e.gather == Gather::in_flight && e.pins_param) e.ready->synchronize(), finish_fetch(c);
  // Never marked valid on the device (nothing moves it), so this frees the block without a copy — once its
  // last reader is done: the compute stream's ops enqueued before its release (which waited for the
  // gather), or the gather itself when no acquire came.
  if (e.gptr) env_.tm->evict(e.gathered, Tier::device, Tier::pinned, e.reader);
  e.gptr = nullptr;
  e.reader = nullptr;
  e.gather = Gather::absent;
}

void ChunkCache::drop_all_gathered() {
  for (int c = 0; c < int(entries_.size()); ++c) {
    const Gather g = entries_[std::size_t(c)].gather;
    STRATA_CHECK(g != Gather::held, "zero3: chunk ", slot(c).name, " is still held at the optimizer step");
    if (g != Gather::absent) drop_gathered(c);
  }
}

void ChunkCache::all_gather_params() {
  for (const ChunkSlot& s : env_.slots)
    if (s.route.trains)  // a frozen chunk's never change
      env_.gather_comm->all_gather(env_.my_params(s), s.param_home, s.shard.numel, env_.working_dtype,
                                   env_.gather_stream.get());
}

void ChunkCache::params_written(const ChunkSlot& s, std::vector<tiering::Move>& writes) {
  env_.tm->mark_written(s.tensors.param, Tier::pinned);
  env_.tm->unpin(s.tensors.param);
  auto it = std::find(param_cache_.begin(), param_cache_.end(), s.id);
  const bool cached = it != param_cache_.end();
  if (cached) param_cache_.erase(it);
  const std::uint64_t others = param_cache_numel_ - (cached ? cache_numel(s) : 0);
  if (others + cache_numel(s) <= env_.plan.param_cache) {
    writes.push_back(
        env_.tm->fetch(s.tensors.param, Tier::nvme));  // write through; the pinned copy stays a cache
    param_cache_.push_back(s.id);
    param_cache_numel_ = others + cache_numel(s);
  } else {
    writes.push_back(env_.tm->evict(s.tensors.param, Tier::pinned, Tier::nvme));
    param_cache_numel_ = others;
  }
}

// --------------------------------------------------------------------------------- ChunkProvider

model::ChunkView ChunkCache::acquire(int c) {
  STRATA_CHECK(c >= 0 && c < int(entries_.size()), "zero3: chunk ", c, " does not exist");
  CacheEntry& e = entries_[std::size_t(c)];
  STRATA_CHECK(e.gather != Gather::held, "zero3: chunk ", slot(c).name, " acquired while already held");
  // A forward outside a training pass (an evaluation, even between the last backward and step()) sees
  // the last step's weights: the early updates are undone first (Note [Optimizer overlap]).
  if (!in_pass_) gate_.undo(UndoAs::cancellation);
  const WaitTimer t0(*env_.compute_stream);
  // While the prefetcher makes c resident and then starts the fetches after it, c must not be chosen to
  // make room for them.
  acquiring_ = c;
  try {
    if (in_pass_) {
      pf_->acquire(c);
    } else {  // outside training (weight export): on demand
      if (residency(c) == prefetch::Residency::absent) start_fetch(c, true);
      if (e.gather == Gather::in_flight) wait_fetch(c);
    }
  } catch (...) {
    acquiring_ = -1;
    throw;
  }
  acquiring_ = -1;
  wait_ += t0.idle_seconds();
  STRATA_CHECK(e.gather == Gather::ready && e.gptr, "zero3: chunk ", slot(c).name,
               " is not resident after acquire");
  e.gather = Gather::held;
  e.last_use = ++use_clock_;
  return model::ChunkView{&env_.layout.chunk(c), e.gptr, env_.act};
}

void ChunkCache::release(int c) {
  const ChunkSlot& s = slot(c);
  CacheEntry& e = entries_[std::size_t(c)];
  STRATA_CHECK(e.gather == Gather::held, "zero3: chunk ", s.name, " released but not held");
  e.gather = Gather::ready;
  // The last op reading the gathered copy: drop_gathered frees the block after it.
  if (!e.released) e.released = env_.dev->create_event();
  env_.compute_stream->record(*e.released);
  e.reader = e.released.get();
  const bool keep = in_pass_ && (s.persistent || pf_->keep_after_release(c)) &&
                    live_numel() <= env_.cfg.zero_optimization.stage3_max_live_parameters;
  if (!keep) {
    drop_gathered(c);
    return;
  }
  // Kept for reuse, it joins the cache, which must stay within its budget: the chunks used furthest in
  // the future leave first (this one, if its reuse is the furthest).
  fit_cache(0, kAnyCached);
}

}  // namespace strata::zero3
