// The device memory plan is a promise: at every device cap the up-front check accepts, training runs,
// the device never holds more than the cap, and the losses are those of an unconstrained run. Tested with
// what users run — the stock configs/zero3_cpu.json and zero3_nvme.json, DeepSpeed's default stage-3
// knobs (a config that names none of them) — and with tight knobs, on a model whose gathered chunks are
// several times the smallest accepted cap, from that cap up to the one where every chunk fits at once. Every
// cap counts the compute interface's own bytes (MemoryPlan.device_ops: its matrix-product workspace,
// cuBLASLt's on cuda and the stand-in of tests/common/workspace_standin.cpp here) and the room beside them.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "engine_util.h"
#include "tests/common/source_dir.h"

namespace strata::zero3 {
namespace {

using test::make_tokens;
using test::ScratchDir;

// Ten blocks of 213,248 parameters (833 KiB gathered: they come and go under DeepSpeed's default
// persistence threshold) and an embedding and head below it (kept gathered while the cache has room).
model::ModelConfig deep_model() {
  return test::block_model("device-room-test", 10);
}

enum class Knobs { stock, defaults, tight };
const char* name(Knobs k) {
  return k == Knobs::stock ? "stock" : k == Knobs::defaults ? "defaults" : "tight";
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return nlohmann::json::parse(f);
}

// The config a user would bring, with batch settings for a short test run (and the host backend, the
// NVMe path under the scratch directory, no memprof trace, threads left unpinned).
Config user_config(Knobs knobs, OffloadDevice off, const std::string& nvme_dir) {
  nlohmann::json j;
  if (knobs == Knobs::stock) {
    j = read_json(strata::test::source_dir() + "/configs/zero3_" + test::name(off) + ".json");
    j["scheduler"]["params"]["total_num_steps"] = 10000;  // what `strata train` takes from the run
  } else {
    // DeepSpeed's defaults for everything but the offload targets and the optimizer.
    j = {{"bf16", {{"enabled", true}}},
         {"gradient_clipping", 1.0},
         {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.01}}}}},
         {"zero_optimization",
          {{"stage", 3},
           {"offload_param", {{"device", test::name(off)}}},
           {"offload_optimizer", {{"device", test::name(off)}}}}}};
    if (knobs == Knobs::tight)
      j["zero_optimization"].merge_patch({{"stage3_prefetch_bucket_size", 213248},
                                          {"stage3_max_live_parameters", 2 * 213248},
                                          {"stage3_max_reuse_distance", 0},
                                          {"stage3_param_persistence_threshold", 0}});
  }
  j["train_micro_batch_size_per_gpu"] = 1;
  j["gradient_accumulation_steps"] = 1;
  j.erase("train_batch_size");
  if (off == OffloadDevice::nvme) {
    j["zero_optimization"]["offload_param"]["nvme_path"] = nvme_dir;
    j["zero_optimization"]["offload_optimizer"]["nvme_path"] = nvme_dir;
  }
  j["strata"] = {{"backend", "host"}, {"seed", 11}, {"cpu_optim", {{"pin_threads", false}}}};
  return Config::parse(nlohmann::json::parse(j.dump()));  // through text: size keys take unsigned JSON
}

struct Outcome {
  std::vector<double> losses;
  std::uint64_t device_peak = 0;        // the tier manager's peak of reserved device bytes
  std::uint64_t device_total_peak = 0;  // the device's own peak: the pool and the model's activations
  std::uint64_t gathers = 0;
  prefetch::PrefetchStats prefetch;
  MemoryPlan plan;
};

constexpr int kSteps = 10;
constexpr int kSeqLen = 16;

