// `memprof estimate`: bytes per tier for each offload setting — ours from the engine's own memory plan
// (zero3/placement.h: the same computation the engine's up-front check and budgets use), beside
// DeepSpeed's ZeRO-3 estimator (estimate_zero3_model_states_mem_needs).
//
// Note [our estimate]
// For each offload setting, the plan of rank 0 (the ranks' shards are equal) with the config's knobs
// (sub_group_size, the NVMe buffers, the optimizer, bf16), chunks of the model's layout (--model) or, from
// --params and --largest-layer, chunks of the largest layer's size:
//   device   the state at home there (allocator blocks) + the working set: the largest chunk gathered in
//            the compute dtype (bf16 on cuda; on host bf16 with bf16 enabled, else fp32: the activation
//            dtype of the engine's compute ops) with its fp32 gradient buffer — exactly what
//            the step peaks at with no room for a chunk cache; the activations come on top
//            (docs/train.md, "Device memory")
//   host     pinned state + pinned staging (NVMe swap buffers, gradient staging), x GPUs per node
//   nvme     NVMe state, x GPUs per node
#include <algorithm>
#include <cstdio>
#include <sstream>

#include "core/error.h"
#include "model/architecture.h"
#include "session/session.h"
#include "tools/memprof/memprof.h"
#include "zero3/offline_plan.h"
#include "zero3/placement.h"

