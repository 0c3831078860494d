// The gradient path (engine_grads.h): the model's gradient buffers, their hand-off to the fp32 shards,
// accumulation and reductions, and the norm step() clips by.
//
// Note [Gradients off the device]: the model adds each chunk's gradients into a buffer zeroed on the
// compute stream (acquire_grads). release_grads hands that buffer to the chunk's fp32 gradient shard:
// copied when the shard is still empty this step, added element by element otherwise — the same
// arithmetic whether the shard is on the device (on the compute stream, after the model's ops) or in
// pinned host memory (the gradient stream waits for the compute stream, copies the buffer off the device,
// through pinned staging and a host add — on the CPU optimizer's threads — when accumulating; a failure
// surfaces at sync()). The buffer is freed after the stream that read it last.
//
// With several micro-batches a step that would cross the host link once per micro-batch and chunk. Where
// the plan has room (MemoryPlan.device_accumulators, zero3/placement.cpp) a chunk gets a device
// accumulator of its shard's size instead: its first hand-off of the step copies the buffer into it and
// later ones add, on the gradient stream — the same copy-then-add sequence in the same order, so the same
// bits — and the accumulator crosses into the (still empty) pinned shard once, at the chunk's final
// hand-off of the step: in the step's last backward, its n-th hand-off where the last complete backward
// made n (expected_; the optimizer overlap starts its update there too). A chunk whose final
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
// Note [Gradients through NVMe]: with offload_optimizer nvme (and strata.nvme_gradients, the default) the
// fp32 gradient shard's home is NVMe, as ZeRO-Infinity swaps gradients with the optimizer state, so that no
// host buffer grows with the model. What would reach the pinned shard — a hand-off, or a device
// accumulator's crossing — is copied off the device into pinned staging (one shard), and a host function
// on the gradient stream (to_nvme) takes it on: into a pinned block of the tier manager's pool (copied
// when the shard is empty this step; else the NVMe copy is read back into the block and the staged
// gradients added, the same one fp32 add per element as the pinned shard's). The training thread has
// already asked the tier manager for the block (and the read) and for its write to NVMe, gated on the
// gradient stream's event after that host function, which frees the block when done: the host function
// touches memory only, since the tier manager may wait for the stream's events under its mutex. At most
// kNvmeGradWindow shards are on their way at once (the oldest write is waited for first), and a chunk's own
// earlier write before its shard is touched again. In the step's last backward the block's squared norm,
// finiteness and (N ranks) per-block partial sums are taken before the write, so stats() needs no second
// read; a chunk without them (a step that came before its configured micro-batches) is read back once there.
// The swap pipeline reads the gradients with the sub-group's master and states (engine_update.cpp, Note [NVMe
// swap pipeline]) and drops the copy after the update. The arithmetic is the pinned shard's, so the same
// losses bit for bit. Gradient accumulation over micro-batches reads and writes each shard once a
// micro-batch where the plan gives no device accumulator; with one, the shard crosses once a step.
//
#include "zero3/engine_grads.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace strata::zero3 {

using detail::cat;

namespace {

// The route's norm is taken on the device by the compute interface (the device optimizer's gradients on a
// device reached by stream work only); the others by the CPU optimizer's reductions.
bool on_device(const UpdateRoute& r) {
  return r.norm == UpdateRoute::Norm::device || r.norm == UpdateRoute::Norm::device_ranks;
}

// dst += src, one fp32 add per element (Ops::add's arithmetic, on the host).
void add_into(float* dst, const float* src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] += src[i];
}

}  // namespace

