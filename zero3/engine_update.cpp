// The updater (engine_update.h): each chunk stepped as its route says (Note [Update routes] in
// placement.cpp), its new working params written home.
//
// Note [NVMe swap pipeline]: with offload_optimizer nvme, sub-group i's states (fp32 master and the
// optimizer's moments) are read into pinned memory by the tier manager, updated, marked written and
// evicted back to NVMe (an asynchronous write that frees the pinned blocks when done). pipeline_read
// issues the reads of sub-group i + 1 before updating i; pipeline_write lets the writes of i run while
// i + 1 is updated (otherwise each write is waited for). At most `group_window` = buffer_count / (tensors
// per parameter) sub-groups hold pinned buffers at once; the oldest write is waited for to make room.
// With the gradients on NVMe too (Note [Gradients through NVMe] in engine_grads.cpp) each chunk's gradient
// shard is read with its states (a tensor per parameter more in the window), read by the update through
// the pinned copy, and dropped after it: its NVMe copy stays valid and is overwritten by the next step's.
#include "zero3/engine_update.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace strata::zero3 {

void Updater::open() {
  steps_.assign(env_.slots.size(), cpu_optim::ShardStep{});
  if (std::any_of(env_.slots.begin(), env_.slots.end(),
                  [](const ChunkSlot& s) { return s.route.params == UpdateRoute::Params::staged; }))
    param_staging_ = PinnedBuffer(*env_.dev, env_.largest_shard * env_.working_dtype_bytes());
  if (std::any_of(env_.slots.begin(), env_.slots.end(), [](const ChunkSlot& s) {
        return s.route.stepper == UpdateRoute::Stepper::device_ops && s.route.param_home != Tier::device;
      }))
    scratch_id_ = env_.tm->register_tensor({.name = "zero3.update_scratch",
                                            .kind = tiering::Kind::staging,
                                            .dtype = env_.working_dtype,
                                            .bytes = env_.largest_shard * env_.working_dtype_bytes(),
                                            .home = Tier::device,
                                            .chunk = -1,
                                            .shard = -1});
  if (scratch_id_) env_.tm->pin(scratch_id_);
}

void Updater::wait_all(std::vector<tiering::Move>& moves) {
  const WaitTimer tw(*env_.compute_stream);
  for (const tiering::Move& m : moves) m.wait();
  moves.clear();
  wait_ += tw.idle_seconds();
}

void Updater::update(const std::vector<int>& chunks, double lr, float factor, std::int64_t step_no) {
  if (std::any_of(chunks.begin(), chunks.end(), [&](int c) {
        return env_.slots[std::size_t(c)].route.stepper == UpdateRoute::Stepper::nvme_pipeline;
      }))
    return update_through_nvme(lr, factor, step_no);
  std::vector<tiering::Move> writes;
  update_rest(chunks, lr, factor, step_no, writes);
  finish_device_updates(writes);
  wait_all(writes);
}

void Updater::update_chunk(const ChunkSlot& s, const float* g, float* master, float* m, float* v, void* out,
                           double lr, float factor, std::int64_t step_no, cpu_optim::Optimizer* with) {
  step_shard(steps_[std::size_t(s.id)], s.shard.numel, g, master, m, v, out, lr, factor, step_no, with);
}

void Updater::step_shard(cpu_optim::ShardStep& st, std::size_t n, const float* g, float* master, float* m,
                         float* v, void* out, double lr, float factor, std::int64_t step_no,
                         cpu_optim::Optimizer* with) const {
  cpu_optim::Optimizer& optimizer = with ? *with : *env_.opt;
  cpu_optim::Shard sh;
  sh.params = master;
  sh.grads = g;
  sh.exp_avg = m;
  sh.exp_avg_sq = v;
  sh.out = env_.working_dtype == DType::fp32 ? nullptr : out;
  sh.n = n;
  sh.out_dtype = env_.working_dtype == DType::fp16 ? DType::fp16 : DType::bf16;
  env_.rule.step(optimizer, st, lr, step_no, sh, factor);
  if (env_.working_dtype == DType::fp32) std::memcpy(out, master, n * sizeof(float));
}

void* Updater::param_out(const ChunkSlot& s) {
  switch (s.route.params) {
    case UpdateRoute::Params::home:  // in place
      return env_.my_params(s);
    case UpdateRoute::Params::staged:
      return param_staging_.data();
    case UpdateRoute::Params::nvme:
      break;
  }
  env_.tm->pin(s.tensors.param);
  return env_.tm->allocate(s.tensors.param, Tier::pinned);
}

