// The optimizer split between the device and the CPU: zero_optimization.offload_optimizer.ratio.
//
// Note [Offload ratio]: DeepSpeed's partial offload. With the optimizer offloaded (cpu or nvme) and
// ratio < 1, the first (1 - ratio) x G of the G optimizer sub-groups (device_optimizer_groups in
// zero3/placement.h: DeepSpeed's rule, the first ones stay) keep their fp32 master, optimizer states and
// gradient accumulator on the device; the rest are offloaded as the config says. A chunk's homes are
// ChunkSlot.homes. What follows from them is per chunk, so the two kinds mix in one step:
//   - gradients: a device-home chunk's hand-off adds into its device shard (as offload_optimizer none);
//   - the norm and overflow check: the CPU's reductions over addressable shards, the compute interface's
//     over device shards reached by stream work only (grad_stats), summed;
//   - the update: step() walks the sub-groups in order, so the device ones come first, and their
//     update is enqueued on the compute stream — the device optimizer — while the CPU optimizer updates
//     the offloaded ones on the training thread. Where the device is reached by stream work (cuda;
//     EngineOptions.device_state_by_ops on the host backend) it is the compute interface's AdamW. On the
//     host backend's directly addressed device it is the SIMD CPU optimizer with threads of its own on
//     the model's cpus (host_device_optimizer: with strata.cpu_optim.cores, the cpus the CPU optimizer
//     does not use), the same arithmetic as the offloaded update. The device's sub-groups are not
//     overlapped with backward (Note [Optimizer overlap]), the offloaded ones are as before, and need no
//     rollback copies for the device's.
//   - checkpoints store every tensor whatever its home, so a checkpoint loads at any ratio.
// The losses are the same at every ratio on the host backend (the arithmetic of each tensor is the same
// wherever it lives: tests/zero3/ratio_test.cpp).
//
// "auto" (choose_device_groups): the engine measures the CPU optimizer (pinned memory, its own threads)
// and the device optimizer (device memory, the compute stream) on 4 Mi elements each, then picks the
// number k of device sub-groups that minimises the update after backward — the longer of the device's and
// the CPU's parts, which run side by side — among the k whose plan leaves the chunk cache room for two of
// the largest gathered chunks (one in use, one prefetched). Ties (within 0.1%) go to the smaller k (less
// device memory). The choice, the rates and the room are logged. The model leaves out the offloaded
// updates hidden behind backward by the overlap, so it errs towards keeping more on the device. On the
// host backend's directly addressed device, whose optimizer runs on the CPU's own cores, "auto" offloads
// everything without measuring (the log line says why; measured in bench/RESULTS.md).

#include <algorithm>
#include <cstring>

#include "core/log.h"
#include "zero3/engine_impl.h"