namespace strata::memprof {

using strata::detail::cat;

namespace {

std::optional<model::ModelLayout> layout_of(const EstimateInput& in) {
  if (!in.model) return std::nullopt;
  in.model->validate("memprof estimate --model");
  return model::architecture(*in.model).layout(
      *in.model, {.tensor_align = 16, .chunk_multiple = zero3::chunk_multiple(in.world)});
}

// P and M: given, or the model's parameters and its largest chunk.
std::pair<std::uint64_t, std::uint64_t> sizes_of(const EstimateInput& in) {
  const std::optional<model::ModelLayout> layout = layout_of(in);
  if (!layout) return {in.params, in.largest_layer};
  std::uint64_t largest = 0;
  for (int c = 0; c < layout->num_chunks(); ++c)
    largest = std::max<std::uint64_t>(largest, layout->chunk(c).numel);
  return {std::uint64_t(in.model->num_parameters() + model::lora_parameters(*in.model)), largest};
}

}  // namespace

std::vector<EstimateRow> estimate(const EstimateInput& in) {
  const auto [params, largest_layer] = sizes_of(in);
  const std::optional<model::ModelLayout> layout = layout_of(in);
  std::vector<zero3::ChunkSize> sizes;
  const std::size_t multiple = zero3::chunk_multiple(in.world);
  auto padded = [&](std::uint64_t n) { return (n + multiple - 1) / multiple * multiple; };
  if (params == 0) throw ConfigError("memprof estimate --params: must be more than 0");
  if (largest_layer == 0 || largest_layer > params)
    throw ConfigError(cat("memprof estimate --largest-layer: ", largest_layer, " must be in 1..", params,
                          " (the parameters of the biggest layer)"));
  if (in.world < 1 || in.nodes < 1 || in.world % in.nodes != 0)
    throw ConfigError(cat("memprof estimate --world ", in.world, " --nodes ", in.nodes,
                          ": world must be a positive multiple of nodes"));
  if (in.backend != "cuda" && in.backend != "host")
    throw ConfigError(cat("memprof estimate --backend ", in.backend, ": must be cuda or host"));
  if (!layout) {  // chunks of the largest layer's size, the last one what is left
    for (std::uint64_t left = params; left > 0;) {
      const std::uint64_t n = std::min(left, largest_layer);
      sizes.push_back({.numel = n, .padded_numel = padded(n)});
      left -= n;
    }
  }
  Config base = in.config ? *in.config
                          : Config::parse(nlohmann::json{{"train_micro_batch_size_per_gpu", 1},
                                                         {"bf16", {{"enabled", true}}},
                                                         {"optimizer", {{"type", "AdamW"}}},
                                                         {"zero_optimization", {{"stage", 3}}}},
                                          {}, in.world);
  if (!in.config) base.zero_optimization.sub_group_size = in.sub_group_size;
  // The engine's compute dtype: bf16 on cuda; on the host backend bf16 activations with bf16 training,
  // else fp32 (zero3/engine.cpp's OpsOptions.matmul).
  const DType act = in.backend == "host" && !base.bf16.enabled ? DType::fp32 : DType::bf16;
  const double P = double(params), M = double(largest_layer);
  const double W = in.world, gpn = double(in.world / in.nodes), gf = 1.0 / in.nodes, bf = in.buffer_factor;

  const std::pair<Tier, Tier> settings[] = {{Tier::device, Tier::device}, {Tier::device, Tier::pinned},
                                            {Tier::pinned, Tier::pinned}, {Tier::nvme, Tier::pinned},
                                            {Tier::device, Tier::nvme},   {Tier::pinned, Tier::nvme},
                                            {Tier::nvme, Tier::nvme}};
  // Note [Predicted beside the bytes]: with a described machine each row is also planned as "auto" plans a
  // placement (zero3/offline_plan.h, plan_placement: activations, checkpointing, the device's and 85% of the
  // host's memory) and its step predicted (zero3/step_time.h), one computation with the engine's.
  std::unique_ptr<zero3::OfflinePlan> whole;
  if (in.machine) {
    if (!in.model) throw ConfigError("memprof estimate --machine: give the model with --model (its shapes)");
    const int T = in.seq_len > 0 ? session::resolve_seq_len(*in.model, in.seq_len, "--seq-len")
                                 : int(in.model->max_seq_len);
    whole = std::make_unique<zero3::OfflinePlan>(
        base, *in.model,
        zero3::OfflineDevice{.B = int(base.train_micro_batch_size_per_gpu),
                             .T = T,
                             .world = in.world,
                             .cuda = in.backend == "cuda",
                             .capacity = in.machine->device_memory,
                             .host_memory = in.machine->host_memory});
  }
  std::vector<EstimateRow> rows;
  for (auto [param, optim] : settings) {
    EstimateRow r;
    r.param_home = param;
    r.optim_home = optim;
    if (whole) {
      zero3::PlacementOption o;
      o.param = zero3::offload_of(param);
      o.optimizer = zero3::offload_of(optim);
      zero3::plan_placement(o, whole->ctx, &*in.machine);
      r.planned = o;
    }
    Config c = base;
    c.zero_optimization.offload_param.device = zero3::offload_of(param);
    c.zero_optimization.offload_optimizer.device = zero3::offload_of(optim);
    zero3::PlanInput pin = layout ? zero3::plan_input(c, *layout, in.model->tie_embeddings, in.world, 0, act)
                                  : zero3::plan_input(c, sizes, in.world, 0, act);
    // LoRA adapters (the model's strata.lora): the base's chunks keep their working copy alone.
    if (layout) zero3::plan_adapters(pin, *layout, c.zero_optimization);
    const zero3::MemoryPlan m = zero3::plan_memory(pin, c.zero_optimization).memory;
    r.device = m.device_state + m.device_working_set;
    r.host = (m.pinned_state + m.pinned_staging) * std::uint64_t(gpn);
    r.nvme = m.nvme_state * std::uint64_t(gpn);
    // DeepSpeed: cpu_offload = optimizer offloaded, cpu_offload_params = params offloaded.
    const double layer = 4 * M;
    if (optim != Tier::device) {
      if (param != Tier::device) {
        r.ds_gpu = std::uint64_t(layer);
        r.ds_cpu_zero_init = std::uint64_t(P * 18 * gf * bf);
        r.ds_cpu = std::uint64_t(P * std::max(4 * gpn, 18 * gf) * bf);
      } else {
        r.ds_gpu = std::uint64_t(layer + std::uint64_t(2 * P / W));
        r.ds_cpu_zero_init = std::uint64_t(P * 16 * gf * bf);
        r.ds_cpu = std::uint64_t(P * std::max(4 * gpn, 16 * gf) * bf);
      }
    } else {
      r.ds_gpu = std::uint64_t(layer + std::uint64_t(18 * P / W));
      r.ds_cpu_zero_init = std::uint64_t(M * 4 * gpn * bf);
      r.ds_cpu = std::uint64_t(P * 4 * gpn * bf);
    }
    rows.push_back(r);
  }
  return rows;
}

std::string format_estimate(const std::vector<EstimateRow>& rows, const EstimateInput& in) {
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof line,
                "memprof estimate: %llu params, largest layer %llu, %d GPU(s) on %d node(s), ZeRO-3\n\n",
                (unsigned long long)sizes_of(in).first, (unsigned long long)sizes_of(in).second, in.world,
                in.nodes);
  os << line;
  std::snprintf(line, sizeof line, "  %-31s | %-32s | %s\n", "", "Strata", "DeepSpeed's ZeRO-3 estimator");
  os << line;
  std::snprintf(line, sizeof line, "  %-13s %-17s | %10s %10s %10s | %10s %12s   %-12s\n", "offload_param",
                "offload_optimizer", "device/GPU", "host/node", "nvme/node", "GPU/GPU", "CPU/node",
                "CPU/node");
  os << line;
  std::snprintf(line, sizeof line, "  %-31s | %32s | %10s %12s   %-12s\n", "", "", "", "zero_init=1",
                "zero_init=0");
  os << line;
  for (const EstimateRow& r : rows) {
    std::snprintf(line, sizeof line, "  %-13s %-17s | %10s %10s %10s | %10s %12s   %-12s\n",
                  zero3::offload_name(r.param_home), zero3::offload_name(r.optim_home),
                  format_size(r.device).c_str(), format_size(r.host).c_str(), format_size(r.nvme).c_str(),
                  format_size(r.ds_gpu).c_str(), format_size(r.ds_cpu_zero_init).c_str(),
                  format_size(r.ds_cpu).c_str());
    os << line;
  }
  if (!rows.empty() && rows.front().planned) {
    const zero3::MachineRates& mr = *in.machine;
    const model::ModelConfig& m = *in.model;
    std::snprintf(
        line, sizeof line,
        "\nOn %s (%s): each setting planned whole, activations and checkpointing included, at %d x %lld "
        "tokens a micro-batch%s, and its step predicted (Note [Predicted beside the bytes]):\n",
        mr.name.c_str(), mr.source.c_str(), int(in.config ? in.config->train_micro_batch_size_per_gpu : 1),
        (long long)(in.seq_len > 0 ? in.seq_len : m.max_seq_len),
        in.seq_len > 0 ? "" : " (--seq-len not given: the model's max_seq_len)");
    os << line;
    std::snprintf(line, sizeof line, "  %-13s %-17s   %-4s  %11s  %11s  %9s  %s\n", "offload_param",
                  "offload_optimizer", "fits", "device need", "host need", "s/step",
                  "bottleneck, or why it does not fit");
    os << line;
    for (const EstimateRow& r : rows) {
      const zero3::PlacementOption& o = *r.planned;
      char step[32] = "-";
      if (o.predicted.step > 0) std::snprintf(step, sizeof step, "%.3f", o.predicted.step);
      std::snprintf(
          line, sizeof line, "  %-13s %-17s   %-4s  %11s  %11s  %9s  %s\n", zero3::offload_name(r.param_home),
          zero3::offload_name(r.optim_home), o.fits ? "yes" : "no", format_size(o.device_need).c_str(),
          format_size(o.host_need).c_str(), step,
          o.fits ? (o.predicted.missing.empty() ? o.predicted.bottleneck
                                                : cat("no ", o.predicted.missing, " in the machine"))
                       .c_str()
                 : o.why_not.c_str());
      os << line;
    }
  }
  os << "\nStrata (the engine's own memory plan, rank 0; host and nvme x GPUs per node; docs/train.md):\n"
        "  device = state at home there + working set (the largest chunk gathered in the compute dtype with\n"
        "  its fp32 gradient buffer): what the step peaks at with no chunk cache; activations come on top.\n"
        "  host = pinned state + staging (NVMe swap buffers, gradient staging); nvme = NVMe state.\n"
        "DeepSpeed (estimate_zero3_model_states_mem_needs, additional_buffer_factor ";
  std::snprintf(line, sizeof line, "%.2f", in.buffer_factor);
  os << line
     << "):\n"
        "  GPU = 4 x M + {18 x P/GPUs no offload, 2 x P/GPUs optimizer offload, 0 params + optimizer "
        "offload};\n"
        "  CPU per node with optimizer offload = {18 (with params offload) or 16} x P / nodes x factor "
        "(zero_init),\n"
        "  max(4 x GPUs per node, that) x P x factor without zero_init; without offload 4 x M (zero_init) "
        "or\n"
        "  4 x P per GPU. Its estimator has no NVMe case: nvme rows show its cpu figures.\n";
  return os.str();
}

