// The training loop pieces: one micro-batch's forward and backward, and the optimizer step.
//
// Note [The optimizer step]: step() (1) waits for the gradients still travelling off the device, (2) sums
// the squared norm and checks for overflow chunk by chunk (cpu_optim::grad_stats; the sum is all-reduced
// across ranks), (3) lets the loss scaler decide whether the step applies, (4) updates the optimizer
// sub-groups — in place where the master and states live in addressable memory (the device on the host
// backend, or pinned host memory), or through the NVMe swap pipeline — writing the new working params
// to their home, and (5) drops the gathered chunks, now stale.
//
// Note [NVMe swap pipeline]: with offload_optimizer nvme, sub-group i's states (fp32 master and the
// optimizer's moments) are read into pinned memory by the tier manager, updated, marked written and
// evicted back to NVMe (an asynchronous write that frees the pinned blocks when done). pipeline_read
// issues the reads of sub-group i + 1 before updating i; pipeline_write lets the writes of i run while
// i + 1 is updated (otherwise each write is waited for). At most `group_window` = buffer_count / (tensors
// per parameter) sub-groups hold pinned buffers at once; the oldest write is waited for to make room.
//
// Note [Optimizer overlap] (engine_overlap.cpp): with the CPU optimizer, a chunk's update may already have
// been made during backward, assuming the step applies unclipped; step() keeps it when that held and
// undoes it (a rollback) before updating as below when it did not.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "core/log.h"
#include "model/dtype.h"
#include "zero3/engine_impl.h"

