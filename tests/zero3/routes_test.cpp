// The update routes the plan decides (Note [Update routes] in zero3/placement.cpp): what each config puts
// where, the overlap's choice of chunks, and the engine following the routes it was given.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
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

// The engine steps each chunk by its route: after one step every chunk's master holds AdamW's update of its
// own summed gradients (a float64 reference, from the gradients the model handed off), whichever stepper
// its route names — the device optimizer on the model's cpus for the sub-groups offload_optimizer.ratio
// keeps on the device, the CPU optimizer for the others — and its master lives where the route keeps it.
// eps 1 makes the update proportional to the gradient (not its sign), so a chunk stepped with another
// chunk's gradients, one micro-batch's, or not at all would be off by far more than the bound.
TEST(UpdateRoutes, TheEngineStepsEachChunkByItsRoute) {
  test::ScratchDir dir("routes");
  const Config cfg = make_config(
      OffloadDevice::cpu, OffloadDevice::cpu, dir.path(),
      {{"gradient_clipping", 0.0},
       {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"eps", 1.0}, {"weight_decay", 0.01}}}}},
       {"zero_optimization", {{"offload_optimizer", {{"ratio", 0.5}}}}},
       {"strata", {{"cpu_optim", {{"cores", 0}}}}}});
  const model::ModelConfig mcfg = test::block_model("routes", 2);
  std::vector<std::vector<double>> grads;  // per chunk: the step's gradients, summed over micro-batches
  EngineOptions opts{.backend = "host", .seq_len = 32};
  opts.testing.gradient_hook = [&](int c, float* g, std::size_t n) {
    std::vector<double>& sum = grads[std::size_t(c)];
    sum.resize(n, 0.0);
    for (std::size_t i = 0; i < n; ++i) sum[i] += double(g[i]);
  };
  Engine engine(cfg, mcfg, opts);
  const int C = engine.layout().num_chunks();
  grads.resize(std::size_t(C));
  const std::vector<UpdateRoute> routes = engine.update_routes();
  ASSERT_EQ(routes.size(), std::size_t(C));
  ASSERT_TRUE(std::any_of(routes.begin(), routes.end(),
                          [](const UpdateRoute& r) { return r.stepper == S::model_cpus; }));
  ASSERT_TRUE(std::any_of(routes.begin(), routes.end(),
                          [](const UpdateRoute& r) { return r.stepper == S::cpu_optimizer; }));
  std::vector<std::vector<float>> before;
  for (int c = 0; c < C; ++c) before.push_back(engine.master_params(c));

  model::LlamaModel model(mcfg, engine.model_options());
  const std::string tokens = test::make_tokens(dir);
  model::TokenFile file = model::TokenFile::open(tokens);
  model::DataLoader data(file,
                         {.batch_size = engine.micro_batch(), .seq_len = 32, .seed = 1, .vocab_size = 256});
  const StepResult r = engine.train_batch(model, data);
  ASSERT_TRUE(r.applied);

  const double b1 = 0.9, b2 = 0.999, eps = 1.0, wd = 0.01;
  for (int c = 0; c < C; ++c) {
    SCOPED_TRACE(engine.layout().chunk(c).name);
    const std::vector<float> after = engine.master_params(c);
    const std::vector<double>& g = grads[std::size_t(c)];
    ASSERT_EQ(g.size(), after.size()) << "one rank: the gradient buffer is the shard";
    double worst = 0, moved = 0;
    for (std::size_t i = 0; i < after.size(); ++i) {
      const double p = before[std::size_t(c)][i];
      // Step 1: the moments (1 - b1) g and (1 - b2) g², bias-corrected, are g and g².
      const double m = (1 - b1) * g[i] / (1 - b1), v = (1 - b2) * g[i] * g[i] / (1 - b2);
      const double step = r.lr * m / (std::sqrt(v) + eps);
      const double want = p * (1 - r.lr * wd) - step;
      // In units of fp32's spacing at the operands: the update's few roundings stay within a few.
      const double spacing = (std::abs(p) + std::abs(step) + 1e-12) * std::numeric_limits<float>::epsilon();
      worst = std::max(worst, std::abs(double(after[i]) - want) / spacing);
      moved = std::max(moved, std::abs(step));
    }
    EXPECT_GT(moved, 1e-7) << "the chunk's gradients move it";
    EXPECT_LT(worst, 4.0) << "its master is AdamW's update of its own gradients (fp32 spacings off)";
    // The master where the route keeps it: the device for a device stepper, pinned host memory otherwise.
    const tiering::Tier home = routes[std::size_t(c)].device_optimizer() ? T::device : T::pinned;
    bool found = false;
    for (tiering::TensorId id : engine.tiers().tensor_ids()) {
      const tiering::TensorInfo info = engine.tiers().info(id);
      if (info.desc.name != engine.layout().chunk(c).name + ".master") continue;
      found = true;
      EXPECT_TRUE(tiering::has(info.valid, home)) << "master valid in " << tiering::to_string(home);
    }
    EXPECT_TRUE(found);
  }
}

}  // namespace
}  // namespace strata::zero3
