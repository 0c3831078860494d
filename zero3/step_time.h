// The step-time model: how long one optimizer step takes for a model, a config's plan and a machine, phase
// by phase, with what overlaps what as the engine schedules it; and the choice among offload placements
// that it makes possible (offload_param.device / offload_optimizer.device "auto"). One computation, used by
// the engine (the choice, and strata train's "step time  predicted ..., measured ..." line), strata config
// (--model, --machine) and Python's engine.memory_plan.
//
//   zero3::MachineRates m = zero3::machine_from_json(doc, "h100.json");       // or measure_machine(...)
//   zero3::StepModel s = zero3::step_model(mcfg, B, T, in, plan);             // what the plan moves
//   zero3::StepPrediction p = zero3::predict_step(s, m);
//   printf("%.2f s, %s\n", p.step, p.bottleneck.c_str());
//
// Note [The step-time model]: a step at one rank is
//   the pass   — forward, backward and the recompute (the model's products, at the device's measured rate
//                for the model's shapes), while beside it the gathers and gradient crossings go over the host
//                link (the crossings added into their pinned shards by the CPU), the parameter reads and
//                gradient writes go to NVMe, and the collectives run, each on its own stream: the pass takes
//                the longest of those (the prefetcher keeps them ahead of compute). On the host backend the
//                copies and adds are the CPU's work as the compute is, on the same cores: they add to it;
//   the update — after backward: the CPU optimizer over the offloaded shards (its rate measured on this
//                machine's cores) beside the NVMe swap of their states (reads and writes at the drive's
//                rates), whichever is longer, and the device optimizer over the sub-groups kept on the device
//                beside both. The sub-groups the overlap updates during backward (strata.overlap_optimizer)
//                are taken out of the update and put beside the backward.
// The longest part of the longer phase is the bottleneck. On the host backend the "device" is host memory
// and the link is a copy between two regions of it, both measured as they are.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "model/config.h"
#include "zero3/placement.h"