nlohmann::json estimate_json(const std::vector<EstimateRow>& rows, const EstimateInput& in) {
  nlohmann::json out = nlohmann::json::array();
  for (const EstimateRow& r : rows)
    out.push_back(
        {{"offload_param", zero3::offload_name(r.param_home)},
         {"offload_optimizer", zero3::offload_name(r.optim_home)},
         {"strata", {{"device_per_gpu", r.device}, {"host_per_node", r.host}, {"nvme_per_node", r.nvme}}},
         {"deepspeed",
          {{"gpu_per_gpu", r.ds_gpu},
           {"cpu_per_node_zero_init", r.ds_cpu_zero_init},
           {"cpu_per_node", r.ds_cpu}}}});
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (const auto& o = rows[i].planned)
      out[i]["planned"] = {{"fits", o->fits},
                           {"why_not", o->why_not},
                           {"device_need", o->device_need},
                           {"host_need", o->host_need},
                           {"predicted", zero3::to_json(o->predicted)}};
  return {{"schema", kSchema},
          {"version", kSchemaVersion},
          {"type", "estimate"},
          {"params", sizes_of(in).first},
          {"largest_layer", sizes_of(in).second},
          {"world", in.world},
          {"nodes", in.nodes},
          {"rows", out}};
}

}  // namespace strata::memprof
