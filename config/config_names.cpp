// Names outside the key table: alternative and deprecated DeepSpeed spellings, the DeepSpeed keys Strata
// knowingly ignores (one warning each), and the command-line override names. docs/config.md lists all
// three; the keys themselves are in config_schema.cpp.
#include "config/config_impl.h"

namespace strata::config_detail {
namespace {

std::vector<Alias> build_aliases() {
  return {
      {"zero_optimization.cpu_offload",
       nullptr,
       {{"zero_optimization.offload_optimizer.device", "cpu"}},
       true,
       "use zero_optimization.offload_optimizer.device: \"cpu\""},
      {"zero_optimization.cpu_offload_param",
       nullptr,
       {{"zero_optimization.offload_param.device", "cpu"}},
       true,
       "use zero_optimization.offload_param.device: \"cpu\""},
      {"zero_optimization.cpu_offload_use_pin_memory",
       nullptr,
       {{"zero_optimization.offload_param.pin_memory", true},
        {"zero_optimization.offload_optimizer.pin_memory", true}},
       true,
       "use pin_memory in offload_param and offload_optimizer"},
      {"zero_optimization.stage3_gather_fp16_weights_on_model_save",
       "zero_optimization.stage3_gather_16bit_weights_on_model_save",
       {},
       true,
       "use stage3_gather_16bit_weights_on_model_save"},
      {"aio.thread_count", "aio.intra_op_parallelism", {}, true, "use aio.intra_op_parallelism"},
      {"bfloat16", "bf16", {}, true, "use bf16"},
      // DeepSpeed's own field names for the stage3_* keys (it accepts both spellings).
      {"zero_optimization.prefetch_bucket_size",
       "zero_optimization.stage3_prefetch_bucket_size",
       {},
       false,
       "DeepSpeed's field name"},
      {"zero_optimization.param_persistence_threshold",
       "zero_optimization.stage3_param_persistence_threshold",
       {},
       false,
       "DeepSpeed's field name"},
      {"zero_optimization.max_live_parameters",
       "zero_optimization.stage3_max_live_parameters",
       {},
       false,
       "DeepSpeed's field name"},
      {"zero_optimization.max_reuse_distance",
       "zero_optimization.stage3_max_reuse_distance",
       {},
       false,
       "DeepSpeed's field name"},
      {"zero_optimization.gather_16bit_weights_on_model_save",
       "zero_optimization.stage3_gather_16bit_weights_on_model_save",
       {},
       false,
       "DeepSpeed's field name"},
  };
}

std::vector<Ignored> build_ignored() {
  const char* monitor =
      "this monitoring backend is not implemented; tensorboard and csv_monitor write the per-step metrics "
      "and memprof writes traces (strata.memprof.path)";
  const char* feature = "this DeepSpeed feature is not implemented in Strata";
  const char* zeropp = "ZeRO++/MiCS variants are not implemented";
  const char* torch_only = "applies to PyTorch modules; Strata's engine has no equivalent";
  return {
      {"wandb",
       "Strata has no wandb writer (wandb's client is Python and sends to its service): use tensorboard "
       "(its event files upload with `wandb sync --sync-tensorboard DIR`) or csv_monitor",
       true},
      {"comet", monitor},
      {"flops_profiler", feature},
      {"comms_logger", feature},
      {"autotuning", "not implemented; set batch sizes and offload targets explicitly"},
      {"elasticity", feature},
      {"compression_training", feature},
      {"data_efficiency", feature},
      {"curriculum_learning", feature},
      {"sparse_attention", feature},
      {"pipeline", "pipeline parallelism is not implemented"},
      {"amp", "use fp16 or bf16"},
      {"torch_autocast", "use fp16 or bf16"},
      {"compile", torch_only},
      {"checkpoint.tag_validation", "Strata checks every rank's tag itself (one commit for all ranks)"},
      {"checkpoint.load_universal", "Strata's checkpoints load at any world size, stage or placement"},
      {"checkpoint.use_node_local_storage", "Strata writes its own checkpoint layout"},
      {"checkpoint.parallel_write", "Strata writes its own checkpoint layout"},
      {"checkpoint.writer", "Strata writes its own checkpoint layout"},
      {"nebula", "Strata writes its own checkpoint layout"},
      {"data_types", "gradients always accumulate in fp32"},
      {"communication_data_type", "collectives use the working dtype (bf16/fp16) and fp32 for gradients"},
      {"seq_parallel_communication_data_type", "sequence parallelism is not implemented"},
      {"quantize_training", feature},
      {"weight_quantization", feature},
      {"eigenvalue", feature},
      {"progressive_layer_drop", feature},
      {"hybrid_engine", feature},
      {"timers", feature},
      {"zero_allow_untested_optimizer", "Strata runs only its own optimizers"},
      {"zero_force_ds_cpu_optimizer", "Strata runs only its own optimizers"},
      {"prescale_gradients", feature},
      {"gradient_predivide_factor", feature},
      {"sparse_gradients", feature},
      {"dump_state", feature},
      {"disable_allgather", feature},
      {"dataloader_drop_last", "the data loader is configured on the command line"},
      {"optimizer.legacy_fusion", torch_only},
      {"optimizer.params.max_grad_norm", "use gradient_clipping"},
      {"fp16.fp16_master_weights_and_grads", "master weights and gradients are always fp32"},
      {"bf16.bf16_master_weights_and_grads", "master weights and gradients are always fp32"},
      {"bf16.bf16_optimizer_states", "optimizer states are always fp32"},
      {"bf16.immediate_grad_update", torch_only},
      {"bf16.check_grad_overflow", "bf16 runs without overflow checks"},
      {"zero_optimization.load_from_fp32_weights", "checkpoints always hold the fp32 master weights"},
      {"zero_optimization.elastic_checkpoint", feature},
      {"zero_optimization.ignore_unused_parameters", torch_only},
      {"zero_optimization.legacy_stage1", feature},
      {"zero_optimization.use_multi_rank_bucket_allreduce", feature},
      {"zero_optimization.stage3_model_persistence_threshold", feature},
      {"zero_optimization.model_persistence_threshold", feature},
      {"zero_optimization.stage3_module_granularity_threshold", torch_only},
      {"zero_optimization.module_granularity_threshold", torch_only},
      {"zero_optimization.stage3_use_all_reduce_for_fetch_params", feature},
      {"zero_optimization.use_all_reduce_for_fetch_params", feature},
      {"zero_optimization.memory_efficient_linear", torch_only},
      {"zero_optimization.override_module_apply", torch_only},
      {"zero_optimization.pipeline_loading_checkpoint", feature},
      {"zero_optimization.log_trace_cache_warnings", "trace changes are always logged"},
      {"zero_optimization.zero_hpz_partition_size", zeropp},
      {"zero_optimization.zero_quantized_weights", zeropp},
      {"zero_optimization.zero_quantized_nontrainable_weights", zeropp},
      {"zero_optimization.zero_quantized_gradients", zeropp},
      {"zero_optimization.zeropp_loco_param", zeropp},
      {"zero_optimization.mics_shard_size", zeropp},
      {"zero_optimization.mics_hierarchical_params_gather", zeropp},
  };
}

std::vector<OverrideName> build_override_names() {
  return {
      {"lr", Kind::real, "optimizer.params.lr and scheduler.params.warmup_max_lr"},
      {"betas", Kind::real_pair, "optimizer.params.betas ([beta1, beta2])"},
      {"eps", Kind::real, "optimizer.params.eps"},
      {"weight_decay", Kind::real, "optimizer.params.weight_decay"},
      {"micro_batch", Kind::integer, "train_micro_batch_size_per_gpu"},
      {"grad_accum", Kind::integer, "gradient_accumulation_steps"},
      {"train_batch", Kind::integer, "train_batch_size"},
      {"grad_clip", Kind::real, "gradient_clipping"},
      {"fp16", Kind::boolean, "fp16.enabled"},
      {"bf16", Kind::boolean, "bf16.enabled"},
      {"warmup_min_lr", Kind::real, "scheduler.params.warmup_min_lr"},
      {"warmup_steps", Kind::integer, "scheduler.params.warmup_num_steps"},
      {"total_steps", Kind::integer, "scheduler.params.total_num_steps"},
      {"hidden_size", Kind::integer,
       "the model's hidden size: zero_optimization.reduce_bucket_size, stage3_prefetch_bucket_size and "
       "stage3_param_persistence_threshold"},
      {"world_size", Kind::integer, "ranks in the job (replaces the world_size argument)"},
  };
}

}  // namespace

const std::vector<Alias>& aliases() {
  static const std::vector<Alias> table = build_aliases();
  return table;
}

const std::vector<Ignored>& ignored() {
  static const std::vector<Ignored> table = build_ignored();
  return table;
}

const std::vector<OverrideName>& override_names() {
  static const std::vector<OverrideName> table = build_override_names();
  return table;
}

}  // namespace strata::config_detail