namespace strata::zero3 {

using detail::cat;

// ----------------------------------------------------------------------------------------- the update

void Engine::Impl::update_chunk(ChunkSlot& s, float* master, float* m, float* v, void* out, double lr,
                                float factor, std::int64_t step_no, cpu_optim::Optimizer* with) {
  cpu_optim::Optimizer& optimizer = with ? *with : *opt;
  const std::size_t n = s.shard.numel;
  cpu_optim::Shard sh;
  sh.params = master;
  sh.grads = s.grad;
  sh.exp_avg = m;
  sh.exp_avg_sq = v;
  sh.out = wd == DType::fp32 ? nullptr : out;
  sh.n = n;
  sh.out_dtype = wd == DType::fp16 ? DType::fp16 : DType::bf16;
  const OptimizerConfig& o = cfg.optimizer;
  switch (o.type) {
    case OptimizerType::Adam:
    case OptimizerType::AdamW:
      optimizer.adam(s.opt,
                     {.lr = float(lr),
                      .beta1 = float(o.betas[0]),
                      .beta2 = float(o.betas[1]),
                      .eps = float(o.eps),
                      .weight_decay = float(o.weight_decay),
                      .adamw = o.type == OptimizerType::AdamW || o.adam_w_mode,
                      .bias_correction = o.bias_correction},
                     step_no, sh, factor);
      break;
    case OptimizerType::Adagrad:
      optimizer.adagrad(s.opt, {.lr = float(lr), .eps = float(o.eps), .weight_decay = float(o.weight_decay)},
                        step_no, sh, factor);
      break;
    case OptimizerType::Lion:
      optimizer.lion(s.opt,
                     {.lr = float(lr),
                      .beta1 = float(o.betas[0]),
                      .beta2 = float(o.betas[1]),
                      .weight_decay = float(o.weight_decay)},
                     step_no, sh, factor);
      break;
  }
  if (wd == DType::fp32) std::memcpy(out, master, n * sizeof(float));
}

void* Engine::Impl::param_out(ChunkSlot& s) {
  switch (s.route.params) {
    case UpdateRoute::Params::home:  // in place
      return homes.param == Tier::pinned ? s.param_home : my_params(s);
    case UpdateRoute::Params::staged:
      return param_staging.data();
    case UpdateRoute::Params::nvme:
      break;
  }
  tm->pin(s.t.param);
  return tm->allocate(s.t.param, Tier::pinned);
}

void Engine::Impl::param_written(ChunkSlot& s, std::vector<tiering::Move>& writes) {
  if (s.route.params == UpdateRoute::Params::staged) {  // param_staging -> the device home; reused after
    to_device(my_params(s), param_staging.data(), s.shard.numel * wd_bytes());
    return;
  }
  if (s.route.params != UpdateRoute::Params::nvme) return;
  tm->mark_written(s.t.param, Tier::pinned);
  tm->unpin(s.t.param);
  auto it = std::find(param_cache.begin(), param_cache.end(), s.id);
  const bool cached = it != param_cache.end();
  if (cached) param_cache.erase(it);
  const std::uint64_t others = param_cache_numel - (cached ? s.shard.numel : 0);
  if (others + s.shard.numel <= cfg.zero_optimization.offload_param.max_in_cpu) {
    writes.push_back(tm->fetch(s.t.param, Tier::nvme));  // write through; the pinned copy stays a cache
    param_cache.push_back(s.id);
    param_cache_numel = others + s.shard.numel;
  } else {
    writes.push_back(tm->evict(s.t.param, Tier::pinned, Tier::nvme));
    param_cache_numel = others;
  }
}

kernels::Ops::AdamW Engine::Impl::device_adamw(double lr) const {
  const OptimizerConfig& o = cfg.optimizer;
  return {.lr = float(lr),
          .beta1 = float(o.betas[0]),
          .beta2 = float(o.betas[1]),
          .eps = float(o.eps),
          .weight_decay = float(o.weight_decay),
          .adamw_mode = o.type == OptimizerType::AdamW || o.adam_w_mode,
          .bias_correction = o.bias_correction};
}

void Engine::Impl::update_chunk_on_device(ChunkSlot& s, void* out, double lr, float factor,
                                          std::int64_t step_no) {
  using kernels::Tensor;
  const std::size_t n = s.shard.numel;
  const kernels::Ops::AdamW hp = device_adamw(lr);
  // New working params straight into a device home; for a home in host memory, into the chunk's gradient
  // buffer block (free between passes; the working set has room for it), then copied off the device.
  void* scratch = homes.param == Tier::device ? nullptr : device_alloc(s.gradbuf, true);
  ops->adamw(Tensor{s.master, DType::fp32, n}, Tensor{s.grad, DType::fp32, n},
             Tensor{s.exp_avg, DType::fp32, n}, Tensor{s.exp_avg_sq, DType::fp32, n},
             Tensor{scratch ? scratch : out, wd, n}, hp, step_no, factor);
  s.opt = {.step = step_no, .finite = true};
  if (scratch) {
    from_device(out, scratch, n * wd_bytes());
    tm->evict(s.gradbuf, Tier::device, Tier::pinned);  // frees the block (never valid: no copy)
  }
}

void Engine::Impl::update_group(const std::vector<int>& group, double lr, float factor, std::int64_t step_no,
                                std::vector<tiering::Move>& writes) {
  for (int c : group) {
    ChunkSlot& s = slots[std::size_t(c)];
    float *master = s.master, *m = s.exp_avg, *v = s.exp_avg_sq;
    switch (s.route.stepper) {
      case UpdateRoute::Stepper::device_ops:  // the compute interface's optimizer, on the compute stream
        update_chunk_on_device(s, param_out(s), lr, factor, step_no);
        ++updates.device_optimizer;
        param_written(s, writes);
        break;
      case UpdateRoute::Stepper::model_cpus:  // the device optimizer over directly addressed memory
        update_on_model_cpus(s, lr, factor, step_no);
        if (s.route.params == UpdateRoute::Params::nvme) finish_device_updates(writes);  // one pinned copy
        break;
      case UpdateRoute::Stepper::nvme_pipeline:  // the pipeline has read them into pinned memory
        master = static_cast<float*>(tm->data(s.t.master, Tier::pinned));
        if (cfg.optimizer.type != OptimizerType::Adagrad)
          m = static_cast<float*>(tm->data(s.t.exp_avg, Tier::pinned));
        if (cfg.optimizer.type != OptimizerType::Lion)
          v = static_cast<float*>(tm->data(s.t.exp_avg_sq, Tier::pinned));
        [[fallthrough]];
      case UpdateRoute::Stepper::cpu_optimizer:
        update_chunk(s, master, m, v, param_out(s), lr, factor, step_no);
        ++updates.cpu_optimizer;
        param_written(s, writes);
        break;
    }
  }
}

cpu_optim::Optimizer& Engine::Impl::host_device_optimizer() {
  if (!device_opt)
    device_opt = std::make_unique<cpu_optim::Optimizer>(cpu_optim::Options{
        .simd = cfg.strata.cpu_optim.simd,
        .threads = compute_cpus.empty() ? int(cfg.strata.threads) : int(compute_cpus.size()),
        .pin = !compute_cpus.empty() && cfg.strata.cpu_optim.pin_threads,
        .cpus = compute_cpus});
  return *device_opt;
}

// Note [The optimizer's tail]: on the host backend with cores of the optimizer's own
// (strata.cpu_optim.cores), the model's cpus are idle once backward ends, while the CPU optimizer still
// has the chunks the overlap did not update (or all of them without it). The model's cpus then take a
// share of those in proportion to their count, through the host backend's device optimizer (the same
// SIMD code, so the same bits) from the compute stream, beside the CPU optimizer on its own cores; the
// first chunks go to them, after any the offload ratio keeps on the device (their work counts towards
// that share). Not with NVMe-resident working params (each update holds a pinned copy until it is
// written) and not on a device of its own (cuda: the CPU optimizer has every cpu of the rank). The plan
// marks the chunks that may go (UpdateRoute.tail); the share is taken here, of those left after backward.
void Engine::Impl::update_rest(const std::vector<int>& chunks, double lr, float factor, std::int64_t step_no,
                               std::vector<tiering::Move>& writes) {
  const bool helper =
      std::any_of(chunks.begin(), chunks.end(), [&](int c) { return slots[std::size_t(c)].route.tail; });
  if (!helper) return update_group(chunks, lr, factor, step_no, writes);
  std::uint64_t total = 0, device = 0;
  std::vector<int> on_device, cpu;
  for (int c : chunks) {
    const std::uint64_t n = slots[std::size_t(c)].shard.numel;
    total += n;
    if (!slots[std::size_t(c)].route.device_optimizer()) continue;
    device += n;
    on_device.push_back(c);
  }
  const double share = double(compute_cpus.size()) / double(compute_cpus.size() + optimizer_cpus.size());
  const double target = share * double(total);
  for (int c : chunks) {
    ChunkSlot& s = slots[std::size_t(c)];
    if (s.route.device_optimizer()) continue;  // update_group below
    const double n = double(s.shard.numel);
    if (!s.route.tail || double(device) + n / 2 > target) {
      cpu.push_back(c);
      continue;
    }
    device += s.shard.numel;
    update_on_model_cpus(s, lr, factor, step_no);
  }
  update_group(on_device, lr, factor, step_no, writes);
  update_group(cpu, lr, factor, step_no, writes);
}

void Engine::Impl::update_on_model_cpus(ChunkSlot& s, double lr, float factor, std::int64_t step_no) {
  void* out = param_out(s);
  cpu_optim::Optimizer* with = &host_device_optimizer();
  compute_stream->host_fn([this, &s, out, lr, factor, step_no, with] {
    update_chunk(s, s.master, s.exp_avg, s.exp_avg_sq, out, lr, factor, step_no, with);
  });
  device_updates.push_back(s.id);
  ++updates.model_cpus;
}

void Engine::Impl::finish_device_updates(std::vector<tiering::Move>& writes) {
  if (device_updates.empty()) return;
  const std::vector<int> done = std::exchange(device_updates, {});
  const WaitTimer tw(*compute_stream);
  compute_stream->synchronize();  // raises an update that failed
  times.wait += tw.idle_seconds();
  for (int c : done) param_written(slots[std::size_t(c)], writes);
}

void Engine::Impl::grad_stats(double& sum_sq, bool& finite) {
  using kernels::Tensor;
  // The device optimizer's gradients on a device reached by stream work only are reduced there; the others
  // (pinned memory, or a device the CPU addresses) by the CPU optimizer's reductions.
  auto on_device = [&](const ChunkSlot& s) { return s.route.stepper == UpdateRoute::Stepper::device_ops; };
  // Taken by the overlap's worker from the final gradients (Note [Optimizer overlap]).
  auto early = [&](std::size_t i) { return overlap && overlap->grad_stats[i].ready; };
  bool any_device = false, any_host = false;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    ChunkSlot& s = slots[i];
    const Tensor g{s.grad, DType::fp32, s.shard.numel};
    (on_device(s) ? any_device : any_host) = true;
    if (s.grads_fresh) {  // no gradients reached this chunk this step
      if (on_device(s))
        ops->zero(g);
      else
        std::memset(s.grad, 0, s.shard.numel * sizeof(float));
      continue;
    }
    if (on_device(s)) {  // on the compute stream, after the gradient adds; read back below, all at once
      ops->squared_norm(Tensor{stats + 16 * i, DType::u8, 8}, g);
      ops->nonfinite_check(Tensor{stats + 16 * i + 8, DType::i32, 1}, g);
      continue;
    }
    if (world > 1) continue;  // below: the partials of every rank's shard
    if (early(i)) {
      sum_sq += overlap->grad_stats[i].sum_sq;
      finite = finite && overlap->grad_stats[i].finite;
      continue;
    }
    const cpu_optim::GradStats st = opt->grad_stats(s.grad, DType::fp32, s.shard.numel, 1.0f);
    sum_sq += st.sum_sq;
    finite = finite && st.finite;
  }
  if (world > 1 && any_host) {
    // Each rank's per-block partial sums, all-gathered: chunk c's norm is its blocks' partials added in
    // global block order — rank 0's shard, then rank 1's, ... — the same additions one rank makes over
    // the whole chunk (shards are whole blocks: the layout's chunk_multiple). So the norm, the clipping
    // and the step are those of one rank, bit for bit.
    const std::size_t per_shard =
        (largest_shard + cpu_optim::kGradStatsBlock - 1) / cpu_optim::kGradStatsBlock;
    std::vector<double> mine(slots.size() * per_shard, 0.0);
    for (std::size_t i = 0; i < slots.size(); ++i) {
      ChunkSlot& s = slots[i];
      if (s.grads_fresh || on_device(s)) continue;  // zeroed above (its partials are 0), or reduced there
      const std::vector<double> b = early(i) ? overlap->grad_stats[i].blocks
                                             : opt->grad_block_sums(s.grad, DType::fp32, s.shard.numel, 1.0f);
      std::copy(b.begin(), b.end(), mine.begin() + std::ptrdiff_t(i * per_shard));
    }
    std::vector<double> all(mine.size() * std::size_t(world));
    comm->host_all_gather(mine.data(), all.data(), mine.size() * sizeof(double));  // host memory
    for (std::size_t i = 0; i < slots.size(); ++i) {
      if (slots[i].grads_fresh || on_device(slots[i])) continue;
      const std::size_t blocks =
          (slots[i].shard.numel + cpu_optim::kGradStatsBlock - 1) / cpu_optim::kGradStatsBlock;
      double chunk = 0.0;
      for (int r = 0; r < world; ++r)
        for (std::size_t b = 0; b < blocks; ++b)
          chunk += all[std::size_t(r) * mine.size() + i * per_shard + b];
      sum_sq += chunk;
      finite = finite && std::isfinite(chunk);
    }
  }
  if (any_device) {
    std::vector<char> host(slots.size() * 16);
    from_device(host.data(), stats, host.size());
    double dev_sq = 0;
    bool dev_finite = true;
    for (std::size_t i = 0; i < slots.size(); ++i) {
      if (slots[i].grads_fresh || !on_device(slots[i])) continue;
      double sq;
      std::int32_t bad;
      std::memcpy(&sq, host.data() + 16 * i, sizeof sq);
      std::memcpy(&bad, host.data() + 16 * i + 8, sizeof bad);
      dev_sq += sq;
      dev_finite = dev_finite && bad == 0;
    }
    if (world > 1) {  // the device reductions' sums of each rank's shards (not the one-rank bits)
      dev_sq = comm->all_reduce_sum(dev_sq);
      dev_finite = comm->all_reduce_and(dev_finite);
    }
    sum_sq += dev_sq;
    finite = finite && dev_finite;
  }
  for (ChunkSlot& s : slots) s.grads_fresh = false;
}

