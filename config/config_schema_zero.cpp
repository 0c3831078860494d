// The config schema's zero_optimization section (DeepSpeed's runtime/zero/config.py and offload_config.py):
// stage, the offload targets, bucket and prefetch sizes, and the switches Strata accepts without effect.
// Appended by build_options (config_schema.cpp) in table order.
#include <iterator>

#include "config/config_schema_util.h"
#include "core/error.h"

namespace strata::config_detail {
namespace {

// DeepSpeed's overlap_comm_valid: unset means true at stage 3, false otherwise.
nlohmann::json overlap_default(const Config& c) {
  return c.zero_optimization.stage == 3;
}
// Hugging Face's hidden-size rules for ZeRO buckets; DeepSpeed's default when hidden_size is unknown.
AutoValue no_hidden(std::uint64_t def) {
  return {def, "auto→default (no hidden_size)",
          "DeepSpeed's default: no hidden_size is known (give the model, or override hidden_size)"};
}
AutoValue hidden_squared(const AutoContext& c) {
  if (!c.hidden_size) return no_hidden(500000000u);
  return {*c.hidden_size * *c.hidden_size, "auto→hidden_size²",
          detail::cat("hidden_size² with hidden_size ", *c.hidden_size)};
}
AutoValue hidden_squared_09(const AutoContext& c) {
  if (!c.hidden_size) return no_hidden(50000000u);
  return {*c.hidden_size * *c.hidden_size * 9 / 10, "auto→0.9·hidden_size²",
          detail::cat("0.9·hidden_size² with hidden_size ", *c.hidden_size)};
}
// offload_optimizer.ratio: the engine measures and chooses (ZeroConfig's ratio_auto), 1 until then.
AutoValue ratio_measured(const AutoContext&) {
  return {nullptr, "auto→measured at start-up"};
}
// offload_param.device and offload_optimizer.device: the engine chooses (device_auto), none until then.
AutoValue placement_chosen(const AutoContext&) {
  return {nullptr, "auto→chosen at start-up"};
}
AutoValue hidden_times_10(const AutoContext& c) {
  if (!c.hidden_size) return no_hidden(100000u);
  return {*c.hidden_size * 10, "auto→10·hidden_size",
          detail::cat("10·hidden_size with hidden_size ", *c.hidden_size)};
}

// Keys without effect (Note [Keys without effect]): the value that asks for what Strata does anyway.
nlohmann::json always_true(const Config&) {
  return true;
}

const std::vector<std::string> kDevices(std::begin(kOffloadDeviceNames), std::end(kOffloadDeviceNames));
const char* const kHidden = "hidden_size² (override hidden_size), else the default";

}  // namespace

void add_zero_options(std::vector<Option>& o) {
  o.push_back({.path = "zero_optimization.stage",
               .kind = Kind::integer,
               .def = 0,
               .meaning = "ZeRO stage: 0 off, 1 optimizer states, 2 + gradients, 3 + parameters partitioned.",
               .field = STRATA_FIELD(zero_optimization.stage),
               .min = 0,
               .max = 3});
  o.push_back(
      {.path = "zero_optimization.offload_param.device",
       .kind = Kind::choice,
       .def = "none",
       .meaning = "Home of the working parameters: device memory, pinned host memory or NVMe (stage 3).",
       .field = STRATA_FIELD(zero_optimization.offload_param.device),
       .choices = kDevices,
       .unsupported = {"hpu"},
       .auto_fallback = placement_chosen,
       .auto_note =
           "the fastest placement that fits, by the step-time model (printed with the table it chose from)"});
  o.push_back({.path = "zero_optimization.offload_param.nvme_path",
               .kind = Kind::paths,
               .def = nullptr,
               .meaning =
                   "Directory for parameter swap files, or a list of them, one per drive (each swap file "
                   "striped over all); each must exist and be writable when device is nvme.",
               .field = STRATA_FIELD(zero_optimization.offload_param.nvme_paths)});
  o.push_back({.path = "zero_optimization.offload_param.pin_memory",
               .kind = Kind::boolean,
               .def = false,
               .meaning = "Keep offloaded parameters in page-locked host memory.",
               .field = STRATA_FIELD(zero_optimization.offload_param.pin_memory)});
  o.push_back({.path = "zero_optimization.offload_param.buffer_count",
               .kind = Kind::integer,
               .def = 5,
               .meaning = "Buffers in the pool that stages NVMe parameter reads.",
               .field = STRATA_FIELD(zero_optimization.offload_param.buffer_count),
               .min = 0});
  o.push_back({.path = "zero_optimization.offload_param.buffer_size",
               .kind = Kind::count,
               .def = 100000000u,
               .meaning = "Elements per NVMe parameter buffer.",
               .field = STRATA_FIELD(zero_optimization.offload_param.buffer_size)});
  o.push_back({.path = "zero_optimization.offload_param.max_in_cpu",
               .kind = Kind::count,
               .def = 1000000000u,
               .meaning =
                   "Parameter elements kept in host memory when parameters live on NVMe (none when the "
                   "optimizer and the gradients are on NVMe too: pinned memory then holds buffers only).",
               .field = STRATA_FIELD(zero_optimization.offload_param.max_in_cpu)});
  o.push_back(
      {.path = "zero_optimization.offload_optimizer.device",
       .kind = Kind::choice,
       .def = "none",
       .meaning = "Home of the fp32 master weights and optimizer states; cpu and nvme also run the "
                  "optimizer on the CPU (nvme: stage 3).",
       .field = STRATA_FIELD(zero_optimization.offload_optimizer.device),
       .choices = kDevices,
       .unsupported = {"hpu"},
       .auto_fallback = placement_chosen,
       .auto_note =
           "the fastest placement that fits, by the step-time model (printed with the table it chose from)"});
  o.push_back({.path = "zero_optimization.offload_optimizer.nvme_path",
               .kind = Kind::paths,
               .def = nullptr,
               .meaning =
                   "Directory for optimizer-state swap files, or a list of them, one per drive (each swap "
                   "file striped over all); each must exist and be writable when device is nvme.",
               .field = STRATA_FIELD(zero_optimization.offload_optimizer.nvme_paths)});
  o.push_back({.path = "zero_optimization.offload_optimizer.pin_memory",
               .kind = Kind::boolean,
               .def = false,
               .meaning = "Keep offloaded optimizer states and gradients in page-locked host memory.",
               .field = STRATA_FIELD(zero_optimization.offload_optimizer.pin_memory)});
  o.push_back({.path = "zero_optimization.offload_optimizer.buffer_count",
               .kind = Kind::integer,
               .def = 4,
               .meaning = "Buffers for NVMe optimizer-state swapping (at least the states per parameter).",
               .field = STRATA_FIELD(zero_optimization.offload_optimizer.buffer_count),
               .min = 0});
  o.push_back({.path = "zero_optimization.offload_optimizer.pipeline_read",
               .kind = Kind::boolean,
               .def = false,
               .meaning = "Read the next sub-group's states from NVMe while the current one is updated.",
               .field = STRATA_FIELD(zero_optimization.offload_optimizer.pipeline_read)});
  o.push_back({.path = "zero_optimization.offload_optimizer.pipeline_write",
               .kind = Kind::boolean,
               .def = false,
               .meaning = "Write the previous sub-group's states to NVMe while the current one is updated.",
               .field = STRATA_FIELD(zero_optimization.offload_optimizer.pipeline_write)});
  o.push_back({.path = "zero_optimization.offload_optimizer.fast_init",
               .kind = Kind::boolean,
               .def = false,
               .meaning = "Initialise NVMe-resident optimizer states without a read-modify-write pass.",
               .field = STRATA_FIELD(zero_optimization.offload_optimizer.fast_init)});
  o.push_back(
      {.path = "zero_optimization.offload_optimizer.ratio",
       .kind = Kind::real,
       .def = 1.0,
       .meaning = "Fraction of the optimizer sub-groups offloaded (the last ones); the first 1 - ratio keep "
                  "master, states and gradients on the device, stepped there beside the CPU optimizer. "
                  "Stage 3 with device cpu or nvme: below 1 or \"auto\" with device none or below stage 3 "
                  "is an error.",
       .field = STRATA_FIELD(zero_optimization.offload_optimizer.ratio),
       .min = 0,
       .max = 1,
       .auto_fallback = ratio_measured,
       .auto_note = "chosen at start-up from the measured device and CPU optimizer throughput and the device "
                    "memory left (printed)"});
  o.push_back({.path = "zero_optimization.stage3_prefetch_bucket_size",
               .kind = Kind::count,
               .def = 50000000u,
               .meaning = "Parameter elements fetched ahead of use (bounds the prefetcher).",
               .field = STRATA_FIELD(zero_optimization.stage3_prefetch_bucket_size),
               .auto_fallback = hidden_squared_09,
               .auto_note = "0.9·hidden_size² (override hidden_size), else the default"});
  o.push_back({.path = "zero_optimization.stage3_max_live_parameters",
               .kind = Kind::count,
               .def = 1000000000u,
               .meaning = "Gathered parameter elements allowed on the device before chunks are released.",
               .field = STRATA_FIELD(zero_optimization.stage3_max_live_parameters)});
  o.push_back({.path = "zero_optimization.stage3_max_reuse_distance",
               .kind = Kind::count,
               .def = 1000000000u,
               .meaning = "Keep a gathered chunk if it is used again within this many parameter elements.",
               .field = STRATA_FIELD(zero_optimization.stage3_max_reuse_distance)});
  o.push_back({.path = "zero_optimization.stage3_param_persistence_threshold",
               .kind = Kind::count,
               .def = 100000u,
               .meaning = "Parameters smaller than this stay gathered (not partitioned).",
               .field = STRATA_FIELD(zero_optimization.stage3_param_persistence_threshold),
               .auto_fallback = hidden_times_10,
               .auto_note = "10·hidden_size (override hidden_size), else the default"});
  o.push_back({.path = "zero_optimization.stage3_gather_16bit_weights_on_model_save",
               .kind = Kind::boolean,
               .def = false,
               .meaning = "DeepSpeed: gather the full 16-bit weights when the model is saved.",
               .field = STRATA_FIELD(zero_optimization.stage3_gather_16bit_weights_on_model_save),
               .no_effect =
                   "an export (strata train --export, strata export, engine.export) always gathers every "
                   "rank's shard into the whole model's 16-bit weights (bf16; strata export --dtype also "
                   "writes fp16 or fp32), and a checkpoint (--save) always holds each rank's own shard",
               .strata_does = always_true});
  o.push_back({.path = "zero_optimization.sub_group_size",
               .kind = Kind::count,
               .def = 1000000000u,
               .meaning = "Elements per optimizer sub-group (the unit of the NVMe swap pipeline).",
               .field = STRATA_FIELD(zero_optimization.sub_group_size)});
  // Note [Keys without effect]: DeepSpeed's bucket and communication switches tune how its PyTorch hooks
  // batch tensors into collectives. Strata's unit is the chunk (the embedding, one transformer block, the
  // head): one collective per chunk, issued on a stream of its own (zero3/engine_cache.cpp, Note [Ranks]),
  // so these keys are read, shown and documented as having no effect.
  o.push_back({.path = "zero_optimization.reduce_bucket_size",
               .kind = Kind::count,
               .def = 500000000u,
               .meaning = "DeepSpeed: gradient elements reduced at a time.",
               .field = STRATA_FIELD(zero_optimization.reduce_bucket_size),
               .auto_fallback = hidden_squared,
               .auto_note = kHidden,
               .no_effect = "Strata reduces each chunk's gradients (the embedding, one transformer block, "
                            "the head) in one collective, so there is no bucket to size"});
  o.push_back({.path = "zero_optimization.allgather_bucket_size",
               .kind = Kind::count,
               .def = 500000000u,
               .meaning = "DeepSpeed: parameter elements all-gathered at a time.",
               .field = STRATA_FIELD(zero_optimization.allgather_bucket_size),
               .no_effect = "Strata all-gathers each chunk's parameters (the embedding, one transformer "
                            "block, the head) in one collective, so there is no bucket to size; "
                            "stage3_prefetch_bucket_size bounds how far ahead the gathers run"});
  o.push_back({.path = "zero_optimization.allgather_partitions",
               .kind = Kind::boolean,
               .def = true,
               .meaning = "DeepSpeed: all-gather updated partitions (false: a series of broadcasts).",
               .field = STRATA_FIELD(zero_optimization.allgather_partitions),
               .no_effect = "at stages 1 and 2 the ranks' updated slices of each chunk are all-gathered "
                            "after every step (at stage 3 a chunk is all-gathered where it is used), never "
                            "broadcast",
               .strata_does = always_true});
  o.push_back({.path = "zero_optimization.overlap_comm",
               .kind = Kind::boolean,
               .def = false,
               .meaning = "DeepSpeed: overlap gradient reduction with backward computation.",
               .field = STRATA_FIELD(zero_optimization.overlap_comm),
               .dynamic_default = overlap_default,
               .default_note = "true at stage 3, else false",
               .no_effect = "at every stage each chunk's gradients are reduced across ranks (and copied off "
                            "the device when offloaded) on a gradient stream of their own while backward "
                            "goes on with the chunks before it, and parameters are all-gathered on a gather "
                            "stream of their own",
               .strata_does = always_true});
  o.push_back({.path = "zero_optimization.contiguous_gradients",
               .kind = Kind::boolean,
               .def = true,
               .meaning = "DeepSpeed: copy gradients into one contiguous buffer as they are produced.",
               .field = STRATA_FIELD(zero_optimization.contiguous_gradients),
               .no_effect = "each chunk's gradients are made in one contiguous buffer and handed off whole",
               .strata_does = always_true});
  o.push_back({.path = "zero_optimization.reduce_scatter",
               .kind = Kind::boolean,
               .def = true,
               .meaning = "DeepSpeed: reduce-scatter gradients to their owners instead of all-reducing them.",
               .field = STRATA_FIELD(zero_optimization.reduce_scatter),
               .no_effect =
                   "Strata reduce-scatters each chunk's gradients to the ranks that own its slices at "
                   "every stage (at stage 1 once a step, after each rank has summed its micro-batches), "
                   "so each rank steps its slice with the gradients summed over all ranks",
               .strata_does = always_true});
  o.push_back({.path = "zero_optimization.round_robin_gradients",
               .kind = Kind::boolean,
               .def = false,
               .meaning = "DeepSpeed: spread gradient copies to host memory across ranks (stages 1 and 2 "
                          "with offload).",
               .field = STRATA_FIELD(zero_optimization.round_robin_gradients),
               .no_effect =
                   "with the optimizer offloaded each rank already copies only its own slice of each "
                   "chunk's summed gradients to host memory, all ranks at once",
               .strata_does = always_true});
}

}  // namespace strata::config_detail