void GradientPath::add_chunk(const ChunkSlot& s) {
  STRATA_CHECK(std::size_t(s.id) == entries_.size(), "zero3: chunk ", s.name, " added out of order");
  GradEntry& e = entries_.emplace_back();
  if (!s.route.trains) return;  // frozen: no gradients
  e.gradbuf = env_.tm->register_tensor({.name = s.name + ".gradbuf",
                                        .kind = tiering::Kind::grad,
                                        .dtype = DType::fp32,
                                        .bytes = s.numel * sizeof(float),
                                        .home = Tier::device,
                                        .chunk = s.id,
                                        .shard = -1});
  env_.tm->pin(e.gradbuf);
  if (s.accumulates()) {  // its device accumulator (Note [Gradients off the device]), a block while live
    e.accbuf = env_.tm->register_tensor(
        {.name = s.name + ".grad_acc",
         .kind = tiering::Kind::grad,
         .dtype = DType::fp32,
         .bytes = (s.route.grads == UpdateRoute::Grads::local_accumulator ? s.numel : s.shard.numel) *
                  sizeof(float),
         .home = Tier::device,
         .chunk = s.id,
         .shard = -1});  // transient, as the gradient buffer
    env_.tm->pin(e.accbuf);
  }
}

Event& GradientPath::record_handoff(const ChunkSlot& s) {
  GradEntry& e = entries_[std::size_t(s.id)];
  if (!e.handed_off) e.handed_off = env_.dev->create_event();
  env_.grad_stream->record(*e.handed_off);
  return *e.handed_off;
}

Event& GradientPath::computed(const ChunkSlot& s) {
  GradEntry& e = entries_[std::size_t(s.id)];
  if (!e.computed) e.computed = env_.dev->create_event();
  env_.compute_stream->record(*e.computed);
  return *e.computed;
}

void GradientPath::new_step() {
  for (GradEntry& e : entries_) e.grads_fresh = true;
}

void GradientPath::open() {
  const std::size_t C = env_.slots.size();
  expected_.assign(C, 0);
  seen_.assign(C, 0);
  if (std::any_of(env_.slots.begin(), env_.slots.end(),
                  [](const ChunkSlot& s) { return s.route.trains && s.route.grad_shard == Tier::pinned; }))
    staging_ = PinnedBuffer(*env_.dev, env_.largest_shard * sizeof(float));
  if (std::any_of(env_.slots.begin(), env_.slots.end(),
                  [](const ChunkSlot& s) { return s.route.trains && s.route.grads_nvme; }))
    nvme_staging_id_ = env_.tm->register_tensor({.name = "zero3.grad_staging",
                                                 .kind = tiering::Kind::staging,
                                                 .dtype = DType::fp32,
                                                 .bytes = env_.largest_shard * sizeof(float),
                                                 .home = Tier::pinned,
                                                 .chunk = -1,
                                                 .shard = -1});
  out_stats_.assign(C, ShardNorm{});
  if (std::any_of(env_.slots.begin(), env_.slots.end(),
                  [](const ChunkSlot& s) { return s.route.trains && on_device(s.route); })) {
    stats_id_ = env_.tm->register_tensor({.name = "zero3.grad_stats",
                                          .kind = tiering::Kind::grad,
                                          .dtype = DType::u8,
                                          .bytes = C * 16,
                                          .home = Tier::device,
                                          .chunk = -1,
                                          .shard = -1});
    stats_ = static_cast<char*>(env_.tm->allocate(stats_id_, Tier::device));
    env_.tm->pin(stats_id_);
  }
}

void GradientPath::begin_backward(const BackwardStart& b) {
  std::fill(seen_.begin(), seen_.end(), 0);
  last_micro_ = b.ends_step;
}

void GradientPath::end_backward() {
  expected_ = seen_;
}

float* GradientPath::acquire_grads(int c) {
  const ChunkSlot& s = env_.slots[std::size_t(c)];
  GradEntry& e = entries_[std::size_t(c)];
  STRATA_CHECK(s.route.trains, "zero3: gradients of chunk ", s.name, " asked for, but it is frozen");
  STRATA_CHECK(e.gbuf == nullptr, "zero3: gradients of chunk ", s.name, " acquired while held");
  e.gbuf = static_cast<float*>(room_.device_alloc(e.gradbuf, AllocFor::demand));
  env_.ops->zero(
      kernels::Tensor{e.gbuf, DType::fp32, s.numel});  // on the compute stream, before the model's ops
  return e.gbuf;
}