void Updater::param_written(const ChunkSlot& s, std::vector<tiering::Move>& writes) {
  if (s.route.params == UpdateRoute::Params::staged) {  // param_staging_ -> the device home; reused after
    env_.to_device(env_.my_params(s), param_staging_.data(), s.shard.numel * env_.working_dtype_bytes());
    return;
  }
  if (s.route.params != UpdateRoute::Params::nvme) return;
  room_.params_written(s, writes);
}

kernels::Ops::AdamW Updater::device_adamw(double lr) const {
  const cpu_optim::AdamParams a = env_.rule.adam(lr);
  return {.lr = a.lr,
          .beta1 = a.beta1,
          .beta2 = a.beta2,
          .eps = a.eps,
          .weight_decay = a.weight_decay,
          .adamw_mode = a.adamw,
          .bias_correction = a.bias_correction};
}

void Updater::update_chunk_on_device(const ChunkSlot& s, void* out, double lr, float factor,
                                     std::int64_t step_no) {
  using kernels::Tensor;
  const std::size_t n = s.shard.numel;
  const kernels::Ops::AdamW hp = device_adamw(lr);
  // New working params straight into a device home; for a home in host memory, into the updater's own
  // device scratch (asked of the cache's room between passes, where the working set has room for it),
  // then copied off the device.
  void* scratch =
      s.route.param_home == Tier::device ? nullptr : room_.device_alloc(scratch_id_, AllocFor::demand);
  env_.ops->adamw(Tensor{s.master, DType::fp32, n}, Tensor{s.grad, DType::fp32, n},
                  Tensor{s.exp_avg, DType::fp32, n}, Tensor{s.exp_avg_sq, DType::fp32, n},
                  Tensor{scratch ? scratch : out, env_.working_dtype, n}, hp, step_no, factor);
  steps_[std::size_t(s.id)] = {.step = step_no, .finite = true};
  if (scratch) {
    env_.from_device(out, scratch, n * env_.working_dtype_bytes());
    env_.tm->evict(scratch_id_, Tier::device, Tier::pinned);  // frees the block (never valid: no copy)
  }
}

void Updater::update_group(const std::vector<int>& group, double lr, float factor, std::int64_t step_no,
                           std::vector<tiering::Move>& writes) {
  for (int c : group) {
    const ChunkSlot& s = env_.slots[std::size_t(c)];
    float *master = s.master, *m = s.exp_avg, *v = s.exp_avg_sq;
    const float* g = s.grad;
    switch (s.route.stepper) {
      case UpdateRoute::Stepper::device_ops:  // the compute interface's optimizer, on the compute stream
        update_chunk_on_device(s, param_out(s), lr, factor, step_no);
        ++updates_.device_optimizer;
        param_written(s, writes);
        break;
      case UpdateRoute::Stepper::model_cpus:  // the device optimizer over directly addressed memory
        update_on_model_cpus(s, lr, factor, step_no);
        if (s.route.params == UpdateRoute::Params::nvme) finish_device_updates(writes);  // one pinned copy
        break;
      case UpdateRoute::Stepper::nvme_pipeline:  // the pipeline has read them into pinned memory
        master = static_cast<float*>(env_.tm->data(s.tensors.master, Tier::pinned));
        // With the gradients on NVMe, the pinned copy the pipeline read with the states.
        if (s.route.grads_nvme) g = static_cast<const float*>(env_.tm->data(s.tensors.grad, Tier::pinned));
        if (env_.rule.keeps_exp_avg())
          m = static_cast<float*>(env_.tm->data(s.tensors.exp_avg, Tier::pinned));
        if (env_.rule.keeps_exp_avg_sq())
          v = static_cast<float*>(env_.tm->data(s.tensors.exp_avg_sq, Tier::pinned));
        [[fallthrough]];
      case UpdateRoute::Stepper::cpu_optimizer:
        update_chunk(s, g, master, m, v, param_out(s), lr, factor, step_no);
        ++updates_.cpu_optimizer;
        param_written(s, writes);
        break;
    }
  }
}

