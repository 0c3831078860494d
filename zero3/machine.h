// This machine's rates for the step-time model (zero3/step_time.h), measured on the device and CPUs a run
// has: the compute interface's matrix products at the model's shapes, the host link both ways, the CPU
// and device optimizers, and the NVMe directories' drives. The rates that do not depend on the model (the
// link, the optimizers, each drive) are cached with the machine's identity in rates_cache_path(), so that a
// run measures them once (Note [Measured rates]).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/device.h"
#include "cpu_optim/cpu_optim.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "nvme/engine.h"
#include "zero3/step_time.h"

namespace strata::zero3 {

struct MeasureKit {
  Device& dev;
  Stream& compute;  // where the products run
  Stream& copy;     // where the link's copies run
  kernels::Ops& ops;
  DType activation = DType::bf16, working = DType::bf16;
  // The optimizers' rates in elements a second over `n` elements (the engine's own measurements).
  std::function<double(std::size_t n)> cpu_optimizer, device_optimizer;
  // The CPU's gradient norm and overflow check (cpu_optim::Optimizer::grad_stats) over fp32 elements.
  cpu_optim::Optimizer* optimizer = nullptr;
  // NVMe directories to measure (the config's nvme_path entries); their drives' rates, read and written
  // through `aio` as the swap files are.
  std::vector<std::string> nvme_dirs;
  nvme::AioOptions aio;
  int cores = 0;  // the cpus the run computes and optimizes on
};

// The rates of this machine for a model of config `m` at micro-batch B x T. Logs what it measured and what
// it took from the cache.
MachineRates measure_machine(const MeasureKit& kit, const model::ModelConfig& m, int B, int T);

// The model's products timed on `ops` (Note [Measured rates]), forward and backward, as FLOP a second over
// all of them (backward's FLOP: twice forward's where the weight trains, once where it is frozen).
struct ProductRates {
  double forward = 0, backward = 0;
};
ProductRates measure_products(Device& dev, Stream& compute, kernels::Ops& ops,
                              const std::vector<Product>& products, DType activation, DType working);

// The attention's forward and backward on one row of min(T, 4096) tokens of the model's heads, as FLOP a
// second (the step-time model's count: forward's and twice it); the elementwise ops (an RMSNorm, a residual
// add, the MLP's gate) over up to N rows, as bytes read and written a second.
double measure_attention(Device& dev, Stream& compute, kernels::Ops& ops, const model::ModelConfig& m, int T,
                         DType activation);
double measure_elementwise(Device& dev, Stream& compute, kernels::Ops& ops, const model::ModelConfig& m,
                           int N, DType activation, DType working);

// The config's NVMe directories (offload_optimizer's, then offload_param's), each once: the drives a
// placement through NVMe would use.
std::vector<std::string> nvme_dirs(const Config& cfg);

// The CPU optimizer's AdamW over `n` fp32 elements in pinned memory of `dev`, elements a second (the best
// of three steps after one): strata config's measurement, where no engine is at hand.
double adam_rate(Device& dev, cpu_optim::Optimizer& opt, std::size_t n);

// Note [Drive rates from the swap]: a run whose swap moved at least 1 GiB through NVMe records the rate the
// drive gave it while busy (reads and writes together: IoStats' bytes over busy_seconds) under its
// directories' drives; later predictions take that rate for reads and writes sharing the drive
// (MachineRates.nvme_swap), as the swap does, in place of the scratch file's sequential rates (the longer
// of its reads and its writes: what the first run predicts with).
void record_swap_rate(const Device& dev, int cores, const std::vector<std::string>& dirs,
                      const nvme::IoStats& io);

// $STRATA_RATES_CACHE, else $XDG_CACHE_HOME/strata/rates.json, else $HOME/.cache/strata/rates.json; "" when
// none can be named.
std::string rates_cache_path();
// This machine's identity in the cache: the backend and device, the CPU's model and the cpus counted.
std::string machine_identity(const Device& dev, int cores);
// "AMD EPYC 9R14 96-Core Processor", from /proc/cpuinfo.
std::string cpu_model_name();

}  // namespace strata::zero3