void GradientPath::release_grads(int c) {
  const ChunkSlot& s = env_.slots[std::size_t(c)];
  GradEntry& e = entries_[std::size_t(c)];
  STRATA_CHECK(e.gbuf != nullptr, "zero3: gradients of chunk ", s.name, " released but not held");
  gate_.settle(c);  // the last step's update of this chunk, left to the worker, reads its gradients
  if (env_.opts.testing.gradient_hook) {
    STRATA_CHECK(env_.dev->caps().host_addressable,
                 "zero3: EngineOptions.testing.gradient_hook needs addressable memory");
    env_.compute_stream->synchronize();
    env_.opts.testing.gradient_hook(c, e.gbuf, s.numel);
  }
  ++seen_[std::size_t(c)];
  const bool final = final_handoff(s);
  if (s.route.reduce != UpdateRoute::Reduce::none) env_.grad_stream->wait(computed(s));
  if (s.route.grads == UpdateRoute::Grads::local_accumulator) {
    // Note [Stage 1 accumulates locally]: summed here, reduced once, at the final hand-off.
    const kernels::Tensor g{e.gbuf, DType::fp32, s.numel};
    if (e.acc) {
      env_.grad_ops->add(kernels::Tensor{e.acc, DType::fp32, s.numel}, g);
    } else {
      e.acc = static_cast<float*>(room_.device_alloc(e.accbuf, AllocFor::demand));
      env_.grad_ops->cast(kernels::Tensor{e.acc, DType::fp32, s.numel}, g);
    }
    env_.tm->evict(e.gradbuf, Tier::device, Tier::pinned, &record_handoff(s));  // frees the block once read
    e.gbuf = nullptr;
    if (final) flush_local_accumulator(s);
    gate_.handed_off(s, handoff_stream(s), seen_[std::size_t(c)], expected_[std::size_t(c)]);
    return;
  }
  // This rank's slice of the buffer: with N ranks, the sum over ranks left there by the reduce-scatter
  // (in place, on the gradient stream once the model's ops are done); with one, the whole buffer.
  if (s.route.reduce == UpdateRoute::Reduce::every_handoff) reduce_scatter(s, e.gbuf);
  float* buffer = e.gbuf;
  e.gbuf = nullptr;
  hand_to_shard(s, buffer + s.shard.offset, e.gradbuf, final);
  gate_.handed_off(s, handoff_stream(s), seen_[std::size_t(c)], expected_[std::size_t(c)]);
}

void GradientPath::reduce_scatter(const ChunkSlot& s, float* whole) {
  env_.grad_comm->reduce_scatter(whole, whole + s.shard.offset, s.shard.numel, DType::fp32,
                                 comm::ReduceOp::sum, env_.grad_stream.get());
  ++transfers_.grad_reductions;
  transfers_.grad_reduction_bytes += s.numel * sizeof(float);
}

void GradientPath::flush_local_accumulator(const ChunkSlot& s) {
  GradEntry& e = entries_[std::size_t(s.id)];
  reduce_scatter(s, e.acc);
  float* acc = e.acc;
  e.acc = nullptr;
  hand_to_shard(s, acc + s.shard.offset, e.accbuf, /*final=*/true);
}

