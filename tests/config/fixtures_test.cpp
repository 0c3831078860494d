// Configs shaped like the ones DeepSpeed users have parse with DeepSpeed's meaning.
#include "config_test_util.h"

namespace strata {
namespace {

using testing::any_contains;
using testing::fixture_path;

TEST(Fixtures, Zero3CpuOffloadParsesEveryKeyAndInfersAccumulation) {
  Config c = Config::load(fixture_path("zero3_cpu_offload.json"));
  EXPECT_EQ(c.train_batch_size, 32);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 8);  // 32 / 4 / world 1
  EXPECT_EQ(c.source("gradient_accumulation_steps"), "inferred");
  EXPECT_EQ(c.optimizer.type, OptimizerType::AdamW);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-5);
  EXPECT_DOUBLE_EQ(c.optimizer.betas[1], 0.95);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.1);
  EXPECT_EQ(c.scheduler.type, SchedulerType::WarmupDecayLR);
  EXPECT_EQ(c.scheduler.total_num_steps, 10000);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 500);
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_FALSE(c.fp16.enabled);
  const ZeroConfig& z = c.zero_optimization;
  EXPECT_EQ(z.stage, 3);
  EXPECT_EQ(z.offload_optimizer.device, OffloadDevice::cpu);
  EXPECT_EQ(z.offload_param.device, OffloadDevice::cpu);
  EXPECT_TRUE(z.offload_param.pin_memory);
  EXPECT_EQ(z.sub_group_size, 1000000000u);
  EXPECT_EQ(z.stage3_prefetch_bucket_size, 500000000u);
  EXPECT_EQ(z.stage3_param_persistence_threshold, 1000000u);
  EXPECT_TRUE(z.stage3_gather_16bit_weights_on_model_save);
  EXPECT_EQ(c.source("zero_optimization.allgather_bucket_size"), "default");
  // Its reduce_bucket_size is accepted without effect (no_effect_test.cpp); overlap_comm,
  // contiguous_gradients and the 16-bit gather ask for what Strata does anyway.
  ASSERT_EQ(c.warnings().size(), 1u);
  EXPECT_TRUE(
      testing::contains(c.warnings()[0], "zero_optimization.reduce_bucket_size: 500000000 has no effect"))
      << c.warnings()[0];
}

TEST(Fixtures, Zero3NvmeOffloadParsesWithAnExistingSwapDirectory) {
  nlohmann::json doc = testing::read_json(fixture_path("zero3_nvme_offload.json"));
  test::ScratchDir dir("config");
  const std::string& swap = dir.path();
  doc["zero_optimization"]["offload_param"]["nvme_path"] = swap;
  doc["zero_optimization"]["offload_optimizer"]["nvme_path"] = swap;
  Config c = Config::parse(doc);
  EXPECT_EQ(c.train_batch_size, 4);  // 1 × 4 × world 1
  EXPECT_EQ(c.zero_optimization.offload_param.device, OffloadDevice::nvme);
  EXPECT_EQ(c.zero_optimization.offload_param.nvme_paths, std::vector<std::string>{swap});
  EXPECT_EQ(c.zero_optimization.offload_param.buffer_size, 100000000u);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, OffloadDevice::nvme);
  EXPECT_TRUE(c.zero_optimization.offload_optimizer.pipeline_read);
  EXPECT_TRUE(c.zero_optimization.offload_optimizer.pipeline_write);
  EXPECT_EQ(c.zero_optimization.sub_group_size, 100000000u);
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.initial_scale_power, 12);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);  // DeepSpeed default for a key left out
  EXPECT_EQ(c.aio.intra_op_parallelism, 1);   // through the deprecated thread_count
  EXPECT_EQ(c.source("aio.intra_op_parallelism"), "alias aio.thread_count");
  EXPECT_TRUE(any_contains(c.warnings(), "aio.thread_count: deprecated"));
  EXPECT_EQ(c.optimizer.type, OptimizerType::Adam);
  EXPECT_TRUE(c.optimizer.adam_w_mode);  // DeepSpeed's Adam decouples weight decay by default
}

