// The update routes the plan decides (Note [Update routes] in zero3/placement.cpp): what each config puts
// where, the overlap's choice of chunks, and the engine following the routes it was given.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "tests/zero3/engine_util.h"
#include "zero3/placement.h"

namespace strata::zero3 {
namespace {

using test::make_config;
using G = UpdateRoute::Grads;
using R = UpdateRoute::Reduce;
using S = UpdateRoute::Stepper;
using P = UpdateRoute::Params;
using H = UpdateRoute::Handoff;
using N = UpdateRoute::Norm;
using T = tiering::Tier;

// Four chunks of 10,048 elements (padded), each an optimizer sub-group of its own under make_config's
// sub_group_size of 20,000 (two would be 20,096).
std::vector<ChunkSize> four_chunks() {
  return std::vector<ChunkSize>(4, ChunkSize{.numel = 10000, .padded_numel = 10048});
}

Plan plan_of(const Config& cfg, int world = 1, bool by_ops = false, std::uint64_t capacity = 1ull << 30,
             bool tail = false) {
  PlanInput in = plan_input(cfg, four_chunks(), world, 0, DType::fp32);
  in.device_state_by_ops = by_ops;
  in.device_capacity = capacity;
  in.tail_on_model_cpus = tail;
  return plan_memory(in, cfg.zero_optimization);
}

TEST(UpdateRoutes, FollowTheOffloadTargets) {
  const OffloadDevice none = OffloadDevice::none, cpu = OffloadDevice::cpu, nvme = OffloadDevice::nvme;
  const nlohmann::json one_micro = {{"gradient_accumulation_steps", 1}};
  struct Case {
    OffloadDevice param, optim;
    bool by_ops;
    UpdateRoute want;
  } cases[] = {
      {none,
       none,
       false,
       {.param_home = T::device,
        .grad_shard = T::device,
        .handoff = H::compute_stream,
        .grads = G::device_shard,
        .stepper = S::cpu_optimizer}},
      {none,
       none,
       true,
       {.param_home = T::device,
        .grad_shard = T::device,
        .handoff = H::compute_stream,
        .norm = N::device,
        .gathers_wait_update = true,
        .grads = G::device_shard,
        .stepper = S::device_ops}},
      {cpu, cpu, false, {.grads = G::pinned_shard, .stepper = S::cpu_optimizer}},
      {none,
       cpu,
       true,
       {.param_home = T::device,
        .gathers_wait_update = true,
        .grads = G::pinned_shard,
        .stepper = S::cpu_optimizer,
        .params = P::staged}},
      {none, cpu, false, {.param_home = T::device, .grads = G::pinned_shard, .stepper = S::cpu_optimizer}},
      {nvme,
       nvme,
       false,
       {.param_home = T::nvme,
        .grad_shard = T::nvme,
        .grads = G::pinned_shard,
        .grads_nvme = true,
        .stepper = S::nvme_pipeline,
        .params = P::nvme}},
      {cpu,
       none,
       true,
       {.grad_shard = T::device,
        .handoff = H::compute_stream,
        .norm = N::device,
        .grads = G::device_shard,
        .stepper = S::device_ops}},
  };
  for (const Case& c : cases) {
    const Plan p = plan_of(make_config(c.param, c.optim, "/tmp", one_micro), 1, c.by_ops);
    ASSERT_EQ(p.routes.size(), 4u);
    for (const UpdateRoute& r : p.routes)
      EXPECT_EQ(r, c.want) << offload_name(c.param) << "/" << offload_name(c.optim)
                           << (c.by_ops ? " by ops" : "") << ": " << describe(r) << " instead of "
                           << describe(c.want);
  }
}

// N ranks: stage 3 gathers shards and all-gathers them; stages 1 and 2 keep the params whole and
// all-gather the ranks' new slices after the step; the norm sums blocks over the ranks either way, and
// nothing waits on timing (lockstep).
TEST(UpdateRoutes, RanksDecideTheGatherTheNormAndWhatFollowsTheStep) {
  for (int stage : {2, 3}) {
    const Config cfg = make_config(OffloadDevice::none, OffloadDevice::cpu, "/tmp",
                                   {{"zero_optimization", {{"stage", stage}}}}, 2);
    for (const UpdateRoute& r : plan_of(cfg, 2).routes) {
      EXPECT_EQ(r.all_gather, stage == 3) << "stage " << stage;
      EXPECT_EQ(r.all_gather_after_step, stage == 2) << "stage " << stage;
      EXPECT_TRUE(r.lockstep);
      EXPECT_EQ(r.norm, N::host_blocks);
      EXPECT_EQ(r.handoff, H::grad_stream);
    }
  }
  for (const UpdateRoute& r :
       plan_of(make_config(OffloadDevice::none, OffloadDevice::none, "/tmp", nlohmann::json::object(), 2), 2,
               true)
           .routes) {
    EXPECT_EQ(r.norm, N::device_ranks);
    EXPECT_EQ(r.handoff, H::grad_stream);  // after the reduce-scatter, not the model's ops
  }
}

TEST(UpdateRoutes, AccumulateOnTheDeviceWhereThePlanHasRoom) {
  const Config cfg = make_config(OffloadDevice::cpu, OffloadDevice::cpu, "/tmp");  // accumulation 2
  for (const UpdateRoute& r : plan_of(cfg).routes) EXPECT_EQ(r.grads, G::device_accumulator);
  // No room beyond the working set: every hand-off crosses to the pinned shard.
  const Plan tight = plan_of(cfg, 1, false, plan_of(cfg).memory.device_need());
  for (const UpdateRoute& r : tight.routes) EXPECT_EQ(r.grads, G::pinned_shard);
}

TEST(UpdateRoutes, ReduceOncePerStepOnlyWithStageOnesLocalAccumulator) {
  const Config stage1 = make_config(OffloadDevice::none, OffloadDevice::cpu, "/tmp",
                                    {{"zero_optimization", {{"stage", 1}}}}, 2);
  for (const UpdateRoute& r : plan_of(stage1, 2).routes) {
    EXPECT_EQ(r.grads, G::local_accumulator);
    EXPECT_EQ(r.reduce, R::once_a_step);
  }
  const Config stage3 =
      make_config(OffloadDevice::none, OffloadDevice::cpu, "/tmp", nlohmann::json::object(), 2);
  for (const UpdateRoute& r : plan_of(stage3, 2).routes) EXPECT_EQ(r.reduce, R::every_handoff);
  for (const UpdateRoute& r : plan_of(make_config(OffloadDevice::none, OffloadDevice::cpu, "/tmp")).routes)
    EXPECT_EQ(r.reduce, R::none);
}

TEST(UpdateRoutes, TheRatioKeepsTheFirstSubGroupsOnTheDeviceOptimizer) {
  const Config cfg = make_config(OffloadDevice::none, OffloadDevice::cpu, "/tmp",
                                 {{"zero_optimization", {{"offload_optimizer", {{"ratio", 0.5}}}}}});
  const Plan host = plan_of(cfg, 1, false, 1ull << 30, /*tail=*/true);
  const Plan cuda = plan_of(cfg, 1, true);
  ASSERT_EQ(host.memory.optimizer_groups, 4);
  ASSERT_EQ(host.memory.device_optimizer_groups, 2);
  for (int c = 0; c < 4; ++c) {
    const bool kept = c < 2;  // sub-groups 0 and 1
    EXPECT_EQ(host.routes[std::size_t(c)].stepper, kept ? S::model_cpus : S::cpu_optimizer) << c;
    EXPECT_EQ(host.routes[std::size_t(c)].tail, !kept) << c;  // the model's cpus share the CPU's chunks
    EXPECT_EQ(cuda.routes[std::size_t(c)].stepper, kept ? S::device_ops : S::cpu_optimizer) << c;
    EXPECT_EQ(cuda.routes[std::size_t(c)].params, kept ? P::home : P::staged) << c;
    EXPECT_EQ(host.routes[std::size_t(c)].grads, kept ? G::device_shard : G::device_accumulator) << c;
  }
}

TEST(UpdateRoutes, OverlapTakesTheLastChunksThatFitAndStopsAtTheDeviceOptimizer) {
  const Config cfg = make_config(OffloadDevice::cpu, OffloadDevice::cpu, "/tmp",
                                 {{"zero_optimization", {{"offload_optimizer", {{"ratio", 0.5}}}}}});
  PlanInput in = plan_input(cfg, four_chunks(), 1, 0, DType::fp32);
  in.device_capacity = 1ull << 30;
  Plan p = plan_memory(in, cfg.zero_optimization);
  const auto bytes = [](int) { return std::uint64_t(1000); };
  // Room for one chunk's copies: only the last.
  std::vector<UpdateRoute> one = p.routes;
  MemoryPlan m1 = p.memory;
  EXPECT_EQ(plan_overlap(one, m1, in, 1500, bytes).chunks, 1);
  EXPECT_TRUE(one[3].overlap);
  EXPECT_FALSE(one[2].overlap);
  EXPECT_EQ(m1.overlap_host, 1000u);
  EXPECT_EQ(m1.overlap_groups, 1);
  // The CPU optimizer's chunks not overlapped are deferred; the device optimizer's are neither.
  EXPECT_TRUE(one[2].defer);
  EXPECT_FALSE(one[0].defer);
  EXPECT_FALSE(one[0].overlap);
  // Room for everything: it stops at the sub-group the ratio keeps on the device.
  std::vector<UpdateRoute> all = p.routes;
  MemoryPlan m2 = p.memory;
  EXPECT_EQ(plan_overlap(all, m2, in, 1u << 20, bytes).chunks, 2);
  EXPECT_FALSE(all[1].overlap);
  // No room: routes unchanged, and the reason.
  std::vector<UpdateRoute> none = p.routes;
  MemoryPlan m3 = p.memory;
  const OverlapDecision d = plan_overlap(none, m3, in, 10, bytes);
  EXPECT_EQ(d.chunks, 0);
  EXPECT_NE(d.why_not.find("no room in host memory"), std::string::npos) << d.why_not;
  EXPECT_EQ(none, p.routes);
}

TEST(UpdateRoutes, OverlapDefersNothingWhenRanksAllGatherTheParams) {
  const Config cfg = make_config(OffloadDevice::none, OffloadDevice::cpu, "/tmp",
                                 {{"zero_optimization", {{"stage", 2}}}}, 2);
  PlanInput in = plan_input(cfg, four_chunks(), 2, 0, DType::fp32);
  in.device_capacity = 1ull << 30;
  Plan p = plan_memory(in, cfg.zero_optimization);
  ASSERT_GT(plan_overlap(p.routes, p.memory, in, 1u << 20, [](int) { return std::uint64_t(100); }).chunks, 0);
  for (const UpdateRoute& r : p.routes) EXPECT_FALSE(r.defer) << describe(r);
}

TEST(UpdateRoutes, OverlapIsRefusedWithNvmeStatesByName) {
  const Config cfg = make_config(OffloadDevice::cpu, OffloadDevice::nvme, "/tmp");
  PlanInput in = plan_input(cfg, four_chunks(), 1, 0, DType::fp32);
  in.device_capacity = 1ull << 30;
  Plan p = plan_memory(in, cfg.zero_optimization);
  const OverlapDecision d =
      plan_overlap(p.routes, p.memory, in, 1u << 30, [](int) { return std::uint64_t(1); });
  EXPECT_EQ(d.chunks, 0);
  EXPECT_NE(d.why_not.find("offload_optimizer.device is nvme"), std::string::npos) << d.why_not;
}

TEST(UpdateRoutes, DescribeGroupsEqualRoutes) {
  std::vector<UpdateRoute> r(4);
  r[0].stepper = r[1].stepper = S::model_cpus;
  r[0].grads = r[1].grads = G::device_shard;
  EXPECT_EQ(describe(r),
            "chunks 0-1: gradients in the device shard; device optimizer (the model's cpus)\n"
            "chunks 2-3: gradients to the pinned shard; CPU optimizer");
}

// strata config's routes: before a model, what the config alone decides, for each kind of device.
TEST(UpdateRoutes, TheConfigAloneDecidesTheStepperAndTheHomes) {
  const Config cfg = make_config(OffloadDevice::none, OffloadDevice::cpu, "/tmp",
                                 {{"zero_optimization", {{"offload_optimizer", {{"ratio", 0.5}}}}},
                                  {"strata", {{"cpu_optim", {{"cores", 1}}}}}});
  const std::vector<ConfigRoute> cuda = config_routes(cfg, true), host = config_routes(cfg, false);
  ASSERT_EQ(cuda.size(), 2u);
  ASSERT_EQ(host.size(), 2u);
  EXPECT_EQ(cuda[0].route.stepper, S::cpu_optimizer);
  EXPECT_EQ(cuda[0].route.params, P::staged);
  EXPECT_EQ(cuda[1].route.stepper, S::device_ops);
  EXPECT_EQ(host[0].route.stepper, S::cpu_optimizer);
  EXPECT_TRUE(host[0].route.tail);
  EXPECT_EQ(host[1].route.stepper, S::model_cpus);
  const std::vector<ConfigRoute> all =
      config_routes(make_config(OffloadDevice::nvme, OffloadDevice::nvme, "/tmp"), true);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].route.stepper, S::nvme_pipeline);
  EXPECT_EQ(all[0].route.params, P::nvme);
  EXPECT_TRUE(all[0].route.grads_nvme);
  EXPECT_EQ(describe(all[0].route),
            "gradients summed on the device, to NVMe once a step; CPU optimizer through the NVMe swap "
            "pipeline, params written to NVMe");
  // strata.nvme_gradients false keeps them in pinned memory.
  const std::vector<ConfigRoute> pinned =
      config_routes(make_config(OffloadDevice::nvme, OffloadDevice::nvme, "/tmp",
                                {{"strata", {{"nvme_gradients", false}}}}),
                    true);
  EXPECT_FALSE(pinned[0].route.grads_nvme);
}