void GradientPath::hand_to_shard(const ChunkSlot& s, const float* src, tiering::TensorId buffer, bool final) {
  GradEntry& e = entries_[std::size_t(s.id)];
  const std::size_t n = s.shard.numel;
  const bool fresh = e.grads_fresh;
  e.grads_fresh = false;
  ++transfers_.grad_handoffs;
  transfers_.grad_bytes += n * sizeof(float);
  const kernels::Tensor from{const_cast<float*>(src), DType::fp32, n};
  if (s.route.grad_shard == Tier::device) {
    // Copied into the empty shard or added to it: with one rank on the compute stream after the model's
    // ops; with N on the gradient stream after the reduce-scatter (the route's hand-off stream). The block
    // is freed after that stream.
    const bool on_grad_stream = s.route.handoff == UpdateRoute::Handoff::grad_stream;
    kernels::Ops& o = on_grad_stream ? *env_.grad_ops : *env_.ops;
    const kernels::Tensor to{s.grad, DType::fp32, n};
    if (fresh)
      o.cast(to, from);
    else
      o.add(to, from);
    const Event* after = nullptr;
    if (on_grad_stream) {
      after = &record_handoff(s);
    } else {
      after = &computed(s);
    }
    env_.tm->evict(buffer, Tier::device, Tier::pinned, after);  // frees the block (never valid: no copy)
  } else {
    // Once the model's ops are done (a reduction waited for them already).
    if (s.route.reduce == UpdateRoute::Reduce::none) env_.grad_stream->wait(computed(s));
    if (s.route.grads == UpdateRoute::Grads::device_accumulator && (e.acc || (fresh && !final))) {
      // Summed on the device (the same copy-then-add as below), and across to the shard once, at the
      // chunk's final hand-off of the step (or when the step's last backward ends).
      const kernels::Tensor acc_t{e.acc, DType::fp32, n};
      if (e.acc) {
        env_.grad_ops->add(acc_t, from);
      } else {
        e.acc = static_cast<float*>(room_.device_alloc(e.accbuf, AllocFor::demand));
        env_.grad_ops->cast(kernels::Tensor{e.acc, DType::fp32, n}, from);
      }
      if (final) flush_accumulator(s);
    } else if (s.route.grads_nvme) {  // Note [Gradients through NVMe]
      stage_for_nvme(s, src, fresh, last_micro_);
    } else {
      // The gradient stream copies the buffer off the device: straight into the pinned shard when it is
      // empty this step, else into pinned staging and adds it on the host on the CPU optimizer's threads
      // (the same arithmetic as the device-home path: a copy, or one fp32 add per element).
      float* dst = s.grad;
      if (fresh) {
        env_.grad_stream->copy_async(dst, src, n * sizeof(float), CopyKind::device_to_host);
      } else {
        float* staged = static_cast<float*>(staging_.data());
        env_.grad_stream->copy_async(staged, src, n * sizeof(float), CopyKind::device_to_host);
        env_.grad_stream->host_fn([this, dst, staged, n] { add_on_host(dst, staged, n); });
      }
      ++transfers_.grad_offloads;
      transfers_.grad_offload_bytes += n * sizeof(float);
    }
    env_.tm->evict(buffer, Tier::device, Tier::pinned, &record_handoff(s));  // reused once read
  }
}

void GradientPath::flush_accumulator(const ChunkSlot& s) {
  GradEntry& e = entries_[std::size_t(s.id)];
  const std::size_t n = s.shard.numel;
  if (s.route.grads_nvme) {
    // The step's sum: crossing at the final hand-off, when the last backward ends, or when step() comes.
    stage_for_nvme(s, e.acc, /*fresh=*/true, /*with_stats=*/true);
  } else {
    env_.grad_stream->copy_async(s.grad, e.acc, n * sizeof(float), CopyKind::device_to_host);
    ++transfers_.grad_offloads;
    transfers_.grad_offload_bytes += n * sizeof(float);
  }
  env_.tm->evict(e.accbuf, Tier::device, Tier::pinned, &record_handoff(s));  // frees the block after the copy
  e.acc = nullptr;
}