TEST(Fixtures, Fp16Zero2KeepsEveryLossScaleKeyAndSplitsTheBatchOverRanks) {
  Config c = Config::load(fixture_path("fp16_zero2_loss_scale.json"), {}, /*world_size=*/4);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 8);  // 64 / 4 ranks / 2 steps
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_FALSE(c.fp16.auto_cast);
  EXPECT_DOUBLE_EQ(c.fp16.loss_scale, 0.0);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_FALSE(c.fp16.consecutive_hysteresis);
  EXPECT_DOUBLE_EQ(c.fp16.min_loss_scale, 1.0);
  EXPECT_EQ(c.zero_optimization.stage, 2);
  EXPECT_EQ(c.zero_optimization.allgather_bucket_size, 200000000u);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 200000000u);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, OffloadDevice::cpu);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.steps_per_print, 2000);
}

TEST(Fixtures, Bf16CosineLionParsesWithItsTensorBoardSection) {
  Config c = Config::load(fixture_path("bf16_zero3_cosine.json"), {}, /*world_size=*/8);
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_EQ(c.optimizer.type, OptimizerType::Lion);  // "lion": matched ignoring case
  EXPECT_DOUBLE_EQ(c.optimizer.betas[1], 0.99);
  EXPECT_EQ(c.source("optimizer.params.eps"), "");  // Lion has no eps: not in force
  EXPECT_EQ(c.scheduler.type, SchedulerType::WarmupCosineLR);
  EXPECT_EQ(c.scheduler.warmup_type, WarmupType::linear);
  EXPECT_DOUBLE_EQ(c.scheduler.cos_min_ratio, 0.1);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_min_ratio, 0.01);
  // activation_checkpointing's keys are read (checkpointing_test.cpp), tensorboard's too.
  EXPECT_TRUE(c.warnings().empty()) << c.warnings()[0];
  EXPECT_TRUE(c.tensorboard.enabled);
  EXPECT_EQ(c.tensorboard.output_path, "logs/");
  EXPECT_EQ(c.tensorboard.job_name, "llama-run");
  EXPECT_EQ(c.activation_checkpointing.cpu_checkpointing,
            ActivationCheckpointingConfig::CpuCheckpointing::off);
}

TEST(Fixtures, HuggingFaceAutoValuesResolveFromTheCommandLine) {
  Overrides cli{{"lr", 2e-5},          {"betas", {0.9, 0.98}}, {"eps", 1e-6},      {"weight_decay", 0.01},
                {"micro_batch", 2},    {"grad_accum", 8},      {"grad_clip", 1.0}, {"bf16", true},
                {"warmup_steps", 100}, {"hidden_size", 4096}};
  Config c = Config::load(fixture_path("hf_zero3_auto.json"), cli, /*world_size=*/2);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 2e-5);
  EXPECT_DOUBLE_EQ(c.optimizer.betas[1], 0.98);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_max_lr, 2e-5);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_min_lr, 0.0);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 100);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 2);
  EXPECT_EQ(c.gradient_accumulation_steps, 8);
  EXPECT_EQ(c.train_batch_size, 32);  // 2 × 8 × world 2
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 4096u * 4096u);
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 15099494u);  // int(0.9 × 4096²)
  EXPECT_EQ(c.zero_optimization.stage3_param_persistence_threshold, 40960u);
  EXPECT_EQ(c.source("optimizer.params.lr"), "auto→override lr");
  EXPECT_EQ(c.source("train_batch_size"), "auto→inferred");
  EXPECT_EQ(c.source("zero_optimization.reduce_bucket_size"), "auto→hidden_size²");
}

TEST(Fixtures, LegacyCpuOffloadFlagBecomesOptimizerOffload) {
  Config c = Config::load(fixture_path("legacy_cpu_offload.json"));
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, OffloadDevice::cpu);
  EXPECT_EQ(c.source("zero_optimization.offload_optimizer.device"), "alias zero_optimization.cpu_offload");
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 16);
  EXPECT_TRUE(any_contains(c.warnings(), "zero_optimization.cpu_offload: deprecated"));
  EXPECT_TRUE(any_contains(c.warnings(), "zero_allow_untested_optimizer: ignored"));
}

}  // namespace
}  // namespace strata
