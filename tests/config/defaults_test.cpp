// Keys left out take DeepSpeed's code defaults, including the ones that depend on other keys.
#include "config_test_util.h"

namespace strata {
namespace {

TEST(Defaults, MinimalConfigHasDeepSpeedDefaults) {
  Config c = Config::parse({{"train_batch_size", 8}});
  EXPECT_EQ(c.zero_optimization.stage, 0);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500000000u);
  EXPECT_EQ(c.zero_optimization.allgather_bucket_size, 500000000u);
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 50000000u);
  EXPECT_EQ(c.zero_optimization.stage3_param_persistence_threshold, 100000u);
  EXPECT_EQ(c.zero_optimization.stage3_max_live_parameters, 1000000000u);
  EXPECT_EQ(c.zero_optimization.sub_group_size, 1000000000u);
  EXPECT_TRUE(c.zero_optimization.contiguous_gradients);
  EXPECT_EQ(c.zero_optimization.offload_param.buffer_count, 5);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.buffer_count, 4);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_EQ(c.aio.block_size, 1048576u);
  EXPECT_EQ(c.aio.queue_depth, 8);
  EXPECT_TRUE(c.aio.overlap_events);
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_EQ(c.optimizer.type, OptimizerType::Adam);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
  EXPECT_EQ(c.scheduler.type, SchedulerType::none);
  EXPECT_EQ(c.strata.backend, StrataConfig::Backend::automatic);
  EXPECT_EQ(c.strata.loss_weighting, StrataConfig::LossWeighting::tokens);
  EXPECT_EQ(c.strata.log_level, log::Level::info);
  EXPECT_TRUE(c.warnings().empty());
}

TEST(Defaults, OverlapCommIsOnAtStage3AndOffBelow) {
  EXPECT_TRUE(Config::parse({{"train_batch_size", 8}, {"zero_optimization", {{"stage", 3}}}})
                  .zero_optimization.overlap_comm);
  EXPECT_FALSE(Config::parse({{"train_batch_size", 8}, {"zero_optimization", {{"stage", 2}}}})
                   .zero_optimization.overlap_comm);
}

TEST(Defaults, AdagradHasItsOwnLearningRateAndEpsilon) {
  Config c = Config::parse({{"train_batch_size", 8}, {"optimizer", {{"type", "adagrad"}}}});
  EXPECT_EQ(c.optimizer.type, OptimizerType::Adagrad);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-2);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-10);
}

TEST(Defaults, NullMeansNotGiven) {
  Config c = Config::parse(
      {{"train_batch_size", 8},
       {"zero_optimization", {{"stage", 3}, {"offload_param", nullptr}, {"reduce_bucket_size", nullptr}}}});
  EXPECT_EQ(c.zero_optimization.offload_param.device, OffloadDevice::none);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500000000u);
  EXPECT_EQ(c.source("zero_optimization.reduce_bucket_size"), "default");
}

TEST(Defaults, StrataKnobsParse) {
  Config c = Config::parse({{"train_batch_size", 8},
                            {"strata",
                             {{"backend", "host"},
                              {"device_memory_cap", "8GiB"},
                              {"aio", {{"backend", "io_uring"}}},
                              {"memprof", {{"path", "trace.json"}, {"sample_interval_ms", 5}}},
                              {"threads", 2},
                              {"cpu_optim", {{"simd", "avx2"}, {"pin_threads", false}}},
                              {"log_level", "debug"},
                              {"loss_weighting", "micro_batches"},
                              {"seed", 7}}}});
  EXPECT_EQ(c.strata.backend, StrataConfig::Backend::host);
  EXPECT_EQ(c.strata.device_memory_cap, 8ull << 30);
  EXPECT_EQ(c.strata.aio.backend, StrataConfig::AioBackend::io_uring);
  EXPECT_EQ(c.strata.memprof.path, "trace.json");
  EXPECT_EQ(c.strata.memprof.sample_interval_ms, 5);
  EXPECT_EQ(c.strata.threads, 2);
  EXPECT_EQ(c.strata.cpu_optim.simd, "AVX2");  // matched ignoring case, stored as Highway names it
  EXPECT_FALSE(c.strata.cpu_optim.pin_threads);
  EXPECT_EQ(c.strata.log_level, log::Level::debug);
  EXPECT_EQ(c.strata.seed, 7);
  EXPECT_EQ(c.strata.loss_weighting, StrataConfig::LossWeighting::micro_batches);
}

}  // namespace
}  // namespace strata