Outcome train(const Config& cfg, const model::ModelConfig& mcfg, const std::string& tokens, std::uint64_t cap,
              int seq_len = kSeqLen) {
  kernels::cpu::set_blas_threads(1);
  Engine engine(cfg, mcfg, {.backend = "", .device_memory_cap = cap, .seq_len = seq_len});
  model::TokenFile file = model::TokenFile::open(tokens);
  model::DataLoader data(file,
                         {.batch_size = 1, .seq_len = seq_len, .seed = 3, .vocab_size = mcfg.vocab_size});
  model::LlamaModel m(mcfg, engine.model_options());
  Outcome o;
  for (int i = 0; i < kSteps; ++i) {
    StepResult r = engine.train_batch(m, data);
    EXPECT_TRUE(r.applied) << "step " << i + 1;
    o.losses.push_back(r.loss);
  }
  o.device_peak = engine.tiers().pool_stats(tiering::Tier::device).reserved.peak;
  o.device_total_peak = engine.device().memory_stats().peak_in_use;
  EXPECT_LE(o.device_total_peak, engine.device().caps().capacity);
  o.gathers = engine.transfer_stats().gathers;
  o.prefetch = engine.prefetch_stats();
  o.plan = engine.plan();
  return o;
}

// The plan of an engine without a cap: the state and working set do not depend on the cap.
MemoryPlan unconstrained_plan(const Config& cfg, const model::ModelConfig& mcfg) {
  Engine engine(cfg, mcfg, {.backend = "", .device_memory_cap = 0, .seq_len = kSeqLen});
  return engine.plan();
}

// The device bytes of one block's gathered copy, and of all chunks gathered at once (persistent ones
// included: they are kept in the cache too).
struct Sizes {
  std::uint64_t block = 0, cacheable = 0;
};
Sizes sizes(const model::ModelConfig& mcfg) {
  model::ModelLayout layout(mcfg, {.tensor_align = 16, .chunk_multiple = 64});
  const tiering::AllocatorOptions da = tiering::device_allocator_options({});
  Sizes s;
  for (int c = 0; c < layout.num_chunks(); ++c) {
    const std::uint64_t b = tiering::CachingAllocator::block_bytes(da, layout.chunk(c).padded_numel * 4);
    s.cacheable += b;
    s.block = std::max(s.block, b);
  }
  return s;
}

// Caps: the smallest the plan accepts, then room for 1 and 3 more gathered blocks, then room for every
// chunk at once.
enum class Room { none, one, three, all };
const char* name(Room r) {
  return r == Room::none ? "min" : r == Room::one ? "min_plus_1" : r == Room::three ? "min_plus_3" : "all";
}

using Case = std::tuple<OffloadDevice, Knobs, Room>;
class DeviceRoom : public ::testing::TestWithParam<Case> {};

TEST_P(DeviceRoom, TrainsWithinTheCapWithTheUnconstrainedLosses) {
  const auto [off, knobs, room] = GetParam();
  ScratchDir d(std::string("room-") + test::name(off) + name(knobs) + name(room));
  const model::ModelConfig mcfg = deep_model();
  const Config cfg = user_config(knobs, off, d.path());
  const std::string tokens = make_tokens(d);

  const MemoryPlan p = unconstrained_plan(cfg, mcfg);
  const Sizes sz = sizes(mcfg);
  const std::uint64_t min_cap = p.device_need();
  ASSERT_GE(sz.cacheable, 2 * (min_cap - p.device_ops))
      << "the gathered chunks should be several times the smallest room beside the compute interface's";
  const std::uint64_t cap = min_cap + (room == Room::none    ? 0
                                       : room == Room::one   ? sz.block
                                       : room == Room::three ? 3 * sz.block
                                                             : sz.cacheable);

  const Outcome free_run = train(cfg, mcfg, tokens, 0);
  const Outcome o = train(cfg, mcfg, tokens, cap);
  ASSERT_EQ(o.losses.size(), std::size_t(kSteps));
  EXPECT_EQ(o.losses, free_run.losses) << "losses differ from the unconstrained run's";
  EXPECT_LE(o.device_peak, cap);
  EXPECT_EQ(o.plan.device_cache, cap - min_cap);
  // At the smallest cap the step peaks at exactly what the plan says: the plan is not padded. (The tier
  // manager's pool holds state, working set and cache; the model's activations and the compute
  // interface's own bytes are beside it.)
  if (room == Room::none) {
    EXPECT_EQ(o.device_peak, min_cap - o.plan.device_activations - o.plan.device_ops);
    EXPECT_EQ(o.device_total_peak, min_cap);
  }
}