void Engine::Impl::settle_backward() {
  if (!backward_end || backward_end->query()) return;
  const auto t0 = Clock::now();
  backward_end->synchronize();
  times.backward += seconds_since(t0);
}

StepResult Engine::Impl::step() {
  STRATA_CHECK(!in_pass, "zero3: step() inside a forward/backward pass");
  settle_backward();
  const auto t1 = Clock::now();
  try {
    sync_grads();
  } catch (...) {
    overlap_undo(false);  // updates made from gradients that may not have arrived
    throw;
  }
  {
    const WaitTimer tw(*compute_stream);
    overlap_settle(-1);  // the last step's updates left to the worker (chunks no backward reached)
    overlap_wait();      // the updates made during backward (Note [Optimizer overlap] in engine_overlap.cpp)
    times.wait += tw.idle_seconds();
  }
  // No gather still reads the working params the update writes (the compute stream, not the host, waited
  // for the gathers it used; one prefetched but not used may still be running).
  gather_stream->synchronize();
  tm->set_step(global_step + 1, tiering::Phase::optimizer);

  // Global norm and overflow, chunk by chunk in a fixed order.
  double sum_sq = 0;
  bool finite = true;
  grad_stats(sum_sq, finite);  // over every rank's shards

  StepResult r;
  r.loss_scale = scaler.scale();
  r.lr = sched.lr();
  bool applied;
  if (scaler.enabled()) {
    applied = scaler.update(!finite);
  } else {
    applied = finite;
    if (!finite)
      STRATA_LOG_WARN("zero3: non-finite gradients at step ", global_step + 1,
                      "; the step is skipped (lower the learning rate or enable gradient_clipping)");
  }
  if (applied) {
    const GradScale gs = grad_scale(sum_sq, r.loss_scale, cfg.gradient_clipping);
    r.grad_norm = gs.norm;
    const std::int64_t step_no = applied_steps + 1;
    // The updates made during backward assumed this factor, rate and step; otherwise they are undone.
    if (overlap && !(gs.factor == overlap->factor && r.lr == overlap->lr && step_no == overlap->step_no))
      overlap_undo(true);
    if (overlap) overlap->last_clipped = gs.clipped;
    const bool nvme_pipeline = std::any_of(slots.begin(), slots.end(), [](const ChunkSlot& s) {
      return s.route.stepper == UpdateRoute::Stepper::nvme_pipeline;
    });
    if (!nvme_pipeline) {
      std::vector<tiering::Move> writes;
      bool kept = false;
      std::vector<int> rest;
      for (const auto& g : groups)
        for (int c : g) {
          if (!overlap_done(std::size_t(c))) {
            rest.push_back(c);
            continue;
          }
          overlap_keep(std::size_t(c));
          kept = true;
        }
      // The rest: with the overlap's worker, those it can update in place are left to it (they run while
      // the next forward starts; Note [Optimizer overlap]), after the others are made here.
      std::vector<int> later, now;
      for (int c : rest) (overlap && slots[std::size_t(c)].route.defer ? later : now).push_back(c);
      update_rest(now, r.lr, gs.factor, step_no, writes);
      finish_device_updates(writes);
      overlap_defer(later, r.lr, gs.factor, step_no);
      if (kept) ++overlap->stats.steps;
      const WaitTimer tw(*compute_stream);
      for (const tiering::Move& m : writes) m.wait();
      times.wait += tw.idle_seconds();
    } else {
      const auto& oo = cfg.zero_optimization.offload_optimizer;
      // The sub-groups offload_optimizer.ratio keeps on the device first (the device optimizer's work is
      // enqueued and runs beside the swaps below), then the swapped ones through the pipeline.
      std::vector<const std::vector<int>*> swapped;
      std::vector<tiering::Move> device_writes;
      for (const auto& g : groups) {
        if (slots[std::size_t(g.front())].route.stepper != UpdateRoute::Stepper::nvme_pipeline)
          update_group(g, r.lr, gs.factor, step_no, device_writes);
        else
          swapped.push_back(&g);
      }
      const std::size_t G = swapped.size();
      std::vector<std::vector<tiering::Move>> reads(G), writes(G);
      std::vector<bool> issued(G, false);
      std::size_t oldest = 0;  // the oldest sub-group whose writes have not been waited for
      auto wait_all = [&](std::vector<tiering::Move>& moves) {
        const WaitTimer tw(*compute_stream);
        for (const tiering::Move& m : moves) m.wait();
        moves.clear();
        times.wait += tw.idle_seconds();
      };
      auto read = [&](std::size_t i) {
        for (int c : *swapped[i])
          for (tiering::TensorId id : optimizer_tensors(slots[std::size_t(c)])) {
            tm->pin(id);
            reads[i].push_back(tm->fetch(id, Tier::pinned));
          }
        issued[i] = true;
      };
      for (std::size_t i = 0; i < G; ++i) {
        while (!issued[i] && i - oldest + 1 > group_window && oldest < i) wait_all(writes[oldest++]);
        if (!issued[i]) read(i);
        if (oo.pipeline_read && i + 1 < G) {
          while (i + 2 - oldest > group_window && oldest < i) wait_all(writes[oldest++]);
          if (i + 2 - oldest <= group_window) read(i + 1);
        }
        wait_all(reads[i]);
        std::vector<tiering::Move> param_writes;
        update_group(*swapped[i], r.lr, gs.factor, step_no, param_writes);
        for (int c : *swapped[i])
          for (tiering::TensorId id : optimizer_tensors(slots[std::size_t(c)])) {
            tm->mark_written(id, Tier::pinned);
            tm->unpin(id);
            writes[i].push_back(tm->evict(id, Tier::pinned, Tier::nvme));
          }
        for (tiering::Move& m : param_writes) writes[i].push_back(std::move(m));
        if (!oo.pipeline_write) {
          while (oldest <= i) wait_all(writes[oldest++]);
        }
      }
      while (oldest < G) wait_all(writes[oldest++]);
      finish_device_updates(device_writes);
      wait_all(device_writes);
    }
    ++applied_steps;
    sched.step();
    if (by_ops && homes.param == Tier::device) {
      // Gathers read the new working params after the compute stream has written them.
      if (!updated) updated = dev->create_event();
      compute_stream->record(*updated);
      gather_stream->wait(*updated);
    }
    if (replicated) {
      // Stages 1 and 2: each rank updated its slice of every chunk's working params; the all-gather
      // (in place, on the gather stream, before any later gather reads them) gives every rank all of them.
      for (ChunkSlot& s : slots)
        gather_comm->all_gather(my_params(s), s.param_home, s.shard.numel, wd, gather_stream.get());
    }
    drop_all_gathered();
  } else {
    overlap_undo(true);
    r.grad_norm = finite ? std::sqrt(sum_sq) / r.loss_scale : std::numeric_limits<double>::infinity();
    ++skipped;
  }
  for (ChunkSlot& s : slots) s.grads_fresh = true;
  ++global_step;

  times.optimizer += seconds_since(t1);
  r.step = global_step;
  r.applied = applied;
  // Every rank's micro-batches: the mean of world x micro_steps losses, and their tokens.
  const double losses = world > 1 ? comm->all_reduce_sum(loss_sum) : loss_sum;
  r.loss = micro_steps > 0 ? losses / (double(micro_steps) * world) : 0.0;
  r.tokens = world > 1 ? std::int64_t(comm->all_reduce_sum(double(tokens))) : tokens;
  r.times = times;
  r.times.total = times.forward + times.backward + times.optimizer;
  micro_steps = 0;
  loss_sum = 0;
  tokens = 0;
  times = {};
  tm->set_step(global_step, tiering::Phase::idle);
  return r;
}

