// The fake environment of the parts' tests (env_fixture.h): EngineEnv filled in as Engine::Impl's
// constructor, plan_memory's lay_out_chunks and init_chunks fill it (zero3/engine.cpp,
// zero3/engine_plan.cpp), for one rank, the host backend and pinned homes.
#include "tests/zero3/parts/env_fixture.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "comm/comm.h"
#include "core/dtype.h"
#include "tiering/caching_allocator.h"

namespace strata::zero3::test {

const char* name(Precision p) {
  return p == Precision::bf16 ? "bf16" : p == Precision::fp16 ? "fp16" : "fp32";
}

Config parts_config(const EnvOptions& o) {
  const nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", 1},
      {"gradient_accumulation_steps", 1},
      {"bf16", {{"enabled", o.precision == Precision::bf16}}},
      {"fp16", {{"enabled", o.precision == Precision::fp16}}},
      {"optimizer",
       {{"type", "AdamW"},
        {"params", {{"lr", 3e-3}, {"betas", {0.9, 0.999}}, {"eps", 1e-8}, {"weight_decay", 0.01}}}}},
      {"zero_optimization",
       {{"stage", 3}, {"offload_param", {{"device", "cpu"}}}, {"offload_optimizer", {{"device", "cpu"}}}}},
      {"strata",
       {{"backend", "host"}, {"overlap_optimizer", o.overlap}, {"cpu_optim", {{"pin_threads", false}}}}},
  };
  // Through text: size keys accept only JSON's unsigned integers (tests/zero3/engine_util.h, make_config).
  return Config::parse(nlohmann::json::parse(j.dump()));
}

UpdateRoute pinned_route(bool overlap) {
  using R = UpdateRoute;
  return {.param_home = Tier::pinned,
          .all_gather = false,
          .lockstep = false,
          .grad_shard = Tier::pinned,
          .handoff = R::Handoff::grad_stream,
          .norm = R::Norm::host,
          .grads = R::Grads::pinned_shard,
          .grads_nvme = false,
          .reduce = R::Reduce::none,
          .stepper = R::Stepper::cpu_optimizer,
          .params = R::Params::home,
          .overlap = overlap,
          .defer = overlap,
          .tail = false};
}

namespace {

// `bytes` from `src` as the valid copy of `id` in pinned memory (Engine::Impl::put for a pinned home).
void put_pinned(tiering::TierManager& tm, tiering::TensorId id, const void* src, std::size_t bytes) {
  std::memcpy(tm.allocate(id, Tier::pinned), src, bytes);
  tm.mark_written(id, Tier::pinned);
}

std::vector<std::byte> as_working(const std::vector<float>& v, DType working) {
  std::vector<std::byte> out(v.size() * dtype_bytes(working));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (working == DType::fp32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
      continue;
    }
    const std::uint16_t h = working == DType::bf16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
    std::memcpy(out.data() + 2 * i, &h, 2);
  }
  return out;
}

float to_f32(const std::byte* p, DType t) {
  if (t == DType::fp32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return t == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
}

}  // namespace