// The engine steps each chunk by its route: the update counters add up to the routes' steppers.
TEST(UpdateRoutes, TheEngineStepsEachChunkByItsRoute) {
  test::ScratchDir dir("routes");
  const Config cfg = make_config(OffloadDevice::cpu, OffloadDevice::cpu, dir.path(),
                                 {{"zero_optimization", {{"offload_optimizer", {{"ratio", 0.5}}}}},
                                  {"strata", {{"cpu_optim", {{"cores", 0}}}}}});
  const model::ModelConfig mcfg = test::block_model("routes", 2);
  Engine engine(cfg, mcfg, {.backend = "host", .seq_len = 32});
  const std::vector<UpdateRoute> routes = engine.update_routes();
  ASSERT_EQ(routes.size(), std::size_t(engine.layout().num_chunks()));
  const auto count = [&](S s) {
    return std::uint64_t(
        std::count_if(routes.begin(), routes.end(), [&](const UpdateRoute& r) { return r.stepper == s; }));
  };
  ASSERT_GT(count(S::model_cpus), 0u);
  ASSERT_GT(count(S::cpu_optimizer), 0u);
  model::LlamaModel model(mcfg, engine.model_options());
  const std::string tokens = test::make_tokens(dir);
  model::TokenFile file = model::TokenFile::open(tokens);
  model::DataLoader data(file,
                         {.batch_size = engine.micro_batch(), .seq_len = 32, .seed = 1, .vocab_size = 256});
  const int steps = 2;
  for (int i = 0; i < steps; ++i) ASSERT_TRUE(engine.train_batch(model, data).applied);
  const UpdateStats& u = engine.update_stats();
  EXPECT_EQ(u.model_cpus, count(S::model_cpus) * steps);
  EXPECT_EQ(u.cpu_optimizer, count(S::cpu_optimizer) * steps);
  EXPECT_EQ(u.device_optimizer, 0u);
}

}  // namespace
}  // namespace strata::zero3