// ------------------------------------------------------------------------------------------ public API

void Engine::begin_pass() {
  Impl& im = *impl_;
  STRATA_CHECK(!im.in_pass, "zero3: begin_pass inside a pass");
  im.dev->bind_thread();   // Note [thread device] in core/device.h: whichever thread trains
  im.overlap_undo(false);  // a forward before step() sees the params of the last step
  im.tm->set_step(im.global_step + 1, tiering::Phase::forward);
  im.in_pass = true;
  // Another micro-batch of this step follows: its pass uses the same parameters, so chunks may stay
  // gathered from one to the next where the cache has room (Note [Reuse across passes] in prefetch.h).
  im.pf->begin_pass(im.micro_steps + 1 < im.cfg.gradient_accumulation_steps);
}

void Engine::end_pass() {
  Impl& im = *impl_;
  STRATA_CHECK(im.in_pass, "zero3: end_pass without begin_pass");
  im.in_pass = false;
  im.pf->end_pass();
}

float Engine::forward(model::TrainableModel& model, const std::int32_t* inputs, const std::int32_t* targets,
                      int B, int T) {
  Impl& im = *impl_;
  STRATA_CHECK(!im.forward_open, "zero3: forward while the last forward's backward is pending");
  begin_pass();
  im.settle_backward();
  try {
    const auto t0 = Clock::now();
    im.forward_loss = model.forward(*this, inputs, targets, B, T);
    im.times.forward += seconds_since(t0);
  } catch (...) {
    im.abandon_pass();
    throw;
  }
  im.forward_open = true;
  im.forward_tokens = std::int64_t(B) * T;
  return im.forward_loss;
}