PartsEnv::PartsEnv(EnvOptions o)
    : EngineEnv(parts_config(o), model::ModelConfig::preset("tiny"), EngineOptions{.backend = "host"}) {
  // The device, one rank, the streams and their ops (Engine::Impl's constructor). The compute ops take no
  // matrix-product workspace: the parts never multiply.
  dev = open_device({.backend = "host", .memory_cap = 2 * o.device_budget});
  owned_comm = comm::make_single_rank();
  comm = owned_comm.get();
  const EngineFacts facts = engine_facts(cfg, world);
  working_dtype = facts.working;
  homes = shard_homes(cfg);
  compute_stream = dev->create_stream("zero3-compute");
  gather_stream = dev->create_stream("zero3-gather");
  grad_stream = dev->create_stream("zero3-grads");
  ops = kernels::make_ops(*dev, *compute_stream,
                          {.matmul = cfg.bf16.enabled ? DType::bf16 : DType::fp32, .workspace_bytes = 0});
  act = ops->caps().activation;
  gather_ops = kernels::make_ops(*dev, *gather_stream, {.role = kernels::OpsRole::runtime});
  grad_ops = kernels::make_ops(*dev, *grad_stream, {.role = kernels::OpsRole::runtime});
  opt = std::make_unique<cpu_optim::Optimizer>(cpu_optim::Options{.simd = "auto", .pin = false});
  const tiering::TierOptions to{
      .device_budget = o.device_budget, .pinned_budget = 16ull << 20, .pinned_slab_bytes = 1 << 20};
  tm = std::make_unique<tiering::TierManager>(*dev, to);

  // The chunks as the plan lays them out (lay_out_chunks), with the routes set here, and the device blocks
  // counted as the tier manager's allocator counts them.
  planned = plan_input(cfg, layout, mcfg.tie_embeddings, world, 0, act);
  const tiering::AllocatorOptions da = tiering::device_allocator_options(to);
  slots.resize(planned.chunks.size());
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const PlannedChunk& c = planned.chunks[i];
    ChunkSlot& s = slots[i];
    s.id = int(i);
    s.name = layout.chunk(int(i)).name;
    s.numel = c.numel;
    s.shard = c.shard;
    s.param_numel = c.param_numel;
    s.param_offset = c.param_offset;
    s.persistent = c.persistent;
    s.homes = planned.homes_of(c);
    s.route = pinned_route(o.overlap);
    s.gather_block = tiering::CachingAllocator::block_bytes(da, c.numel * dtype_bytes(act));
    s.grad_block = tiering::CachingAllocator::block_bytes(da, c.numel * sizeof(float));
    largest_shard = std::max<std::uint64_t>(largest_shard, c.shard.numel);
  }
  groups = planned.groups;
  plan.device_cache = o.device_budget;
  plan.optimizer_groups = int(groups.size());
  if (o.overlap) {
    plan.overlap_groups = int(groups.size());
    for (const ChunkSlot& s : slots) plan.overlap_host += overlap_copy_bytes(planned, s.shard.numel);
  }

  // Each chunk's five tensors registered, written and pinned, and their stable addresses (init_chunks):
  // master from test_values (seed: the chunk), the working params rounded from it, zero states; the
  // gradient shard allocated.
  for (ChunkSlot& s : slots) {
    const std::size_t n = s.shard.numel;
    s.tensors = tm->register_shard({.prefix = s.name,
                                    .chunk = s.id,
                                    .shard = 0,
                                    .numel = n,
                                    .working = working_dtype,
                                    .param_numel = s.param_numel,
                                    .homes = s.homes});
    const std::vector<float> master = test_values(n, std::uint32_t(s.id) + 1);
    put_pinned(*tm, s.tensors.master, master.data(), n * sizeof(float));
    const std::vector<std::byte> params = as_working(master, working_dtype);
    put_pinned(*tm, s.tensors.param, params.data(), params.size());
    const std::vector<float> zeros(n, 0.0f);
    for (tiering::TensorId st : optimizer_tensors(s))
      if (st != s.tensors.master) put_pinned(*tm, st, zeros.data(), n * sizeof(float));
    tm->allocate(s.tensors.grad, Tier::pinned);
    for (tiering::TensorId id :
         {s.tensors.param, s.tensors.grad, s.tensors.master, s.tensors.exp_avg, s.tensors.exp_avg_sq})
      if (tm->info(id).allocated) tm->pin(id);
    s.param_home = tm->data(s.tensors.param, Tier::pinned);
    s.grad = static_cast<float*>(tm->data(s.tensors.grad, Tier::pinned));
    s.master = static_cast<float*>(tm->data(s.tensors.master, Tier::pinned));
    s.exp_avg = static_cast<float*>(tm->data(s.tensors.exp_avg, Tier::pinned));
    s.exp_avg_sq = static_cast<float*>(tm->data(s.tensors.exp_avg_sq, Tier::pinned));
  }
}

PartsEnv::~PartsEnv() {
  sync();
}

void PartsEnv::sync() const {
  for (Stream* s : {compute_stream.get(), gather_stream.get(), grad_stream.get()}) s->synchronize();
}

tiering::TensorId PartsEnv::device_tensor(const std::string& name, std::uint64_t bytes) const {
  const tiering::TensorId id = tm->register_tensor({.name = name,
                                                    .kind = tiering::Kind::staging,
                                                    .dtype = DType::u8,
                                                    .bytes = bytes,
                                                    .home = Tier::device});
  tm->pin(id);
  return id;
}

std::vector<float> test_values(std::size_t n, std::uint32_t seed, float scale) {
  std::vector<float> v(n);
  std::uint32_t x = seed * 2654435761u;
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    f = scale * (float(x >> 8) * (2.0f / float(1 << 24)) - 1.0f);
  }
  return v;
}

