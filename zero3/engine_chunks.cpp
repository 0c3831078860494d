// Chunks on the device: gathering working params (prefetched or on demand), keeping or dropping them on
// release, device room, and the gradient path off the device.
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
//      cache afterwards while the cached elements stay within offload_param.max_in_cpu);
//   3. on the gather stream: a host function waits for that read (NVMe only), then the compute
//      interface casts the source into the gathered block in the ops' activation dtype, and the stream
//      records the chunk's `ready` event.
// acquire() makes the compute stream wait on `ready` (through the prefetcher, which counts the chunk as
// late): the host does not wait, so the model's ops for the chunk are enqueued while its gather runs. A
// gather from an NVMe home is the exception: the host waits for it, since it must know the read landed
// (a failed read is stored in the slot and raised by that acquire) before it unpins the pinned copy.
//
// Note [Gradients off the device]: the model adds each chunk's gradients into a buffer zeroed on the
// compute stream (acquire_grads). release_grads hands that buffer to the chunk's fp32 gradient shard:
// copied when the shard is still empty this step, added element by element otherwise — the same
// arithmetic whether the shard is on the device (on the compute stream, after the model's ops) or in
// pinned host memory (the gradient stream waits for the compute stream, copies the buffer off the device,
// through pinned staging and a host add — on the CPU optimizer's threads — when accumulating; a failure
// surfaces at sync_grads). The buffer is freed after the stream that read it last.
//
// With several micro-batches a step that would cross the host link once per micro-batch and chunk. Where
// the plan has room (MemoryPlan.device_accumulators, zero3/placement.cpp) a chunk gets a device
// accumulator of its shard's size instead: its first hand-off of the step copies the buffer into it and
// later ones add, on the gradient stream — the same copy-then-add sequence in the same order, so the same
// bits — and the accumulator crosses into the (still empty) pinned shard once, at the chunk's final
// hand-off of the step: in the step's last backward, its n-th hand-off where the last complete backward
// made n (handoffs_expected; the optimizer overlap starts its update there too). A chunk whose final
// hand-off cannot be told (the first step) crosses when that backward ends, and one still accumulating
// when step() comes early crosses then. A hand-off after the crossing (a backward shaped differently)
// takes the host path above, adding to what crossed: the sum is still the same sequence of fp32 adds.
// The accumulator is a device block from the first hand-off to the crossing.
//
// Note [Stage 1 accumulates locally]: at stage 1 (several ranks, gradients not partitioned, as DeepSpeed's
// stage 1) a chunk with a device accumulator keeps its whole unreduced gradient there across the step's
// micro-batches — the first hand-off copies the buffer in, later ones add — and is reduce-scattered once,
// at its final hand-off (or when the step's last backward ends, or step() comes early), its slice then
// handed to the shard as a hand-off of one micro-batch is. One reduction a step instead of one a
// micro-batch, and a reduce-scatter (each rank keeps only its slice) rather than an all-reduce: with
// accumulation k, 1/(2k) of the gradient traffic. The plan gives whole-chunk accumulators (4 bytes an
// element of the chunk) chunk by chunk while the device has room (MemoryPlan.device_accumulators); a chunk
// without one is reduce-scattered at every hand-off, as stage 2's. The sums differ from stage 2's in order
// (each rank's micro-batches first, then the ranks), so stage 1 and 2 agree to rounding, not bit for bit,
// when accumulating.
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
#include <algorithm>
#include <limits>

#include "core/log.h"
#include "zero3/engine_impl.h"

