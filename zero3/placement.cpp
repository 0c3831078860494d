// Placement and the memory plan (zero3/placement.h; the formulas are in docs/train.md, "Device memory").
#include "zero3/placement.h"

#include <algorithm>
#include <cmath>

#include "tiering/caching_allocator.h"

namespace strata::zero3 {

using tiering::Tier;

Tier home_of(OffloadDevice d) {
  return d == OffloadDevice::none ? Tier::device : d == OffloadDevice::cpu ? Tier::pinned : Tier::nvme;
}

OffloadDevice offload_of(Tier home) {
  return home == Tier::device   ? OffloadDevice::none
         : home == Tier::pinned ? OffloadDevice::cpu
                                : OffloadDevice::nvme;
}

const char* offload_name(OffloadDevice d) {
  return offload_device_name(d);
}

const char* offload_name(Tier home) {
  return offload_device_name(offload_of(home));
}

tiering::ShardHomes shard_homes(const ZeroConfig& z) {
  tiering::ShardHomes h;
  h.param = home_of(z.offload_param.device);
  h.master = h.optim = home_of(z.offload_optimizer.device);
  h.grad = h.optim == Tier::device ? Tier::device : Tier::pinned;
  return h;
}

tiering::ShardHomes device_optimizer_homes(const tiering::ShardHomes& offloaded) {
  tiering::ShardHomes h = offloaded;
  h.master = h.optim = h.grad = Tier::device;
  return h;
}

int device_optimizer_groups(double ratio, int groups) {
  const double kept = (1.0 - ratio) * double(groups);
  return std::clamp(int(std::floor(kept * (1 + 1e-9))), 0, groups);
}

void keep_optimizer_on_device(PlanInput& in, int groups) {
  for (PlannedChunk& c : in.chunks) c.device_optimizer = false;
  for (int g = 0; g < std::min<int>(groups, int(in.groups.size())); ++g)
    for (int c : in.groups[std::size_t(g)]) in.chunks[std::size_t(c)].device_optimizer = true;
}

PlanInput plan_input(const Config& cfg, const std::vector<ChunkSize>& chunks, int world, int rank,
                     DType activation) {
  const ZeroConfig& z = cfg.zero_optimization;
  const bool replicated = world > 1 && z.stage < 3;  // stages 1 and 2: every rank holds all working params
  PlanInput in;
  in.homes = shard_homes(z);
  in.optimizer_states =
      cfg.optimizer.type == OptimizerType::Adam || cfg.optimizer.type == OptimizerType::AdamW ? 2 : 1;
  in.working = cfg.bf16.enabled ? DType::bf16 : cfg.fp16.enabled ? DType::fp16 : DType::fp32;
  in.activation = activation;
  in.accumulation_steps = int(std::max<std::int64_t>(1, cfg.gradient_accumulation_steps));
  in.local_accumulation = world > 1 && z.stage == 1;
  for (const ChunkSize& cs : chunks) {
    PlannedChunk c;
    c.numel = cs.padded_numel;
    c.shard = comm::shard_range(cs.padded_numel, world, rank);
    c.param_numel = replicated ? c.numel : c.shard.numel;
    c.persistent = cs.numel < z.stage3_param_persistence_threshold;
    in.chunks.push_back(c);
  }
  // Optimizer sub-groups: transfers move whole shards, so a chunk larger than sub_group_size is a
  // sub-group of its own.
  std::uint64_t acc = 0;
  for (int i = 0; i < int(in.chunks.size()); ++i) {
    const std::uint64_t n = in.chunks[std::size_t(i)].shard.numel;
    if (in.groups.empty() || acc + n > z.sub_group_size) {
      in.groups.emplace_back();
      acc = 0;
    }
    in.groups.back().push_back(i);
    acc += n;
  }
  // Partial offload (stage 3; "auto" is the engine's choice, made after it measures).
  const auto& oo = z.offload_optimizer;
  if (oo.device != OffloadDevice::none && z.stage == 3 && !oo.ratio_auto)
    keep_optimizer_on_device(in, device_optimizer_groups(oo.ratio, int(in.groups.size())));
  return in;
}

PlanInput plan_input(const Config& cfg, const model::ModelLayout& layout, bool tied_embeddings, int world,
                     int rank, DType activation) {
  std::vector<ChunkSize> sizes;
  for (int i = 0; i < layout.num_chunks(); ++i)
    sizes.push_back({.numel = layout.chunk(i).numel, .padded_numel = layout.chunk(i).padded_numel});
  PlanInput in = plan_input(cfg, sizes, world, rank, activation);
  if (tied_embeddings && layout.head_chunk() != layout.embedding_chunk())
    in.head = layout.head_chunk(), in.embedding = layout.embedding_chunk();
  return in;
}

Plan plan_memory(const PlanInput& in, const ZeroConfig& z) {
  Plan p;
  MemoryPlan& m = p.memory;
  const tiering::ShardHomes& homes = in.homes;
  const std::uint64_t wd = dtype_bytes(in.working);
  std::uint64_t largest = 0, total = 0, largest_group = 0;
  for (const PlannedChunk& c : in.chunks) {
    total += c.shard.numel;
    largest = std::max<std::uint64_t>(largest, c.numel);
    p.largest_shard = std::max<std::uint64_t>(p.largest_shard, c.shard.numel);
  }
  for (const auto& g : in.groups) {
    std::uint64_t n = 0;
    for (int c : g) n += in.chunks[std::size_t(c)].shard.numel;
    largest_group = std::max(largest_group, n);
  }
  // Device bytes are counted as the device allocator counts them (its options are the tier manager's;
  // see tiering/caching_allocator.h, Note [exact segments]), so the plan is what the step can peak at.
  const tiering::AllocatorOptions da = tiering::device_allocator_options(tiering::TierOptions{});
  auto block = [&](std::uint64_t bytes) {
    return std::uint64_t(tiering::CachingAllocator::block_bytes(da, bytes));
  };
  auto add = [&](Tier t, std::uint64_t shard_bytes) {
    std::uint64_t& sum = t == Tier::device   ? m.device_state
                         : t == Tier::pinned ? m.pinned_state
                                             : m.nvme_state;
    sum += t == Tier::device ? block(shard_bytes) : shard_bytes;
  };
  bool grads_on_device = false, grads_pinned = false, stepped_on_host = false;
  for (const PlannedChunk& c : in.chunks) {
    const std::uint64_t n = c.shard.numel;
    const tiering::ShardHomes h = in.homes_of(c);
    p.gather_block.push_back(block(c.numel * dtype_bytes(in.activation)));
    p.grad_block.push_back(block(c.numel * sizeof(float)));
    add(h.param, c.param_numel * wd);
    if (h.param == Tier::nvme) m.nvme_params += c.param_numel * wd;
    add(h.grad, n * 4);
    add(h.master, n * 4);
    for (int i = 0; i < in.optimizer_states; ++i) add(h.optim, n * 4);
    grads_on_device = grads_on_device || h.grad == Tier::device;
    grads_pinned = grads_pinned || h.grad == Tier::pinned;
    stepped_on_host = stepped_on_host || h.master != Tier::device;
  }
  m.optimizer_groups = int(in.groups.size());
  for (const auto& g : in.groups)
    if (!g.empty() && in.chunks[std::size_t(g.front())].device_optimizer) ++m.device_optimizer_groups;
  if (homes.master != Tier::device && !in.groups.empty())
    m.offload_ratio = 1.0 - double(m.device_optimizer_groups) / double(in.groups.size());
  // The working set: what the model holds at once — one chunk with its gradient buffer, or (tied
  // embeddings) the head's and the embedding's together while the head runs. Persistent chunks are kept
  // after release whatever their reuse distance, but in the cache: they give way to the working set like
  // any kept chunk (zero3/engine_chunks.cpp, Note [Device room]).
  auto held = [&](int c) { return p.gather_block[std::size_t(c)] + p.grad_block[std::size_t(c)]; };
  for (int c = 0; c < int(in.chunks.size()); ++c) {
    if (in.chunks[std::size_t(c)].persistent)
      p.persistent_bytes += p.gather_block[std::size_t(c)], ++p.persistent_chunks;
    m.device_working_set = std::max(m.device_working_set, held(c));
  }
  if (in.head >= 0 && in.embedding >= 0)
    m.device_working_set = std::max(m.device_working_set, held(in.head) + held(in.embedding));
  m.device_activations = in.activations;
  m.device_ops = in.ops;
  // Per-chunk gradient squared norms and non-finite flags, 16 bytes a chunk, when the compute interface
  // reduces device-home gradients.
  if (in.device_state_by_ops && grads_on_device) m.device_state += block(in.chunks.size() * 16);
  std::uint64_t room = in.device_capacity > m.device_need() ? in.device_capacity - m.device_need() : 0;
  // Device accumulators (MemoryPlan.device_accumulators): chunk by chunk while the room above two of the
  // largest gathered chunks holds them.
  p.accumulate.assign(in.chunks.size(), 0);
  p.accumulator_block.assign(in.chunks.size(), 0);
  std::uint64_t two_chunks = 0, largest_gather = 0;
  for (std::uint64_t b : p.gather_block) largest_gather = std::max(largest_gather, b);
  two_chunks = 2 * largest_gather;
  if (in.accumulation_steps > 1 && room > two_chunks) {
    std::uint64_t spare = room - two_chunks;
    for (std::size_t c = 0; c < in.chunks.size(); ++c) {
      // A shard accumulator where the shard is already on the device would add nothing; stage 1's local
      // ones hold the whole chunk, before the reduction.
      if (!in.local_accumulation && in.homes_of(in.chunks[c]).grad == Tier::device) continue;
      const std::uint64_t b =
          block((in.local_accumulation ? in.chunks[c].numel : in.chunks[c].shard.numel) * sizeof(float));
      p.accumulator_block[c] = b;
      if (b > spare) continue;
      p.accumulate[c] = 1;
      spare -= b;
      ++m.device_accumulators;
      m.device_accumulator_bytes += b;
    }
  }
  m.device_cache = room - m.device_accumulator_bytes;

  std::uint64_t staging = 0;
  if (homes.param == Tier::nvme) {
    // A read buffer holds one whole chunk, whatever buffer_size says (Engine::check_fits warns).
    staging += std::uint64_t(std::max<std::int64_t>(1, z.offload_param.buffer_count)) * largest * wd;
    staging += std::min<std::uint64_t>(z.offload_param.max_in_cpu, total) * wd;
  }
  if (homes.master == Tier::nvme) {
    p.group_window = std::max<std::size_t>(
        1, std::size_t(z.offload_optimizer.buffer_count) / std::size_t(1 + in.optimizer_states));
    staging += p.group_window * largest_group * 4 * std::uint64_t(1 + in.optimizer_states);
  }
  if (homes.param != Tier::pinned && homes.master != Tier::device)
    staging += largest_group * wd;  // new working params on their way home
  m.pinned_staging = staging;
  const std::uint64_t slab = 64ull << 20;
  m.pinned_budget = m.pinned_state + staging + 2 * slab + (staging + m.pinned_state) / 16;
  // The gradient staging buffer (accumulation into a pinned shard) is pinned memory of the engine's own,
  // outside the tier manager's budget; so is the parameter staging of device-home params stepped on the
  // host.
  if (grads_pinned) m.pinned_staging += p.largest_shard * sizeof(float);
  if (in.device_state_by_ops && homes.param == Tier::device && stepped_on_host)
    m.pinned_staging += p.largest_shard * wd;
  if (m.nvme_state > 0) m.nvme_budget = m.nvme_state + m.nvme_state / 16 + (64ull << 20);
  return p;
}

}  // namespace strata::zero3