::testing::AssertionResult same_bytes(const void* got, const void* want, std::size_t bytes,
                                      std::size_t elem) {
  const auto* g = static_cast<const unsigned char*>(got);
  const auto* w = static_cast<const unsigned char*>(want);
  for (std::size_t i = 0; i < bytes; ++i)
    if (g[i] != w[i])
      return ::testing::AssertionFailure()
             << "element " << i / elem << " (of " << bytes / elem << ") differs at byte " << i % elem;
  return ::testing::AssertionSuccess();
}

std::vector<std::byte> widened(const void* src, DType from, DType to, std::size_t n) {
  std::vector<std::byte> out(n * dtype_bytes(to));
  const auto* p = static_cast<const std::byte*>(src);
  for (std::size_t i = 0; i < n; ++i) {
    const float f = to_f32(p + i * dtype_bytes(from), from);
    if (to == DType::fp32) {
      std::memcpy(out.data() + 4 * i, &f, 4);
    } else {
      const std::uint16_t h = f32_to_bf16(f);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

ChunkState state_of(const EngineEnv& env, const ChunkSlot& s) {
  const std::size_t n = s.shard.numel;
  const auto* p = static_cast<const std::byte*>(env.my_params(s));
  return {.master = {s.master, s.master + n},
          .exp_avg = {s.exp_avg, s.exp_avg + n},
          .exp_avg_sq = {s.exp_avg_sq, s.exp_avg_sq + n},
          .params = {p, p + n * env.working_dtype_bytes()}};
}

::testing::AssertionResult same_state(const ChunkState& got, const ChunkState& want) {
  auto field = [](const char* what, const auto& g, const auto& w, std::size_t elem) {
    if (g.size() != w.size())
      return ::testing::AssertionFailure() << what << ": " << g.size() << " elements, not " << w.size();
    ::testing::AssertionResult r = same_bytes(g.data(), w.data(), g.size() * sizeof(g[0]), elem);
    if (!r) return ::testing::AssertionFailure() << what << ": " << r.message();
    return r;
  };
  const std::size_t pe = got.master.empty() ? 1 : got.params.size() / got.master.size();
  for (auto r : {field("master", got.master, want.master, 4), field("exp_avg", got.exp_avg, want.exp_avg, 4),
                 field("exp_avg_sq", got.exp_avg_sq, want.exp_avg_sq, 4),
                 field("params", got.params, want.params, pe)})
    if (!r) return r;
  return ::testing::AssertionSuccess();
}

ChunkState adamw_reference(const EngineEnv& env, ChunkState s, const float* g, double lr, float factor,
                           std::int64_t step_no) {
  // parts_config's optimizer section.
  const cpu_optim::AdamParams hp{
      .lr = float(lr), .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f, .adamw = true};
  const DType working = env.working_dtype;
  cpu_optim::Shard sh{.params = s.master.data(),
                      .grads = g,
                      .exp_avg = s.exp_avg.data(),
                      .exp_avg_sq = s.exp_avg_sq.data(),
                      .out = working == DType::fp32 ? nullptr : s.params.data(),
                      .n = s.master.size(),
                      .out_dtype = working == DType::fp16 ? DType::fp16 : DType::bf16};
  cpu_optim::Optimizer ref;
  cpu_optim::ShardStep st{.step = step_no - 1};
  ref.adam(st, hp, step_no, sh, factor);
  if (working == DType::fp32) std::memcpy(s.params.data(), s.master.data(), s.params.size());
  return s;
}

void FakeGate::settle(int c) {
  calls.push_back("settle(" + std::to_string(c) + ")");
  if (on_settle) on_settle(c);
}

void FakeGate::undo(UndoAs as) {
  calls.push_back(as == UndoAs::rollback ? "undo(rollback)" : "undo(cancellation)");
}

void FakeGate::handed_off(const ChunkSlot& s, Stream& on, int seen, int expected) {
  calls.push_back("handed_off(" + std::to_string(s.id) + ", seen " + std::to_string(seen) + ", expected " +
                  std::to_string(expected) + ", on " + on.name() + ")");
}

const ShardNorm* FakeGate::early_stats(std::size_t c) const {
  auto it = early.find(c);
  return it == early.end() ? nullptr : &it->second;
}

void* FakeRoom::device_alloc(tiering::TensorId id, AllocFor who) {
  allocs.push_back({id, who});
  void* p = env_.tm->allocate(id, Tier::device);
  std::memset(p, 0xA5, env_.tm->info(id).desc.bytes);  // the host backend's device memory is addressable
  return p;
}

void FakeRoom::params_written(const ChunkSlot& s, std::vector<tiering::Move>&) {
  written.push_back(s.id);
}

}  // namespace strata::zero3::test