void GradientPath::stage_for_nvme(const ChunkSlot& s, const float* src, bool fresh, bool with_stats) {
  tiering::TierManager& tm = *env_.tm;
  const std::size_t n = s.shard.numel;
  // The window, and this chunk's own earlier write done before its shard is touched again.
  auto own_write = [&] {
    return std::any_of(nvme_writes_.begin(), nvme_writes_.end(),
                       [&](const NvmeWrite& w) { return w.chunk == s.id; });
  };
  if (!nvme_writes_.empty() && (nvme_writes_.size() >= kNvmeGradWindow || own_write())) {
    const WaitTimer tw(*env_.compute_stream);
    while (!nvme_writes_.empty() && (nvme_writes_.size() >= kNvmeGradWindow || own_write()))
      finish_oldest_write();
    wait_ += tw.idle_seconds();
  }
  // The shard's pinned block: empty this step, or the NVMe copy read back into it to add to.
  tm.pin(s.tensors.grad);
  tiering::Move read;
  float* dst = nullptr;
  if (fresh) {
    dst = static_cast<float*>(tm.allocate(s.tensors.grad, Tier::pinned));
  } else {
    read = tm.fetch(s.tensors.grad, Tier::pinned);
    dst = static_cast<float*>(tm.data(s.tensors.grad, Tier::pinned));
  }
  // The gradient stream copies the gradients off the device into staging and (to_nvme) into the block. The
  // stream runs in order: the next copy into staging waits for this host function to have read it. The
  // host function touches memory only: the tier manager may wait for this stream's events under its
  // mutex, so nothing on the stream may take it.
  float* staged = nvme_staging();
  env_.grad_stream->copy_async(staged, src, n * sizeof(float), CopyKind::device_to_host);
  env_.grad_stream->host_fn([this, &s, dst, staged, fresh, with_stats, read] {
    read.wait();  // the NVMe copy is in the block (raises a failed read)
    to_nvme(s, dst, staged, fresh, with_stats);
  });
  const Event& written = record_handoff(s);
  // The write to NVMe, gated by the tier manager on that event; the block is freed once written.
  try {
    tm.mark_written(s.tensors.grad, Tier::pinned);
    tm.unpin(s.tensors.grad);
    nvme_writes_.push_back({s.id, tm.evict(s.tensors.grad, Tier::pinned, Tier::nvme, &written)});
  } catch (const OutOfMemory& err) {
    throw OutOfMemory(write_context(s.id) + err.what());
  }
  ++transfers_.grad_offloads;
  transfers_.grad_offload_bytes += n * sizeof(float);
  ++transfers_.grad_nvme_writes;
  transfers_.grad_nvme_write_bytes += n * sizeof(float);
  if (!fresh) {
    ++transfers_.grad_nvme_reads;
    transfers_.grad_nvme_read_bytes += n * sizeof(float);
  }
}

void GradientPath::to_nvme(const ChunkSlot& s, float* dst, const float* staged, bool fresh, bool with_stats) {
  const std::size_t n = s.shard.numel;
  if (fresh)
    env_.opt->for_each_range(n, [dst, staged](std::size_t i0, std::size_t i1) {
      std::memcpy(dst + i0, staged + i0, (i1 - i0) * sizeof(float));
    });
  else
    add_on_host(dst, staged, n);
  out_stats_[std::size_t(s.id)] = with_stats ? shard_norm(s.route, *env_.opt, dst, n) : ShardNorm{};
}

void GradientPath::drain_nvme_writes() {
  while (!nvme_writes_.empty()) finish_oldest_write();
}

float* GradientPath::nvme_staging() {
  if (!nvme_staged_) {
    nvme_staged_ = static_cast<float*>(env_.tm->allocate(nvme_staging_id_, Tier::pinned));
    env_.tm->pin(nvme_staging_id_);
  }
  return nvme_staged_;
}

void GradientPath::release_nvme_staging() {
  if (!nvme_staged_) return;
  // Never marked written: the evict frees the block without a copy. The gradient stream, its last
  // reader, is synchronised.
  env_.tm->unpin(nvme_staging_id_);
  env_.tm->evict(nvme_staging_id_, Tier::pinned, Tier::nvme);
  nvme_staged_ = nullptr;
}

void GradientPath::finish_oldest_write() {
  const NvmeWrite w = nvme_writes_.front();
  nvme_writes_.pop_front();
  try {
    w.move.wait();
  } catch (const OutOfMemory& err) {
    throw OutOfMemory(write_context(w.chunk) + err.what());
  } catch (const IoError& err) {  // a full disk without preallocation fails here (ENOSPC, EFBIG)
    throw IoError(write_context(w.chunk) + err.what());
  }
}

std::string GradientPath::write_context(int chunk) const {
  const ChunkSlot& s = env_.slots[std::size_t(chunk)];
  return cat("writing the fp32 gradients of chunk ", s.name, " (", s.shard.numel * sizeof(float),
             " bytes) to NVMe: ");
}

void GradientPath::flush_accumulators() {
  for (const ChunkSlot& s : env_.slots)
    if (entries_[std::size_t(s.id)].acc)
      s.route.grads == UpdateRoute::Grads::local_accumulator ? flush_local_accumulator(s)
                                                             : flush_accumulator(s);
}