namespace strata::zero3 {

// What a machine does in a second, measured here (measure_machine: the rates of this machine, cached with
// its identity) or described (machine_from_json: a GPU machine planned for elsewhere).
struct MachineRates {
  std::string name;    // "host backend, AMD EPYC (2 cpus)", or the description's name
  std::string source;  // "measured ...", "cached ...", or the file it was described in
  bool host_backend = false;
  double compute_flops = 0;           // the model's products forward (bf16 where training is bf16), FLOP/s
  double backward_flops = 0;          // and backward (input and weight gradients; 0: compute_flops)
  double attention_flops = 0;         // the attention's own products (attention_flops), FLOP/s
  double memory_bandwidth = 0;        // the elementwise ops (norms, rope, residuals, the MLP's gate), bytes/s
  double link_h2d = 0, link_d2h = 0;  // host memory <-> device, bytes/s
  double cpu_optimizer = 0;           // the CPU optimizer over pinned shards, elements/s (all its threads)
  double grad_norm = 0;         // the CPU's gradient norm and overflow check over fp32 shards, elements/s
  double device_optimizer = 0;  // the device optimizer, elements/s
  double nvme_read = 0, nvme_write = 0;  // bytes/s of the swap directory's drive; 0: not known
  // Reads and writes together as an earlier run's swap moved them (Note [Drive rates from the swap] in
  // zero3/machine.h), bytes/s; 0: not known (the two rates above then, the longer of the two).
  double nvme_swap = 0;
  double collective = 0;  // bytes/s a rank sends in an all-gather or reduce-scatter; 0: one rank
  std::uint64_t device_memory = 0, host_memory = 0;
  int cores = 0;
};

// A described machine (docs/train.md, "Predicted step times"): a JSON object with
//   "name", "device_memory" (bytes or "80GiB"), "bf16_tflops" (the model's products), "memory_gbps" (the
//   device memory's read + write rate), "link_gbps" (each way; or "h2d_gbps" and "d2h_gbps"),
//   "host_memory", "cores", "cpu_optimizer_gelems" (10^9 elements a second), optionally "attention_tflops"
//   (default half of bf16_tflops), "device_optimizer_gelems", "nvme_read_gbps", "nvme_write_gbps",
//   "collective_gbps", "grad_norm_gelems" (default 4x cpu_optimizer_gelems: it reads 4 of the optimizer's ~28
//   bytes an element), "note".
// ConfigError naming `origin` and the key for a missing or wrong one.
MachineRates machine_from_json(const nlohmann::json& doc, const std::string& origin);
MachineRates load_machine(const std::string& path);
nlohmann::json to_json(const MachineRates& m);

// One matrix product of the model's forward pass: `count` of (rows x inner) times (inner x cols), `trains`
// false where its weight is frozen (its backward computes the input gradient only).
struct Product {
  std::int64_t rows = 0, inner = 0, cols = 0;
  int count = 0;
  bool trains = true;
  double flops() const { return 2.0 * double(rows) * double(inner) * double(cols) * count; }
};
// The products of one micro-batch of B x T tokens of `m` (its blocks' projections, the adapters', the head),
// as the decoder computes them; `frozen_base`: the base weights do not train (adapters).
std::vector<Product> forward_products(const model::ModelConfig& m, int B, int T, bool frozen_base);
// The attention's own multiply-adds x 2 (Q K^T and the weighted sum over the causal half, each window's).
double attention_flops(const model::ModelConfig& m, int B, int T);
// Bytes the elementwise ops of one micro-batch read and write (the norms, rope, residuals and the MLP's
// gate, each block's; the loss over the logits): forward and backward (Note [The step-time model]).
struct ElementwiseBytes {
  double forward = 0, backward = 0, head = 0;  // head: the loss's, within forward + backward
};
ElementwiseBytes elementwise_bytes(const model::ModelConfig& m, int B, int T, DType activation);

// What one optimizer step of a plan asks of the machine, in FLOP, bytes and elements.
struct StepModel {
  // One micro-batch's forward, its backward (input and weight gradients) and the blocks' forward again
  // under checkpointing: the products' FLOP, the attention's, the elementwise ops' bytes.
  double forward_flops = 0, backward_flops = 0, recompute_flops = 0;
  double attention_forward = 0, attention_backward = 0, attention_recompute = 0;
  double elementwise_forward = 0, elementwise_backward = 0, elementwise_recompute = 0;
  int micro_batches = 1;
  LinkBytes link;                      // link_bytes_per_step
  std::uint64_t nvme_param_reads = 0;  // working params read from NVMe a step (the parameter cache's kept)
  std::uint64_t nvme_grad_writes = 0;  // fp32 gradient shards written to NVMe a step
  std::uint64_t nvme_state_reads = 0, nvme_state_writes = 0;  // the swap pipeline's: masters, states (grads)
  std::uint64_t nvme_activations = 0;    // block inputs to NVMe and back a micro-batch (each way)
  std::uint64_t pinned_activations = 0;  // block inputs over the link a micro-batch (each way)
  std::uint64_t cpu_optimizer_elements = 0, device_optimizer_elements = 0;
  std::uint64_t host_norm_elements = 0, device_norm_elements = 0;  // the step's norm: the CPU's, the device's
  std::uint64_t overlapped_elements = 0;  // of cpu_optimizer_elements: updated during backward
  std::uint64_t collective_bytes = 0;     // this rank's all-gather and reduce-scatter bytes a step
};
StepModel step_model(const model::ModelConfig& m, int B, int T, const PlanInput& in, const Plan& p);

struct StepPrediction {
  double compute = 0;    // forward + backward + recompute, every micro-batch
  double link = 0;       // the host link's bytes at its rates
  double host_adds = 0;  // gradients added into pinned shards by the CPU
  double nvme_pass = 0;  // NVMe during the pass: parameter reads, gradient and block-input writes
  double collectives = 0;
  double pass = 0;  // the longest of those (the host backend: compute, link and adds together)
  double norm = 0;  // the gradient norm and overflow check, before the update
  double cpu_optimizer = 0, nvme_optimizer = 0, device_optimizer = 0;
  double update = 0;       // after backward: the norm, then the longest of the three
  double step = 0;         // pass + update
  std::string bottleneck;  // "compute", "host link", "NVMe", "collectives", "CPU optimizer", ...
  std::string missing;     // a rate the prediction needed and the machine has not (0): its name
};
StepPrediction predict_step(const StepModel& s, const MachineRates& m);
nlohmann::json to_json(const StepPrediction& p);

// One placement a config may take (offload_param.device x offload_optimizer.device): whether it fits the
// device and the host, the reason it does not, its plan's needs and its predicted step.
struct PlacementOption {
  OffloadDevice param = OffloadDevice::none, optimizer = OffloadDevice::none;
  bool fits = false;
  std::string why_not;  // "" when it fits: "device 9.1 GiB > 8.0 GiB", "no nvme_path", "stage 3 only"
  std::uint64_t device_need = 0, host_need = 0;
  StepPrediction predicted;
};
// "param cpu / optimizer nvme"
std::string placement_name(const PlacementOption& o);

// What planning a placement needs besides the config, as the engine (measured) and strata config (given)
// know it.
struct PlacementContext {
  const Config* cfg = nullptr;
  const model::ModelConfig* model = nullptr;
  const model::ModelLayout* layout = nullptr;
  int world = 1, rank = 0;
  DType activation = DType::bf16;
  // The measured fields every candidate takes: device_state_by_ops, tail_on_model_cpus, ops, device_capacity.
  PlanInput base;
  std::vector<int> frozen_chunks;  // EngineOptions.frozen_chunks
  int B = 1, T = 1;
  std::function<ActivationSizes(std::int64_t T)> sizes;
  std::optional<bool> checkpointing, activation_offload;
  bool host_backend = false;           // the device is host memory: the host holds it too
  bool overlap_auto_here = false;      // PlanInput.overlap_auto_here
  bool checkpoints_nvme_path = false;  // a directory for block inputs that pinned memory would not hold
  std::uint64_t host_memory = 0;       // 0: unknown
  int local_ranks = 1;                 // ranks sharing the host's memory
};
// Note [Host room for auto]: a placement "auto" takes must leave 15% of the host's memory to the system
// and the page cache, where a placement given in the config may use up to check_fits' 90%. On the
// development machine (23.5 GiB) a 1b plan taking 21.1 GiB (90%) stepped 32% slower than one taking 19.2
// GiB (82%) and the next such run was killed by the kernel for memory (bench/RESULTS.md, issue 44).
inline constexpr std::uint64_t kAutoHostPercent = 85;

// The plan of `o`'s placement as the engine makes it (plan_input, plan_adapters, the checkpointing and
// block-input choices, plan_memory, the overlap), whether it fits the device and kAutoHostPercent of the
// host's memory (o.fits, o.why_not unless already set), its needs and, with `rates`, its predicted step.
// Returns the plan's input (for longest_sequence).
PlanInput plan_placement(PlacementOption& o, const PlacementContext& ctx, const MachineRates* rates);
// Plans every option (plan_placement), then the fastest that fits (fastest_placement), or -1.
int choose_placement(std::vector<PlacementOption>& options, const PlacementContext& ctx,
                     const MachineRates& rates);
// The refusal's advice when no option fits (Note [Placement auto] in zero3/engine_auto.cpp): the smallest
// change that would.
std::string smallest_change(const std::vector<PlacementOption>& options, const PlacementContext& ctx);
// The placements `z` lets "auto" consider (each fixed device stays as given; stage 3 for offload_param and
// NVMe; NVMe only where its nvme_path is given; an offloaded optimizer where offload_optimizer.ratio is
// below 1 or "auto"), in the order none, cpu, nvme for params then optimizer.
std::vector<PlacementOption> placement_candidates(const ZeroConfig& z, bool param_auto, bool optimizer_auto);
// The fastest placement that fits (ties within 1%: the earlier, less offloaded one), or -1.
int fastest_placement(const std::vector<PlacementOption>& options);
// The table strata train and strata config print: placement, fits, device and host need, predicted s/step,
// bottleneck; `chosen` marked.
std::string placements_table(const std::vector<PlacementOption>& options, int chosen);

}  // namespace strata::zero3
