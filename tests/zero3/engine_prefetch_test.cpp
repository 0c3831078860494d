// The prefetcher inside the engine: a fixed model has no misses after its first step, with NVMe-resident
// parameters too; a changed acquire order is detected, re-recorded, and then prefetched again.
#include <gtest/gtest.h>

#include "engine_util.h"

namespace strata::zero3 {
namespace {

using test::make_config;
using test::make_tokens;
using test::ScratchDir;

class EnginePrefetch : public ::testing::TestWithParam<OffloadDevice> {};

TEST_P(EnginePrefetch, NoMissesAfterTheFirstStep) {
  ScratchDir d("eprefetch");
  // Reuse distance 0: every chunk is dropped on release and must be prefetched again.
  Config cfg = make_config(GetParam(), OffloadDevice::cpu, d.path(),
                           {{"zero_optimization", {{"stage3_max_reuse_distance", 0}}}});
  const model::ModelConfig mcfg = model::ModelConfig::preset("tiny");
  Engine engine(cfg, mcfg, {.backend = "", .device_memory_cap = 0, .seq_len = 32});
  model::TokenFile file = model::TokenFile::open(make_tokens(d));
  model::DataLoader data(file, {.batch_size = 2, .seq_len = 32, .seed = 3, .vocab_size = 256});
  model::LlamaModel m(mcfg, engine.model_options());
  engine.train_batch(m, data);
  const prefetch::PrefetchStats first = engine.prefetch_stats();
  EXPECT_GT(first.recording_fetches, 0u);
  for (int i = 0; i < 3; ++i) engine.train_batch(m, data);
  const prefetch::PrefetchStats& s = engine.prefetch_stats();
  EXPECT_EQ(s.misses, 0u);
  EXPECT_GT(s.issued, 0u);
  EXPECT_EQ(s.hits + s.late, 3u * 2u * 7u + (first.hits + first.late));  // 3 steps x 2 micro x 7 acquires
  EXPECT_EQ(s.invalidations, 0u);
}

INSTANTIATE_TEST_SUITE_P(ParamHomes, EnginePrefetch,
                         ::testing::Values(OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme),
                         [](const auto& info) { return std::string(test::name(info.param)); });

// A pass the way another model would drive the engine: acquire/release in `order`.
void custom_pass(Engine& e, const std::vector<int>& order) {
  e.begin_pass();
  for (int c : order) {
    model::ChunkView v = e.acquire(c);
    EXPECT_NE(v.data, nullptr);
    e.release(c);
  }
  e.end_pass();
}

TEST(EnginePrefetch, ChangedOrderIsReRecordedAndPrefetchedAgain) {
  ScratchDir d("eprefetch-order");
  Config cfg = make_config(OffloadDevice::nvme, OffloadDevice::cpu, d.path(),
                           {{"zero_optimization", {{"stage3_max_reuse_distance", 0}}}});
  Engine engine(cfg, model::ModelConfig::preset("tiny"));
  const std::vector<int> a = {0, 1, 2, 3, 3, 2, 1}, b = {0, 2, 1, 3, 3, 1, 2};
  custom_pass(engine, a);
  custom_pass(engine, a);
  EXPECT_EQ(engine.prefetch_stats().misses, 0u);
  custom_pass(engine, b);  // diverges at position 1
  EXPECT_EQ(engine.prefetch_stats().invalidations, 1u);
  const std::uint64_t misses = engine.prefetch_stats().misses;
  custom_pass(engine, b);
  custom_pass(engine, b);
  EXPECT_EQ(engine.prefetch_stats().misses, misses);  // the new order is prefetched
  EXPECT_EQ(engine.prefetch_stats().invalidations, 1u);
}

}  // namespace
}  // namespace strata::zero3