void GradientPath::add_on_host(float* dst, const float* src, std::size_t n) {
  env_.opt->for_each_range(
      n, [dst, src](std::size_t i0, std::size_t i1) { add_into(dst + i0, src + i0, i1 - i0); });
}

void GradientPath::sync() {
  flush_accumulators();  // a step before the configured micro-batches were all made
  const WaitTimer t0(*env_.compute_stream);
  env_.compute_stream->synchronize();  // gradients at home on the device are added there
  env_.grad_stream->synchronize();     // raises a failed copy or add of the gradient stream
  drain_nvme_writes();                 // raises a failed write
  release_nvme_staging();
  wait_ += t0.idle_seconds();
}

ShardNorm shard_norm(const UpdateRoute& r, cpu_optim::Optimizer& opt, const float* g, std::size_t n) {
  ShardNorm st;
  st.valid = true;
  if (r.norm == UpdateRoute::Norm::host_blocks) {
    st.blocks = opt.grad_block_sums(g, DType::fp32, n, 1.0f);
    return st;
  }
  const cpu_optim::GradStats x = opt.grad_stats(g, DType::fp32, n, 1.0f);
  st.sum_sq = x.sum_sq;
  st.finite = x.finite;
  return st;
}

void GradientPath::settle_nvme_stats() {
  // Gradients on NVMe: taken on the way out (Note [Gradients through NVMe]), else read back once here.
  for (std::size_t i = 0; i < env_.slots.size(); ++i) {
    const ChunkSlot& s = env_.slots[i];
    if (!s.route.grads_nvme) continue;
    if (entries_[i].grads_fresh) {  // no gradients reached this chunk this step: zeros for the update
      tiering::TierManager& tm = *env_.tm;
      tm.pin(s.tensors.grad);
      float* g = static_cast<float*>(tm.allocate(s.tensors.grad, Tier::pinned));
      std::memset(g, 0, s.shard.numel * sizeof(float));
      out_stats_[i] = shard_norm(s.route, *env_.opt, g, s.shard.numel);
      tm.mark_written(s.tensors.grad, Tier::pinned);
      tm.unpin(s.tensors.grad);
      tm.evict(s.tensors.grad, Tier::pinned, Tier::nvme).wait();
    } else if (!out_stats_[i].valid) {
      env_.with_host_copy(s.tensors.grad, [&](const void* g) {
        out_stats_[i] = shard_norm(s.route, *env_.opt, static_cast<const float*>(g), s.shard.numel);
      });
    }
  }
}

const ShardNorm* GradientPath::taken_norm(std::size_t i) const {
  if (env_.slots[i].route.grads_nvme) return &out_stats_[i];  // on the way out, or read back
  return gate_.early_stats(i);  // taken by the overlap's worker from the final gradients
}

void GradientPath::sum_block_norms(double& sum_sq, bool& finite) {
  // Each rank's per-block partial sums, all-gathered: chunk c's norm is its blocks' partials added in
  // global block order — rank 0's shard, then rank 1's, ... — the same additions one rank makes over the
  // whole chunk (shards are whole blocks: the layout's chunk_multiple). So the norm, the clipping and the
  // step are those of one rank, bit for bit.
  auto summed = [&](const ChunkSlot& s) {
    return s.route.trains && s.route.norm == UpdateRoute::Norm::host_blocks &&
           (s.route.grads_nvme || !entries_[std::size_t(s.id)].grads_fresh);
  };
  const std::size_t per_shard =
      (env_.largest_shard + cpu_optim::kGradStatsBlock - 1) / cpu_optim::kGradStatsBlock;
  std::vector<double> mine(env_.slots.size() * per_shard, 0.0);
  for (std::size_t i = 0; i < env_.slots.size(); ++i) {
    const ChunkSlot& s = env_.slots[i];
    if (!summed(s)) continue;  // zeroed (its partials are 0), or reduced on the device
    const ShardNorm* taken = taken_norm(i);
    const std::vector<double> b =
        taken ? taken->blocks : shard_norm(s.route, *env_.opt, s.grad, s.shard.numel).blocks;
    std::copy(b.begin(), b.end(), mine.begin() + std::ptrdiff_t(i * per_shard));
  }
  const int world = env_.comm->world_size();
  std::vector<double> all(mine.size() * std::size_t(world));
  env_.comm->host_all_gather(mine.data(), all.data(), mine.size() * sizeof(double));  // host memory
  for (std::size_t i = 0; i < env_.slots.size(); ++i) {
    if (!summed(env_.slots[i])) continue;
    const std::size_t blocks =
        (env_.slots[i].shard.numel + cpu_optim::kGradStatsBlock - 1) / cpu_optim::kGradStatsBlock;
    double chunk = 0.0;
    for (int r = 0; r < world; ++r)
      for (std::size_t b = 0; b < blocks; ++b) chunk += all[std::size_t(r) * mine.size() + i * per_shard + b];
    sum_sq += chunk;
    finite = finite && std::isfinite(chunk);
  }
}