namespace strata::zero3 {

using detail::cat;

namespace {

// Steps of the sample update timed after one untimed.
constexpr int kTimedSteps = 3;

}  // namespace

double Engine::Impl::cpu_optimizer_rate(std::size_t n) {
  PinnedBuffer buf(*dev, n * (4 * sizeof(float) + sizeof(float)));
  std::memset(buf.data(), 0, buf.size());
  float* base = static_cast<float*>(buf.data());
  cpu_optim::ShardStep st;
  float* grad = base + n;
  for (std::size_t i = 0; i < n; ++i) grad[i] = 1e-3f * float(i % 7);
  double best = 0;
  for (int step = 1; step <= 1 + kTimedSteps; ++step) {
    const auto t0 = Clock::now();
    updater.step_shard(st, n, grad, base, base + 2 * n, base + 3 * n, base + 4 * n, 1e-4, 1.0f, step);
    const double t = seconds_since(t0);
    if (step > 1) best = best == 0 ? t : std::min(best, t);
  }
  return best > 0 ? double(n) / best : 0;
}

double Engine::Impl::device_optimizer_rate(std::size_t n) {
  using kernels::Tensor;
  DeviceBuffer buf(*dev, n * (4 * sizeof(float) + sizeof(float)), "zero3.ratio_sample");
  compute_stream->memset_async(buf.data(), 0, buf.size());
  float* base = static_cast<float*>(buf.data());
  const kernels::Ops::AdamW hp = updater.device_adamw(1e-4);
  // The host backend's direct path: the SIMD optimizer on the compute cpus, from the compute stream.
  cpu_optim::ShardStep st;
  float* grad = base + n;
  cpu_optim::Optimizer* host = by_ops ? nullptr : &updater.host_device_optimizer();
  double best = 0;
  for (int step = 1; step <= 1 + kTimedSteps; ++step) {
    compute_stream->synchronize();
    const auto t0 = Clock::now();
    if (host)
      compute_stream->host_fn([&, step] {
        updater.step_shard(st, n, grad, base, base + 2 * n, base + 3 * n, base + 4 * n, 1e-4, 1.0f, step,
                           host);
      });
    else
      ops->adamw(Tensor{base, DType::fp32, n}, Tensor{base + n, DType::fp32, n},
                 Tensor{base + 2 * n, DType::fp32, n}, Tensor{base + 3 * n, DType::fp32, n},
                 Tensor{base + 4 * n, working_dtype, n}, hp, step, 1.0f);
    compute_stream->synchronize();
    const double t = seconds_since(t0);
    if (step > 1) best = best == 0 ? t : std::min(best, t);
  }
  return best > 0 ? double(n) / best : 0;
}

int Engine::Impl::choose_device_groups(const PlanInput& in, const Plan& offloaded) {
  const int G = int(in.groups.size());
  // The host backend's device is the CPU: its optimizer is the same SIMD code on the model's cpus. Sharing
  // the cpus with the CPU optimizer (strata.cpu_optim.cores 0) the two would take turns; with cores of the
  // optimizer's own, the model's cpus already take their share of the update after backward (Note [The
  // optimizer's tail] in engine_update.cpp). Either way a split only moves gradient adds onto the model's
  // cpus and sub-groups out of the overlap with backward.
  if (!by_ops) {
    if (comm->rank() == 0)
      STRATA_LOG_INFO(
          "zero3: offload_optimizer.ratio auto: 1 (every sub-group offloaded): the host "
          "backend's device optimizer runs on the CPU's cores, ",
          cfg.strata.cpu_optim.cores == 0 ? "the CPU optimizer's too (strata.cpu_optim.cores 0)"
                                          : "which already take a share of the update after backward",
          ", so a split gains nothing");
    return 0;
  }
  std::vector<std::uint64_t> numel(std::size_t(G), 0);
  for (int g = 0; g < G; ++g)
    for (int c : in.groups[std::size_t(g)]) numel[std::size_t(g)] += in.chunks[std::size_t(c)].shard.numel;
  // The largest k whose plan leaves the cache room for two of the largest gathered chunks.
  const std::uint64_t reserve =
      2 * *std::max_element(offloaded.gather_block.begin(), offloaded.gather_block.end());
  int fits = 0;
  std::uint64_t room_left = offloaded.memory.device_cache;
  for (int k = 1; k <= G; ++k) {
    PlanInput trial = in;
    keep_optimizer_on_device(trial, k);
    const MemoryPlan m = zero3::plan_memory(trial, cfg.zero_optimization).memory;
    if (m.device_need() > dev->caps().capacity || m.device_cache < reserve) break;
    fits = k;
    room_left = m.device_cache;
  }
  // The samples: 4 Mi elements (80 MiB, beyond the caches, as the shards are), on the device at most a
  // 64th of it.
  const std::size_t n = std::size_t(1) << 22;
  const std::size_t dev_n =
      std::max<std::size_t>(std::min<std::size_t>(n, dev->caps().capacity / 64) / 64 * 64, 64);
  double cpu_rate = cpu_optimizer_rate(n);
  double dev_rate = 0;
  if (fits > 0) {
    try {
      dev_rate = device_optimizer_rate(dev_n);
    } catch (const OutOfMemory& e) {
      STRATA_LOG_WARN(
          "zero3: offload_optimizer.ratio auto: no device memory to measure the device "
          "optimizer (",
          e.what(), "); every sub-group is offloaded");
      fits = 0;
    }
  }
  if (opts.testing.measured_rates) opts.testing.measured_rates(cpu_rate, dev_rate);
  std::uint64_t total = 0;
  for (std::uint64_t x : numel) total += x;
  auto cost = [&](int k) {
    std::uint64_t on_dev = 0;
    for (int g = 0; g < k; ++g) on_dev += numel[std::size_t(g)];
    const double d = on_dev == 0 ? 0 : double(on_dev) / dev_rate, c = double(total - on_dev) / cpu_rate;
    return std::max(d, c);
  };
  int best = 0;
  for (int k = 1; k <= fits; ++k)
    if (cost(k) < cost(best) * (1 - 1e-3)) best = k;
  // Each rank timed its own optimizers; rank 0's choice is every rank's (Note [Ranks agree] in
  // engine_plan.cpp).
  if (world > 1) comm->host_broadcast(&best, sizeof best, 0);
  if (comm->rank() == 0)
    STRATA_LOG_INFO("zero3: offload_optimizer.ratio auto: ", 1.0 - double(best) / double(std::max(G, 1)),
                    " (", best, " of ", G, " optimizer sub-group", G == 1 ? "" : "s",
                    " on the device); measured", world > 1 ? " on rank 0" : "", " on ", n,
                    " elements: CPU optimizer ", cpu_rate / 1e6, " M elements/s",
                    dev_rate > 0 ? cat(", device optimizer ", dev_rate / 1e6, " M elements/s")
                                 : std::string(" (the device optimizer not measured: no room)"),
                    "; the device has room for ", fits, " (", format_size(room_left),
                    " of chunk cache left at that many); estimated update after backward ", cost(best),
                    " s (", cost(0), " s all offloaded)");
  return best;
}

}  // namespace strata::zero3