cpu_optim::Optimizer& Updater::host_device_optimizer() {
  if (!device_opt_)
    device_opt_ = std::make_unique<cpu_optim::Optimizer>(cpu_optim::Options{
        .simd = env_.cfg.strata.cpu_optim.simd,
        .threads = env_.compute_cpus.empty() ? int(env_.cfg.strata.threads) : int(env_.compute_cpus.size()),
        .pin = !env_.compute_cpus.empty() && env_.cfg.strata.cpu_optim.pin_threads,
        .cpus = env_.compute_cpus});
  return *device_opt_;
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
void Updater::update_rest(const std::vector<int>& chunks, double lr, float factor, std::int64_t step_no,
                          std::vector<tiering::Move>& writes) {
  const bool helper =
      std::any_of(chunks.begin(), chunks.end(), [&](int c) { return env_.slots[std::size_t(c)].route.tail; });
  if (!helper) return update_group(chunks, lr, factor, step_no, writes);
  std::uint64_t total = 0, device = 0;
  std::vector<int> on_device, cpu;
  for (int c : chunks) {
    const std::uint64_t n = env_.slots[std::size_t(c)].shard.numel;
    total += n;
    if (!env_.slots[std::size_t(c)].route.device_optimizer()) continue;
    device += n;
    on_device.push_back(c);
  }
  const double share =
      double(env_.compute_cpus.size()) / double(env_.compute_cpus.size() + env_.optimizer_cpus.size());
  const double target = share * double(total);
  for (int c : chunks) {
    const ChunkSlot& s = env_.slots[std::size_t(c)];
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

void Updater::update_on_model_cpus(const ChunkSlot& s, double lr, float factor, std::int64_t step_no) {
  void* out = param_out(s);
  cpu_optim::Optimizer* with = &host_device_optimizer();
  env_.compute_stream->host_fn([this, &s, out, lr, factor, step_no, with] {
    update_chunk(s, s.grad, s.master, s.exp_avg, s.exp_avg_sq, out, lr, factor, step_no, with);
  });
  device_updates_.push_back(s.id);
  ++updates_.model_cpus;
}

void Updater::finish_device_updates(std::vector<tiering::Move>& writes) {
  if (device_updates_.empty()) return;
  const std::vector<int> done = std::exchange(device_updates_, {});
  const WaitTimer tw(*env_.compute_stream);
  env_.compute_stream->synchronize();  // raises an update that failed
  wait_ += tw.idle_seconds();
  for (int c : done) param_written(env_.slots[std::size_t(c)], writes);
}

// Every sub-group: the overlap does not run with NVMe-resident states, so step() leaves every chunk here.
void Updater::update_through_nvme(double lr, float factor, std::int64_t step_no) {
  const auto& oo = env_.cfg.zero_optimization.offload_optimizer;
  // The sub-groups offload_optimizer.ratio keeps on the device first (the device optimizer's work is
  // enqueued and runs beside the swaps below), then the swapped ones through the pipeline.
  std::vector<const std::vector<int>*> swapped;
  std::vector<tiering::Move> device_writes;
  for (const auto& g : env_.groups) {
    if (env_.slots[std::size_t(g.front())].route.stepper != UpdateRoute::Stepper::nvme_pipeline)
      update_group(g, lr, factor, step_no, device_writes);
    else
      swapped.push_back(&g);
  }
  const std::size_t G = swapped.size();
  std::vector<std::vector<tiering::Move>> reads(G), writes(G);
  std::vector<bool> issued(G, false);
  std::size_t oldest = 0;  // the oldest sub-group whose writes have not been waited for
  auto read = [&](std::size_t i) {
    for (int c : *swapped[i]) {
      const ChunkSlot& s = env_.slots[std::size_t(c)];
      for (tiering::TensorId id : env_.optimizer_tensors(s)) {
        env_.tm->pin(id);
        reads[i].push_back(env_.tm->fetch(id, Tier::pinned));
      }
      if (s.route.grads_nvme) {
        env_.tm->pin(s.tensors.grad);
        reads[i].push_back(env_.tm->fetch(s.tensors.grad, Tier::pinned));
      }
    }
    issued[i] = true;
  };
  for (std::size_t i = 0; i < G; ++i) {
    while (!issued[i] && i - oldest + 1 > env_.group_window && oldest < i) wait_all(writes[oldest++]);
    if (!issued[i]) read(i);
    if (oo.pipeline_read && i + 1 < G) {
      while (i + 2 - oldest > env_.group_window && oldest < i) wait_all(writes[oldest++]);
      if (i + 2 - oldest <= env_.group_window) read(i + 1);
    }
    wait_all(reads[i]);
    std::vector<tiering::Move> param_writes;
    update_group(*swapped[i], lr, factor, step_no, param_writes);
    for (int c : *swapped[i]) {
      const ChunkSlot& s = env_.slots[std::size_t(c)];
      for (tiering::TensorId id : env_.optimizer_tensors(s)) {
        env_.tm->mark_written(id, Tier::pinned);
        env_.tm->unpin(id);
        writes[i].push_back(env_.tm->evict(id, Tier::pinned, Tier::nvme));
      }
      if (s.route.grads_nvme) {  // read, not written: the pinned copy is dropped
        env_.tm->unpin(s.tensors.grad);
        env_.tm->evict(s.tensors.grad, Tier::pinned, Tier::nvme);
      }
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

}  // namespace strata::zero3