void GradientPath::sum_device_norms(double& sum_sq, bool& finite) {
  std::vector<char> host(env_.slots.size() * 16);
  env_.from_device(host.data(), stats_, host.size());
  double dev_sq = 0;
  bool dev_finite = true, over_ranks = false;
  for (std::size_t i = 0; i < env_.slots.size(); ++i) {
    const ChunkSlot& s = env_.slots[i];
    if (!s.route.trains || !on_device(s.route)) continue;
    over_ranks = over_ranks || s.route.norm == UpdateRoute::Norm::device_ranks;  // every rank alike
    if (entries_[i].grads_fresh) continue;
    double sq;
    std::int32_t bad;
    std::memcpy(&sq, host.data() + 16 * i, sizeof sq);
    std::memcpy(&bad, host.data() + 16 * i + 8, sizeof bad);
    dev_sq += sq;
    dev_finite = dev_finite && bad == 0;
  }
  if (over_ranks) {  // the device reductions' sums of each rank's shards (not the one-rank bits)
    dev_sq = env_.comm->all_reduce_sum(dev_sq);
    dev_finite = env_.comm->all_reduce_and(dev_finite);
  }
  sum_sq += dev_sq;
  finite = finite && dev_finite;
}

void GradientPath::stats(double& sum_sq, bool& finite) {
  using kernels::Tensor;
  settle_nvme_stats();
  // In chunk order: one rank's host shards summed here; the device's reduced there and read back below,
  // all at once; N ranks' host shards by their blocks' partials below.
  bool any_device = false, any_blocks = false;
  for (std::size_t i = 0; i < env_.slots.size(); ++i) {
    const ChunkSlot& s = env_.slots[i];
    if (!s.route.trains) continue;  // frozen: no gradients
    const UpdateRoute::Norm norm = s.route.norm;
    any_device = any_device || on_device(s.route);
    any_blocks = any_blocks || norm == UpdateRoute::Norm::host_blocks;
    const Tensor g{s.grad, DType::fp32, s.shard.numel};
    if (entries_[i].grads_fresh && !s.route.grads_nvme) {  // no gradients reached this chunk this step
      if (on_device(s.route))
        env_.ops->zero(g);
      else
        std::memset(s.grad, 0, s.shard.numel * sizeof(float));
      continue;
    }
    if (on_device(s.route)) {  // on the compute stream, after the gradient adds
      env_.ops->squared_norm(Tensor{stats_ + 16 * i, DType::u8, 8}, g);
      env_.ops->nonfinite_check(Tensor{stats_ + 16 * i + 8, DType::i32, 1}, g);
      continue;
    }
    if (norm == UpdateRoute::Norm::host_blocks) continue;  // below: the partials of every rank's shard
    const ShardNorm* taken = taken_norm(i);
    const ShardNorm st = taken ? *taken : shard_norm(s.route, *env_.opt, s.grad, s.shard.numel);
    sum_sq += st.sum_sq;
    finite = finite && st.finite;
  }
  if (any_blocks) sum_block_norms(sum_sq, finite);
  if (any_device) sum_device_norms(sum_sq, finite);
  for (GradEntry& e : entries_) e.grads_fresh = false;
  for (ShardNorm& st : out_stats_) st = ShardNorm{};
}

}  // namespace strata::zero3
