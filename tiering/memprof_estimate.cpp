// `memprof estimate`: bytes per tier for each offload setting — ours from DESIGN.md §2's bytes per
// parameter, beside DeepSpeed's ZeRO-3 estimator (estimate_zero3_model_states_mem_needs).
//
// Note [our estimate]
// Per rank, with shard S = ceil(P / world) parameters and largest layer (chunk) M:
//   working params  2 B x S at offload_param's tier (none: device, cpu: pinned host, nvme: NVMe)
//   gradient shard  4 B x S (fp32 accumulator): device without optimizer offload, else pinned host
//   master + Adam  12 B x S (fp32 master, exp_avg, exp_avg_sq) at offload_optimizer's tier
//   device working set 8 B x M: the chunk in use gathered in fp32 (4 B) and its fp32 gradient buffer
//                   (4 B), as the engine's plan counts it (docs/train.md, "Device memory"; the engine also
//                   counts persistent chunks and the allocator's 512-byte rounding). Room beyond this
//                   is the engine's chunk cache (prefetches, chunks kept for reuse).
//   pinned staging  params on NVMe: two shard buffers of the largest chunk (2 x 2 B x M / world);
//                   optimizer on NVMe: up to three sub-groups in flight (read i+1, update i, write i-1),
//                   12 B x min(sub_group_size, S) each (one when the shard is one sub-group)
// Host and NVMe figures are per node (x GPUs per node). Activations, the communication buffers and
// the allocator's rounding are not included (DeepSpeed's estimator leaves them out too).
#include <algorithm>
#include <cstdio>
#include <sstream>

#include "core/error.h"
#include "tiering/memprof.h"

namespace strata::tiering {

using strata::detail::cat;

namespace {

const char* offload_name(Tier t) {
  return t == Tier::device ? "none" : t == Tier::pinned ? "cpu" : "nvme";
}

}  // namespace

std::vector<EstimateRow> estimate(const EstimateInput& in) {
  if (in.params == 0) throw ConfigError("memprof estimate --params: must be more than 0");
  if (in.largest_layer == 0 || in.largest_layer > in.params)
    throw ConfigError(cat("memprof estimate --largest-layer: ", in.largest_layer, " must be in 1..",
                          in.params, " (the parameters of the biggest layer)"));
  if (in.world < 1 || in.nodes < 1 || in.world % in.nodes != 0)
    throw ConfigError(cat("memprof estimate --world ", in.world, " --nodes ", in.nodes,
                          ": world must be a positive multiple of nodes"));
  if (in.sub_group_size == 0) throw ConfigError("memprof estimate --sub-group-size: must be more than 0");
  const double P = double(in.params), M = double(in.largest_layer);
  const double W = in.world, gpn = double(in.world / in.nodes), gf = 1.0 / in.nodes, bf = in.buffer_factor;
  const std::uint64_t S = (in.params + in.world - 1) / in.world;
  const std::uint64_t sub = std::min<std::uint64_t>(in.sub_group_size, S);
  const std::uint64_t Mw = (in.largest_layer + in.world - 1) / in.world;

  const std::pair<Tier, Tier> settings[] = {{Tier::device, Tier::device}, {Tier::device, Tier::pinned},
                                            {Tier::pinned, Tier::pinned}, {Tier::nvme, Tier::pinned},
                                            {Tier::device, Tier::nvme},   {Tier::pinned, Tier::nvme},
                                            {Tier::nvme, Tier::nvme}};
  std::vector<EstimateRow> rows;
  for (auto [param, optim] : settings) {
    EstimateRow r;
    r.param_home = param;
    r.optim_home = optim;
    std::uint64_t dev = 8 * in.largest_layer, host = 0, nvme = 0;
    (param == Tier::device ? dev : param == Tier::pinned ? host : nvme) += 2 * S;
    (optim == Tier::device ? dev : host) += 4 * S;
    (optim == Tier::device ? dev : optim == Tier::pinned ? host : nvme) += 12 * S;
    if (param == Tier::nvme) host += 2 * 2 * Mw;
    if (optim == Tier::nvme) host += std::min<std::uint64_t>(3, (S + sub - 1) / sub) * 12 * sub;
    r.device = dev;
    r.host = host * std::uint64_t(gpn);
    r.nvme = nvme * std::uint64_t(gpn);
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
                (unsigned long long)in.params, (unsigned long long)in.largest_layer, in.world, in.nodes);
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
                  offload_name(r.param_home), offload_name(r.optim_home), short_bytes(r.device).c_str(),
                  short_bytes(r.host).c_str(), short_bytes(r.nvme).c_str(), short_bytes(r.ds_gpu).c_str(),
                  short_bytes(r.ds_cpu_zero_init).c_str(), short_bytes(r.ds_cpu).c_str());
    os << line;
  }
  os << "\nStrata (per rank, shard S = P/world, largest layer M; host and nvme x GPUs per node):\n"
        "  params 2 B/param at offload_param's tier; fp32 gradient shard 4 B/param on the device, or in\n"
        "  pinned host memory when the optimizer is offloaded; fp32 master + exp_avg + exp_avg_sq 12 B/param "
        "at\n"
        "  offload_optimizer's tier; device working set 8 B x M (the chunk in fp32 + its fp32 grads);\n"
        "  pinned staging: 4 B x M/world with params on NVMe; with the optimizer on NVMe up to 3 sub-groups\n"
        "  (read i+1, update i, write i-1) of 12 B x min(sub_group_size, S).\n"
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
        {{"offload_param", offload_name(r.param_home)},
         {"offload_optimizer", offload_name(r.optim_home)},
         {"strata", {{"device_per_gpu", r.device}, {"host_per_node", r.host}, {"nvme_per_node", r.nvme}}},
         {"deepspeed",
          {{"gpu_per_gpu", r.ds_gpu},
           {"cpu_per_node_zero_init", r.ds_cpu_zero_init},
           {"cpu_per_node", r.ds_cpu}}}});
  return {{"schema", kSchema},
          {"version", kSchemaVersion},
          {"type", "estimate"},
          {"params", in.params},
          {"largest_layer", in.largest_layer},
          {"world", in.world},
          {"nodes", in.nodes},
          {"rows", out}};
}

}  // namespace strata::tiering