void Engine::backward(model::TrainableModel& model) {
  Impl& im = *impl_;
  STRATA_CHECK(im.forward_open, "zero3: backward without a forward");
  im.dev->bind_thread();
  im.forward_open = false;
  im.tm->set_step(im.global_step + 1, tiering::Phase::backward);
  std::fill(im.handoffs_seen.begin(), im.handoffs_seen.end(), 0);
  im.last_micro = im.micro_steps + 1 >= im.cfg.gradient_accumulation_steps;
  try {
    const auto t0 = Clock::now();
    im.overlap_begin_backward();
    // The mean over the step's micro-batches on every rank: the reduce-scatter sums the ranks'.
    model.backward(*this, float(im.scaler.scale() / (double(im.cfg.gradient_accumulation_steps) * im.world)));
    // The step's last backward: what is still accumulating on the device crosses now (a chunk whose last
    // hand-off was not known to be its last: the first step's).
    if (im.last_micro) im.flush_accumulators();
    if (!im.backward_end) im.backward_end = im.dev->create_event();
    im.compute_stream->record(*im.backward_end);
    im.times.backward += seconds_since(t0);
  } catch (...) {
    im.overlap_end_backward(false);
    end_pass();
    throw;
  }
  im.handoffs_expected = im.handoffs_seen;
  im.overlap_end_backward(true);
  end_pass();
  im.loss_sum += im.forward_loss;
  ++im.micro_steps;
  im.tokens += im.forward_tokens;
}