TEST_P(DeviceRoom, PrefetchesWithoutThrashing) {
  const auto [off, knobs, room] = GetParam();
  ScratchDir d(std::string("thrash-") + test::name(off) + name(knobs) + name(room));
  const model::ModelConfig mcfg = deep_model();
  const Config cfg = user_config(knobs, off, d.path());
  const MemoryPlan p = unconstrained_plan(cfg, mcfg);
  const Sizes sz = sizes(mcfg);
  const std::uint64_t min_cap = p.device_need();
  const std::uint64_t cap = min_cap + (room == Room::none    ? 0
                                       : room == Room::one   ? sz.block
                                       : room == Room::three ? 3 * sz.block
                                                             : sz.cacheable);
  const Outcome o = train(cfg, mcfg, make_tokens(d), cap);
  const int chunks = int(mcfg.n_layers) + 2;
  const std::uint64_t acquires_per_step = std::uint64_t(2 * mcfg.n_layers + 3);  // embedding only forward
  // Never more than one gather per acquire.
  EXPECT_LE(o.gathers, kSteps * acquires_per_step);
  const prefetch::PrefetchStats& s = o.prefetch;
  const std::uint64_t replayed = (kSteps - 1) * acquires_per_step;
  EXPECT_EQ(s.hits + s.late + s.misses, replayed);
  EXPECT_EQ(s.invalidations, 0u);
  // With room for one chunk beyond the working set the next chunk is always on its way when it is needed.
  if (room != Room::none && knobs != Knobs::tight) {
    EXPECT_EQ(s.misses, 0u);
  }
  // With room for all of them and reuse allowed, each chunk is gathered once per step and kept for the
  // backward — after the first step, which records the order and so cannot know which chunks to keep
  // (its backward gathers every block again).
  if (room == Room::all && knobs != Knobs::tight) {
    EXPECT_EQ(o.gathers, std::uint64_t(kSteps * chunks + mcfg.n_layers));
  }
}

INSTANTIATE_TEST_SUITE_P(Caps, DeviceRoom,
                         ::testing::Combine(::testing::Values(OffloadDevice::cpu, OffloadDevice::nvme),
                                            ::testing::Values(Knobs::stock, Knobs::defaults, Knobs::tight),
                                            ::testing::Values(Room::none, Room::one, Room::three, Room::all)),
                         [](const auto& info) {
                           return std::string(test::name(std::get<0>(info.param))) + "_" +
                                  name(std::get<1>(info.param)) + "_" + name(std::get<2>(info.param));
                         });

TEST(DeviceRoom, OneByteBelowThePlanIsRefusedBeforeTraining) {
  ScratchDir d("room-below");
  const model::ModelConfig mcfg = deep_model();
  const Config cfg = user_config(Knobs::stock, OffloadDevice::cpu, d.path());
  const MemoryPlan p = unconstrained_plan(cfg, mcfg);
  // strata.checkpoint_activations "auto" checkpoints when keeping every activation does not fit, so the
  // smallest cap the plan accepts is the one with checkpointing.
  const std::uint64_t min_cap =
      p.device_state + p.device_working_set + p.device_activations_checkpointed + p.device_ops;
  EXPECT_THROW(Engine(cfg, mcfg, {.backend = "", .device_memory_cap = min_cap - 1, .seq_len = kSeqLen}),
               OutOfMemory);
  EXPECT_NO_THROW(Engine(cfg, mcfg, {.backend = "", .device_memory_cap = min_cap, .seq_len = kSeqLen}));
}