namespace strata::zero3 {
namespace {

using detail::cat;

// dst += src, one fp32 add per element (Ops::add's arithmetic, on the host).
void add_into(float* dst, const float* src, std::size_t n) {
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
      // With N ranks the answer must not depend on timing (Note [Ranks]): a gather stays in flight until
      // its acquire (or drop) waits for it.
      if (world > 1 || !s.ready->query()) return prefetch::Residency::in_flight;
      finish_fetch(s);
      return prefetch::Residency::resident;
    default:
      return prefetch::Residency::resident;
  }
}

bool Engine::Impl::cached(const ChunkSlot& s) const {
  return s.id != acquiring && (s.g == ChunkSlot::Gather::ready || s.g == ChunkSlot::Gather::in_flight);
}

std::uint64_t Engine::Impl::cache_bytes() const {
  std::uint64_t b = 0;
  for (const ChunkSlot& s : slots)
    if (cached(s)) b += s.gather_block;
  return b;
}

std::int64_t Engine::Impl::next_use(const ChunkSlot& s) const {
  return in_pass ? pf->upcoming(s.id) : -1;
}

ChunkSlot* Engine::Impl::victim(std::int64_t for_position) {
  constexpr std::int64_t never = std::numeric_limits<std::int64_t>::max();
  ChunkSlot* best = nullptr;
  std::int64_t best_next = 0;
  for (ChunkSlot& s : slots) {
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

bool Engine::Impl::fit_cache(std::uint64_t more, std::int64_t for_position) {
  if (more > plan.device_cache) return false;
  std::uint64_t bytes = cache_bytes();
  while (bytes + more > plan.device_cache) {
    ChunkSlot* v = victim(for_position);
    if (!v) return false;
    bytes -= v->gather_block;
    drop_gathered(*v);
  }
  return true;
}

void* Engine::Impl::device_alloc(tiering::TensorId id, bool demand) {
  for (;;) {
    try {
      return tm->allocate(id, Tier::device);
    } catch (const OutOfMemory&) {
      // A prefetch never takes room from the cache's budget that is not there; a demand (the chunk being
      // acquired, a gradient buffer) may take the whole cache. With none left, the model holds more at
      // once than the plan's working set.
      if (!demand) return nullptr;
      ChunkSlot* v = victim(-1);
      if (!v) throw;
      drop_gathered(*v);
    }
  }
}

bool Engine::Impl::start_fetch(int c, bool demand) {
  ChunkSlot& s = slots[std::size_t(c)];
  STRATA_CHECK(s.g == ChunkSlot::Gather::absent, "zero3: chunk ", s.name, " gathered twice");
  overlap_settle(c);  // the last step's update of this chunk, left to the worker, writes its params
  const bool from_nvme = homes.param == Tier::nvme;
  const auto& z = cfg.zero_optimization;
  if (from_nvme && !demand && nvme_param_reads >= z.offload_param.buffer_count) {
    // Is the pinned copy cached? Then no read buffer is needed.
    if (!tiering::has(tm->info(s.t.param).valid, Tier::pinned)) return false;
  }
  // A prefetch goes into the cache: it must fit the cache's budget, making room only by dropping chunks
  // used after it. A demand fetch is for a chunk about to be held (the working set).
  if (!demand && !fit_cache(s.gather_block, std::max<std::int64_t>(0, next_use(s)))) return false;
  void* g = device_alloc(s.gathered, demand);
  if (!g) return false;
  s.gptr = g;

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
  const std::size_t n = param_numel(s);  // replicated (stages 1 and 2): the whole chunk, no all-gather
  std::exception_ptr* err = &s.error;
  if (read) {
    // The NVMe read must land in the pinned copy before the cast reads it; its failure is kept for the
    // acquire that waits for this gather.
    gather_stream->host_fn([read, err] {
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
  char* mine = static_cast<char*>(s.gptr) + (replicated ? 0 : s.shard.offset) * dtype_bytes(act);
  gather_ops->cast(kernels::Tensor{mine, act, n}, kernels::Tensor{const_cast<void*>(src), wd, n});
  if (world > 1 && !replicated) gather_comm->all_gather(mine, s.gptr, n, act, gather_stream.get());
  gather_stream->record(*s.ready);
  s.reader = s.ready.get();
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
  // Note [Gather]: the compute stream waits for the gather; the host waits only where it reads, for a
  // gather from an NVMe home (its read's outcome, and the pinned copy it unpins).
  if (s.pins_param) {
    s.ready->synchronize();
    ++transfers.gather_host_waits;
  } else {
    compute_stream->wait(*s.ready);
  }
  finish_fetch(s);
}

void Engine::Impl::drop_gathered(ChunkSlot& s) {
  // A gather from NVMe still in flight holds a read buffer and a pin: the host settles it first.
  if (s.g == ChunkSlot::Gather::in_flight && s.pins_param) s.ready->synchronize(), finish_fetch(s);
  // Never marked valid on the device (nothing moves it), so this frees the block without a copy — once its
  // last reader is done: the compute stream's ops enqueued before its release (which waited for the
  // gather), or the gather itself when no acquire came.
  if (s.gptr) tm->evict(s.gathered, Tier::device, Tier::pinned, s.reader);
  s.gptr = nullptr;
  s.reader = nullptr;
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
  // A forward outside a training pass (an evaluation, even between the last backward and step()) sees
  // the last step's weights: the early updates are undone first (Note [Optimizer overlap]).
  if (!in_pass) overlap_undo(false);
  const WaitTimer t0(*compute_stream);
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
  times.wait += t0.idle_seconds();
  STRATA_CHECK(s.g == ChunkSlot::Gather::ready && s.gptr, "zero3: chunk ", s.name,
               " is not resident after acquire");
  s.g = ChunkSlot::Gather::held;
  s.last_use = ++use_clock;
  return model::ChunkView{&layout.chunk(c), static_cast<const float*>(s.gptr), act};
}

void Engine::Impl::release(int c) {
  ChunkSlot& s = slots[std::size_t(c)];
  STRATA_CHECK(s.g == ChunkSlot::Gather::held, "zero3: chunk ", s.name, " released but not held");
  s.g = ChunkSlot::Gather::ready;
  s.reader = &computed(s);  // the last op reading the gathered copy: drop_gathered frees the block after it
  const bool keep = in_pass && (s.persistent || pf->keep_after_release(c)) &&
                    live_numel() <= cfg.zero_optimization.stage3_max_live_parameters;
  if (!keep) {
    drop_gathered(s);
    return;
  }
  // Kept for reuse, it joins the cache, which must stay within its budget: the chunks used furthest in
  // the future leave first (this one, if its reuse is the furthest).
  fit_cache(0, -1);
}

float* Engine::Impl::acquire_grads(int c) {
  ChunkSlot& s = slots[std::size_t(c)];
  STRATA_CHECK(s.gbuf == nullptr, "zero3: gradients of chunk ", s.name, " acquired while held");
  s.gbuf = static_cast<float*>(device_alloc(s.gradbuf, true));
  ops->zero(kernels::Tensor{s.gbuf, DType::fp32, s.numel});  // on the compute stream, before the model's ops
  return s.gbuf;
}

void Engine::Impl::release_grads(int c) {
  ChunkSlot& s = slots[std::size_t(c)];
  STRATA_CHECK(s.gbuf != nullptr, "zero3: gradients of chunk ", s.name, " released but not held");
  overlap_settle(c);  // the last step's update of this chunk, left to the worker, reads its gradients
  if (opts.gradient_hook) {
    STRATA_CHECK(dev->caps().host_addressable, "zero3: EngineOptions.gradient_hook needs addressable memory");
    compute_stream->synchronize();
    opts.gradient_hook(c, s.gbuf, s.numel);
  }
  ++handoffs_seen[std::size_t(c)];
  const bool final = final_handoff(s);
  if (s.route.reduce != UpdateRoute::Reduce::none) grad_stream->wait(computed(s));
  if (s.route.grads == UpdateRoute::Grads::local_accumulator) {
    // Note [Stage 1 accumulates locally]: summed here, reduced once, at the final hand-off.
    const kernels::Tensor g{s.gbuf, DType::fp32, s.numel};
    if (s.acc) {
      grad_ops->add(kernels::Tensor{s.acc, DType::fp32, s.numel}, g);
    } else {
      s.acc = static_cast<float*>(device_alloc(s.accbuf, true));
      grad_ops->cast(kernels::Tensor{s.acc, DType::fp32, s.numel}, g);
    }
    if (!s.handed_off) s.handed_off = dev->create_event();
    grad_stream->record(*s.handed_off);
    tm->evict(s.gradbuf, Tier::device, Tier::pinned, s.handed_off.get());  // frees the block once read
    s.gbuf = nullptr;
    if (final) flush_local_accumulator(s);
    overlap_handed_off(s, *grad_stream);
    return;
  }
  // This rank's slice of the buffer: with N ranks, the sum over ranks left there by the reduce-scatter
  // (in place, on the gradient stream once the model's ops are done); with one, the whole buffer.
  if (s.route.reduce == UpdateRoute::Reduce::every_handoff) {
    grad_comm->reduce_scatter(s.gbuf, s.gbuf + s.shard.offset, s.shard.numel, DType::fp32,
                              comm::ReduceOp::sum, grad_stream.get());
    ++transfers.grad_reductions;
    transfers.grad_reduction_bytes += s.numel * sizeof(float);
  }
  float* buffer = s.gbuf;
  s.gbuf = nullptr;
  hand_to_shard(s, buffer + s.shard.offset, s.gradbuf, final);
  // The stream the hand-off ends on: the gradient stream, or the compute stream for one rank's device home.
  overlap_handed_off(s, s.h.grad == Tier::device && world == 1 ? *compute_stream : *grad_stream);
}

void Engine::Impl::flush_local_accumulator(ChunkSlot& s) {
  grad_comm->reduce_scatter(s.acc, s.acc + s.shard.offset, s.shard.numel, DType::fp32, comm::ReduceOp::sum,
                            grad_stream.get());
  ++transfers.grad_reductions;
  transfers.grad_reduction_bytes += s.numel * sizeof(float);
  float* acc = s.acc;
  s.acc = nullptr;
  hand_to_shard(s, acc + s.shard.offset, s.accbuf, true);
}

void Engine::Impl::hand_to_shard(ChunkSlot& s, const float* src, tiering::TensorId buffer, bool final) {
  const std::size_t n = s.shard.numel;
  const bool fresh = s.grads_fresh;
  s.grads_fresh = false;
  ++transfers.grad_handoffs;
  transfers.grad_bytes += n * sizeof(float);
  const kernels::Tensor from{const_cast<float*>(src), DType::fp32, n};
  if (s.h.grad == Tier::device) {
    // Copied into the empty shard or added to it: with one rank on the compute stream after the model's
    // ops; with N on the gradient stream after the reduce-scatter. The block is freed after that stream.
    kernels::Ops& o = world > 1 ? *grad_ops : *ops;
    const kernels::Tensor to{s.grad, DType::fp32, n};
    if (fresh)
      o.cast(to, from);
    else
      o.add(to, from);
    const Event* after = nullptr;
    if (world > 1) {
      if (!s.handed_off) s.handed_off = dev->create_event();
      grad_stream->record(*s.handed_off);
      after = s.handed_off.get();
    } else {
      after = &computed(s);
    }
    tm->evict(buffer, Tier::device, Tier::pinned, after);  // frees the block (never valid: no copy)
  } else {
    if (world == 1) grad_stream->wait(computed(s));
    if (s.route.grads == UpdateRoute::Grads::device_accumulator && (s.acc || (fresh && !final))) {
      // Summed on the device (the same copy-then-add as below), and across to the shard once, at the
      // chunk's final hand-off of the step (or when the step's last backward ends).
      const kernels::Tensor acc_t{s.acc, DType::fp32, n};
      if (s.acc) {
        grad_ops->add(acc_t, from);
      } else {
        s.acc = static_cast<float*>(device_alloc(s.accbuf, true));
        grad_ops->cast(kernels::Tensor{s.acc, DType::fp32, n}, from);
      }
      if (final) flush_accumulator(s);
    } else {
      // The gradient stream copies the buffer off the device: straight into the pinned shard when it is
      // empty this step, else into pinned staging and adds it on the host on the CPU optimizer's threads
      // (the same arithmetic as the device-home path: a copy, or one fp32 add per element).
      float* dst = s.grad;
      if (fresh) {
        grad_stream->copy_async(dst, src, n * sizeof(float), CopyKind::device_to_host);
      } else {
        float* staged = static_cast<float*>(grad_staging.data());
        grad_stream->copy_async(staged, src, n * sizeof(float), CopyKind::device_to_host);
        grad_stream->host_fn([this, dst, staged, n] { add_on_host(dst, staged, n); });
      }
      ++transfers.grad_offloads;
      transfers.grad_offload_bytes += n * sizeof(float);
    }
    if (!s.handed_off) s.handed_off = dev->create_event();
    grad_stream->record(*s.handed_off);
    tm->evict(buffer, Tier::device, Tier::pinned, s.handed_off.get());  // reused once read
  }
}

void Engine::Impl::flush_accumulator(ChunkSlot& s) {
  const std::size_t n = s.shard.numel;
  grad_stream->copy_async(s.grad, s.acc, n * sizeof(float), CopyKind::device_to_host);
  if (!s.handed_off) s.handed_off = dev->create_event();
  grad_stream->record(*s.handed_off);
  tm->evict(s.accbuf, Tier::device, Tier::pinned, s.handed_off.get());  // frees the block after the copy
  s.acc = nullptr;
  ++transfers.grad_offloads;
  transfers.grad_offload_bytes += n * sizeof(float);
}

void Engine::Impl::flush_accumulators() {
  for (ChunkSlot& s : slots)
    if (s.acc)
      s.route.grads == UpdateRoute::Grads::local_accumulator ? flush_local_accumulator(s)
                                                             : flush_accumulator(s);
}

void Engine::Impl::add_on_host(float* dst, const float* src, std::size_t n) {
  opt->for_each_range(n,
                      [dst, src](std::size_t i0, std::size_t i1) { add_into(dst + i0, src + i0, i1 - i0); });
}

void Engine::Impl::sync_grads() {
  flush_accumulators();  // a step before the configured micro-batches were all made
  const WaitTimer t0(*compute_stream);
  compute_stream->synchronize();  // gradients at home on the device are added there
  grad_stream->synchronize();     // raises a failed copy or add of the gradient stream
  times.wait += t0.idle_seconds();
}

Event& Engine::Impl::computed(ChunkSlot& s) {
  if (!s.computed) s.computed = dev->create_event();
  compute_stream->record(*s.computed);
  return *s.computed;
}

}  // namespace strata::zero3