void Engine::abandon_forward() {
  Impl& im = *impl_;
  STRATA_CHECK(im.forward_open, "zero3: abandon_forward without a pending forward");
  im.forward_open = false;
  im.abandon_pass();
}

void Engine::Impl::abandon_pass() {
  in_pass = false;
  pf->abandon_pass();
  tm->set_step(global_step, tiering::Phase::idle);
}

bool Engine::forward_pending() const {
  return impl_->forward_open;
}

int Engine::pending_micro_steps() const {
  return impl_->micro_steps;
}

float Engine::forward_backward(model::TrainableModel& model, const model::Batch& batch) {
  const float loss = forward(model, batch.inputs.data(), batch.targets.data(), batch.rows, batch.seq_len);
  backward(model);
  return loss;
}

StepResult Engine::train_batch(model::TrainableModel& model, model::DataLoader& data) {
  for (std::int64_t i = 0; i < impl_->cfg.gradient_accumulation_steps; ++i)
    forward_backward(model, data.next());
  return step();
}

void Engine::read_params(int id, float* out) {
  Impl& im = *impl_;
  im.dev->bind_thread();
  const ChunkSlot& s = im.slots.at(std::size_t(id));
  im.overlap_settle(-1);
  im.overlap_undo(false);  // the params of the last step
  std::memset(out, 0, s.numel * sizeof(float));
  im.gather_stream->synchronize();  // replicated params: the step's all-gather has landed
  const std::size_t n = im.param_numel(s), at = im.replicated ? 0 : s.shard.offset;
  im.with_host_copy(s.t.param, [&](const void* p) { model::convert_to_f32(im.wd, p, n, out + at); });
  // The other ranks' shards, in place, in host memory (collective: every rank reads the same chunk).
  if (im.world > 1 && !im.replicated)
    im.comm->host_all_gather(out + s.shard.offset, out, s.shard.numel * sizeof(float));
}

std::vector<float> Engine::master_params(int id) {
  Impl& im = *impl_;
  im.dev->bind_thread();
  const ChunkSlot& s = im.slots.at(std::size_t(id));
  im.overlap_settle(-1);
  im.overlap_undo(false);
  std::vector<float> out(s.shard.numel);
  im.with_host_copy(s.t.master,
                    [&](const void* p) { std::memcpy(out.data(), p, out.size() * sizeof(float)); });
  return out;
}

}  // namespace strata::zero3