// The 10m preset (eight 6.75 MiB chunks gathered in fp32) with the stock configs/zero3_cpu.json — DeepSpeed's
// default reuse distance and live-parameter budget, which keep every released chunk they can — at micro-batch
// 1 x 32 tokens: from 15 MiB of room beside the compute interface's own bytes, where only the chunk in use
// and its gradient buffer fit beside the activations, to 48 MiB, where all but one chunk can stay gathered.
TEST(DeviceRoom, TenMillionPresetTrainsAtEveryCapFrom15To48MiB) {
  ScratchDir d("room-10m");
  const model::ModelConfig mcfg = model::ModelConfig::preset("10m");
  nlohmann::json j = read_json(strata::test::source_dir() + "/configs/zero3_cpu.json");
  j["scheduler"]["params"]["total_num_steps"] = 10000;  // what `strata train` takes from the run
  j["train_micro_batch_size_per_gpu"] = 1;
  j["gradient_accumulation_steps"] = 1;
  j["strata"] = {{"backend", "host"}, {"seed", 5}, {"cpu_optim", {{"pin_threads", false}}}};
  const Config cfg = Config::parse(nlohmann::json::parse(j.dump()));
  const std::string tokens = make_tokens(d);
  constexpr int kTokens = 32;
  const Outcome free_run = train(cfg, mcfg, tokens, 0, kTokens);
  for (std::uint64_t mib : {15, 16, 18, 20, 24, 28, 32, 40, 48}) {
    const std::uint64_t cap = free_run.plan.device_ops + (mib << 20);
    SCOPED_TRACE("room " + std::to_string(mib) + " MiB");
    const Outcome o = train(cfg, mcfg, tokens, cap, kTokens);
    EXPECT_EQ(o.losses, free_run.losses);
    EXPECT_LE(o.device_total_peak, cap);
  }
}

// State on the device (offload_param or offload_optimizer "none") shares the device with the working set
// and the cache; the allocator must not lose room to fragmentation between them. Every cap from the
// smallest accepted to 20% more room beside the compute interface's own bytes (in 2% steps) trains 10 steps
// with the unconstrained losses.
using StateCase = std::tuple<OffloadDevice, OffloadDevice>;
class DeviceState : public ::testing::TestWithParam<StateCase> {};

TEST_P(DeviceState, EveryCapFromThePlanUpTrains) {
  const auto [param, optim] = GetParam();
  ScratchDir d(std::string("state-") + test::name(param) + test::name(optim));
  const model::ModelConfig mcfg = model::ModelConfig::preset("tiny");
  nlohmann::json j = read_json(strata::test::source_dir() + "/configs/zero3_cpu.json");
  j["scheduler"]["params"]["total_num_steps"] = 10000;  // what `strata train` takes from the run
  j["train_micro_batch_size_per_gpu"] = 1;
  j["gradient_accumulation_steps"] = 1;
  j["zero_optimization"].merge_patch({{"offload_param", {{"device", test::name(param)}}},
                                      {"offload_optimizer", {{"device", test::name(optim)}}},
                                      {"stage3_prefetch_bucket_size", 0},
                                      {"stage3_max_live_parameters", 0},
                                      {"stage3_max_reuse_distance", 0},
                                      {"stage3_param_persistence_threshold", 0}});
  j["strata"] = {{"backend", "host"}, {"seed", 5}, {"cpu_optim", {{"pin_threads", false}}}};
  const Config cfg = Config::parse(nlohmann::json::parse(j.dump()));
  const std::string tokens = make_tokens(d);
  const MemoryPlan p = unconstrained_plan(cfg, mcfg);
  ASSERT_GT(p.device_state, 0u);
  const std::uint64_t min_cap = p.device_need(), min_room = min_cap - p.device_ops;
  const Outcome free_run = train(cfg, mcfg, tokens, 0);
  for (int pct = 0; pct <= 20; pct += 2) {
    const std::uint64_t cap = min_cap + min_room * std::uint64_t(pct) / 100;
    SCOPED_TRACE("cap " + std::to_string(cap) + " (plan + " + std::to_string(pct) + "%)");
    const Outcome o = train(cfg, mcfg, tokens, cap);
    EXPECT_EQ(o.losses, free_run.losses);
    EXPECT_LE(o.device_peak, cap);
  }
}

INSTANTIATE_TEST_SUITE_P(Placements, DeviceState,
                         ::testing::Values(StateCase{OffloadDevice::none, OffloadDevice::cpu},
                                           StateCase{OffloadDevice::cpu, OffloadDevice::none},
                                           StateCase{OffloadDevice::none, OffloadDevice::none}),
                         [](const auto& info) {
                           return std::string("param_") + test::name(std::get<0>(info.param)) + "_optim_" +
                                  test::name(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace strata::zero3
