// step_bench: one training step of a model under each offload placement (none / cpu / nvme for both the
// parameters and the optimizer), split into forward / backward / optimizer / waiting on transfers, against
// the compute-only step of the same model and batch measured in the same run.
//
//   step_bench --model 10m -B 4 -T 128 --steps 5 --nvme-path /local_nvme [--device-cap 1GiB]
//              [--placements none,cpu,nvme] [--backend host] [--max-in-cpu 0] [--sub-group-size 1e8]
//              [--ceiling auto|host|device] [--overlap off,on] [--optimizer-cores 1] [--clip 0]
//              [--checkpoint false] [--ratio 1,auto] [--warmup 1] [--frozen 1-12] [--lora 16] [--nf4]
//
// --frozen gives each row a twin with those chunks frozen (EngineOptions.frozen_chunks: "1-12" for the
// blocks of a 12-layer model, "a,b-c" in general): no weight gradients, no optimizer over them — the
// frozen base's share of an adapter step, against the full step in the same run. --lora R gives each row
// a twin training LoRA adapters of rank R on every linear layer (alpha 2R) over the frozen base instead
// (model/lora.h): the adapter step against the full fine-tuning step in the same run, with each row's state
// per tier (the plan's: what `strata train` prints as "state X device, Y pinned host, Z NVMe"); with --nf4
// the base is QLoRA's, its block projections in NF4 (strata.lora.base_dtype nf4, double-quantised; the
// preset's random initial weights quantised).
// --overlap gives each placement a row per strata.overlap_optimizer value (a placement that cannot
// overlap gets no "on" row); --optimizer-cores sets strata.cpu_optim.cores, and the compute-only step then
// measures the model on the other cores and the optimizer on these, as the engine splits them. Each row's
// step is set against the ideal overlapped step — the longest of compute (the compute-only forward and
// backward), the optimizer (its update) and the transfers, each measured alone in the same run — and
// against their sum (/ideal, /sum), with the steps that kept their early updates, rolled them back and
// waited (kept/rb/w; Note [Optimizer overlap] in zero3/engine_overlap.cpp). --ratio gives a row per
// zero_optimization.offload_optimizer.ratio (a number or auto; the offloaded placements only), and the
// last column says what the engine kept on the device: the ratio in force and the sub-groups stepped by
// the device optimizer out of all (Note [Offload ratio] in zero3/engine_ratio.cpp).
//
// Ceiling: the compute-only step — the same model, batch and AdamW update with every parameter, gradient
// and state where compute reads it: on the host backend in ordinary memory (model::InMemoryChunks, the
// engine's ops with bf16 products on a host device, cpu_optim over the whole model), on cuda in device
// memory (model::DeviceChunks, the model on the compute interface, the device optimizer; the whole
// model's state must fit the GPU): no gathers, no gradient hand-off, no NVMe. Per placement:
//   step          mean wall time of the measured steps (after one warm-up step that records the trace)
//   transfers     the same step with the model's compute left out (the same acquires and gradient
//                 hand-offs in the same order, then the optimizer step) minus the compute-only optimizer
//                 time: the time the transfers take when nothing hides them
//   exposed       step - compute-only step: what the placement adds to the step
//   overlap       the share of the transfer time hidden behind compute, two ways ("-" when transfers take
//                 under 1% of the compute-only step), clamped to [0, 1]:
//                   by wait  (transfers - wait) / transfers: compute never blocked on them for the rest
//                   by step  (transfers - exposed) / transfers: also charges the slowdown the copy threads
//                            cause by sharing the cores with compute (the stricter figure on few cores)
//   ratio         compute-only step / step (1 = the placement costs nothing)
//   TFLOPS        model FLOPs per step / step time: 3 x the forward's (6 x parameters x tokens for the
//                 matrix products, plus attention), the recomputation of checkpointing not counted
// Copies (the largest chunk, on the engine's device and backend): the engine's two transfers against the
// plain copy of the same bytes on the same kind of stream, in the same run —
//   gather      the chunk's bf16 working params in pinned memory cast into the device in the compute
//               interface's dtype (what a gather does) / a pinned -> device copy of those bf16 bytes
//   grads       the chunk's fp32 gradient buffer handed to a pinned shard that already holds gradients
//               (accumulation: device -> pinned staging, then the host add) / a plain device -> pinned
//               copy of the same bytes (what the hand-off is when the shard is empty)
// On cuda the plain copy is cudaMemcpyAsync from cudaHostAlloc'd memory; on the host backend a memcpy on
// the stream's thread. GB/s count the bytes read from pinned memory (gather) or moved (D2H).
// Prints the table, then one JSON line.
#include <sys/sysinfo.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "config/config.h"
#include "core/error.h"
#include "core/topology.h"
#include "cpu_optim/cpu_optim.h"
#include "kernels/cpu/ops.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "session/session.h"
#include "zero3/engine.h"

namespace {

using namespace strata;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Opts {
  std::string model = "10m", nvme_path, device_cap, backend = "host";
  std::string placements = "none,cpu,nvme";
  std::string ceiling = "auto";  // auto: device where the CPU cannot address it, else host
  int batch = 4, seq = 128, steps = 5, threads = 0, warmup = 1;
  std::string overlap = "off";  // strata.overlap_optimizer per row: off, on (comma-separated)
  int optimizer_cores = 0;      // strata.cpu_optim.cores
  double clip = 1.0;            // gradient_clipping
  std::string ratio = "1";      // offload_optimizer.ratio per row: numbers and/or auto (comma-separated)
  bool checkpoint = true;       // strata.checkpoint_activations, placements and compute-only alike
  std::uint64_t sub_group = 100000000;
  std::uint64_t max_in_cpu = 1000000000;
  std::string frozen;  // chunks frozen in a twin of every row: "a,b-c"; empty: none
  int lora = 0;        // > 0: the twin trains LoRA adapters of this rank over the frozen base instead
  bool nf4 = false;    // with lora: the base in NF4 (model/nf4_chunk.h)
};

std::vector<int> chunk_list(const std::string& spec);  // "1-3,7" -> {1, 2, 3, 7} (below)

// A preset or a model JSON, as strata train's --model takes it.
model::ModelConfig load_model(const std::string& spec) {
  return session::open_model(spec, session::Weights::fresh_only).config;
}

model::Batch random_batch(const model::ModelConfig& m, int B, int T, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  model::Batch b;
  b.rows = B;
  b.seq_len = T;
  b.inputs.resize(std::size_t(B) * T);
  b.targets.resize(b.inputs.size());
  for (auto& x : b.inputs) x = std::int32_t(rng() % std::uint64_t(m.vocab_size));
  for (auto& x : b.targets) x = std::int32_t(rng() % std::uint64_t(m.vocab_size));
  return b;
}

struct Split {
  double forward = 0, backward = 0, optimizer = 0, wait = 0, total = 0;
};

// The ceiling on a device the CPU cannot address (cuda): every chunk, its fp32 master and AdamW moments
// resident on the device (model::DeviceChunks), the model on the compute interface, the update by the
// device optimizer (Ops::adamw writing the new parameters in the activation dtype). Device memory must
// hold the whole model: 16 bytes per parameter beside the activations.
Split compute_only_on_device(Device& dev, const model::ModelConfig& mcfg, const Opts& o) {
  model::InMemoryChunks host{model::ModelLayout(mcfg)};
  host.init(1);
  std::unique_ptr<Stream> stream = dev.create_stream("bench-compute-only");
  std::unique_ptr<kernels::Ops> ops = kernels::make_ops(dev, *stream);
  model::DeviceChunks chunks(dev, *ops, host);
  const int C = chunks.layout().num_chunks();
  std::vector<DeviceBuffer> master, mom, var;
  for (int c = 0; c < C; ++c) {
    const std::size_t n = chunks.layout().chunk(c).padded_numel;
    master.emplace_back(dev, n * 4, "compute-only master");
    mom.emplace_back(dev, n * 4, "compute-only exp_avg");
    var.emplace_back(dev, n * 4, "compute-only exp_avg_sq");
    stream->copy_async(master.back().data(), host.params(c), n * 4, CopyKind::host_to_device);
    stream->memset_async(mom.back().data(), 0, n * 4);
    stream->memset_async(var.back().data(), 0, n * 4);
  }
  stream->synchronize();
  auto f32 = [&](DeviceBuffer& b, int c) {
    return kernels::Tensor{b.data(), DType::fp32, chunks.layout().chunk(c).padded_numel};
  };
  model::LlamaModel m(mcfg, {.checkpoint_activations = true, .device = &dev, .ops = ops.get()});
  DeviceBuffer norm(dev, 8, "compute-only norm");
  const model::Batch b = random_batch(mcfg, o.batch, o.seq, 1);
  Split s;
  const int reps = std::max(2, std::min(o.steps, 3));
  for (int i = 0; i <= reps; ++i) {
    for (int c = 0; c < C; ++c) ops->zero(chunks.grad_tensor(c));
    auto t0 = Clock::now();
    m.forward(chunks, b.inputs.data(), b.targets.data(), b.rows, b.seq_len);  // returns the loss: synced
    const double f = since(t0);
    t0 = Clock::now();
    m.backward(chunks);  // ends with the stream synchronized
    const double bw = since(t0);
    t0 = Clock::now();
    for (int c = 0; c < C; ++c)
      ops->squared_norm(kernels::Tensor{norm.data(), DType::u8, 8}, chunks.grad_tensor(c));
    for (int c = 0; c < C; ++c)
      ops->adamw(f32(master[std::size_t(c)], c), chunks.grad_tensor(c), f32(mom[std::size_t(c)], c),
                 f32(var[std::size_t(c)], c), chunks.param_tensor(c), {.lr = 1e-4f}, i + 1, 1.0f);
    stream->synchronize();
    const double op = since(t0);
    if (i == 0) continue;  // warm-up
    s.forward += f / reps, s.backward += bw / reps, s.optimizer += op / reps;
  }
  s.total = s.forward + s.backward + s.optimizer;
  return s;
}

// The ceiling: forward, backward and an AdamW step with everything in ordinary memory (host backend), or
// with everything on the device (compute_only_on_device).
Split compute_only(const model::ModelConfig& mcfg, const Opts& o) {
  {
    DeviceOptions dopts;
    dopts.backend = o.backend;
    std::unique_ptr<Device> dev = open_device(dopts);
    if (o.ceiling == "device" || (o.ceiling == "auto" && !dev->caps().host_addressable))
      return compute_only_on_device(*dev, mcfg, o);
  }
  model::InMemoryChunks chunks{model::ModelLayout(mcfg)};
  chunks.init(1);
  // The engine's arithmetic: its ops (bf16 products, as the placements train) on a host device, with the
  // placements' checkpointing. With --optimizer-cores k each runs alone on its share of the cores, as the
  // engine splits them (the optimizer k threads, the model's ops the rest; Note [Cores] in
  // zero3/engine.cpp).
  const std::vector<int> cpus = allowed_cpus();
  const int k = std::clamp(o.optimizer_cores, 0, int(cpus.size()) - 1);
  DeviceOptions dopts;
  dopts.backend = "host";
  std::unique_ptr<Device> dev = open_device(dopts);
  std::unique_ptr<Stream> stream = dev->create_stream("bench-compute-only");
  std::unique_ptr<kernels::Ops> ops = kernels::make_ops(
      *dev, *stream,
      {.matmul = DType::bf16,
       .cpus = k > 0 ? std::vector<int>(cpus.begin(), cpus.end() - k) : std::vector<int>{}});
  // The model reads its chunks in the ops' activation dtype, as the engine gathers them: the working copy
  // (and the fp32 gradients) in the host device's memory; the fp32 master stays in `chunks`, and the update
  // writes the new working params into the copy the model reads.
  model::DeviceChunks working(*dev, *ops, chunks);
  model::LlamaModel m(mcfg, {.checkpoint_activations = o.checkpoint, .device = dev.get(), .ops = ops.get()});
  cpu_optim::Optimizer opt({.simd = "auto", .threads = k > 0 ? k : o.threads, .pin = false});
  const int C = chunks.layout().num_chunks();
  const std::size_t n = chunks.layout().total_padded_numel();
  std::vector<float> mom(n, 0.0f), var(n, 0.0f);
  std::vector<cpu_optim::ShardStep> st(static_cast<std::size_t>(C));
  const model::Batch b = random_batch(mcfg, o.batch, o.seq, 1);
  Split s;
  const int reps = std::max(2, std::min(o.steps, 3));
  for (int i = 0; i <= reps; ++i) {
    for (int c = 0; c < C; ++c) ops->zero(working.grad_tensor(c));
    stream->synchronize();
    auto t0 = Clock::now();
    m.forward(working, b.inputs.data(), b.targets.data(), b.rows, b.seq_len);  // returns the loss: synced
    const double f = since(t0);
    t0 = Clock::now();
    m.backward(working);
    stream->synchronize();
    const double bw = since(t0);
    t0 = Clock::now();
    for (int c = 0; c < C; ++c) {
      const model::ChunkLayout& cl = chunks.layout().chunk(c);
      const float* g = static_cast<const float*>(working.grad_tensor(c).data);
      opt.grad_stats(g, strata::DType::fp32, cl.padded_numel);
      opt.adam(st[std::size_t(c)], {.lr = 1e-4f}, i + 1,
               {.params = chunks.params(c),
                .grads = g,
                .exp_avg = mom.data() + cl.flat_offset,
                .exp_avg_sq = var.data() + cl.flat_offset,
                .out = working.param_tensor(c).data,
                .n = cl.padded_numel},
               1.0f);
    }
    const double op = since(t0);
    if (i == 0) continue;  // warm-up
    s.forward += f / reps, s.backward += bw / reps, s.optimizer += op / reps;
  }
  s.total = s.forward + s.backward + s.optimizer;
  return s;
}

Config placement_config(const std::string& p, const Opts& o, bool overlap, const std::string& ratio = "1") {
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", o.batch},
      {"gradient_accumulation_steps", 1},
      {"gradient_clipping", o.clip},
      {"bf16", {{"enabled", true}}},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}, {"weight_decay", 0.01}}}}},
      {"zero_optimization",
       {{"stage", 3},
        {"sub_group_size", o.sub_group},
        {"offload_param", {{"device", p}}},
        {"offload_optimizer",
         {{"device", p},
          {"pipeline_read", true},
          {"pipeline_write", true},
          {"buffer_count", 9},
          {"ratio", ratio == "auto" ? nlohmann::json("auto") : nlohmann::json(std::stod(ratio))}}}}},
      {"aio", {{"queue_depth", 32}, {"intra_op_parallelism", 2}}},
      {"strata",
       {{"backend", o.backend},
        {"threads", o.threads},
        {"overlap_optimizer", overlap},
        {"checkpoint_activations", o.checkpoint},
        {"cpu_optim", {{"pin_threads", o.optimizer_cores > 0}, {"cores", o.optimizer_cores}}}}},
  };
  if (p == "nvme") {
    if (o.nvme_path.empty()) throw ConfigError("placement nvme needs --nvme-path DIR");
    j["zero_optimization"]["offload_param"]["nvme_path"] = o.nvme_path;
    j["zero_optimization"]["offload_param"]["buffer_size"] = 1e10;  // whole chunks
    j["zero_optimization"]["offload_param"]["max_in_cpu"] = o.max_in_cpu;
    j["zero_optimization"]["offload_optimizer"]["nvme_path"] = o.nvme_path;
  }
  return Config::parse(nlohmann::json::parse(j.dump()));
}

// The model's acquire / gradient order with the compute left out (no gradients for a frozen chunk, as the
// model takes none; a block's adapter chunk beside it, the lm_head's chunk beside the head).
void transfer_pass(zero3::Engine& e, const model::ModelConfig& m) {
  const model::ModelLayout& layout = e.layout();
  const int L = int(m.n_layers), E = 0, H = L + 1;
  std::vector<int> order = {E};
  for (int l = 0; l < L; ++l) {
    order.push_back(layout.block_chunk(l));
    if (layout.adapter_chunk(l) >= 0) order.push_back(layout.adapter_chunk(l));
  }
  order.push_back(H);
  if (layout.lm_head_chunk() >= 0 && layout.lm_head_chunk() != H) order.push_back(layout.lm_head_chunk());
  e.begin_pass();
  for (int c : order) {
    e.acquire(c);
    e.release(c);
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const int c = *it;
    if (c == E) continue;
    e.acquire(c);
    if (e.trains(c)) {  // a frozen chunk hands off no gradients
      e.acquire_grads(c);
      e.release_grads(c);
    }
    e.release(c);
  }
  if (e.trains(E)) {
    e.acquire_grads(E);
    e.release_grads(E);
  }
  e.end_pass();
}

struct Row {
  std::string placement;
  bool frozen = false;              // Opts.frozen's chunks frozen
  bool overlapped = false;          // strata.overlap_optimizer true (and planned: the placement allows it)
  std::string ratio_setting = "1";  // offload_optimizer.ratio as asked (the plan has what was chosen)
  zero3::OverlapStats overlap_stats;
  double ideal = 0, sum = 0;  // max and sum of compute, optimizer and transfers measured alone
  Split step;
  double transfers = 0, exposed = 0, overlap = -1, overlap_wait = -1, ratio = 0;
  std::vector<double> losses;
  std::uint64_t misses = 0, late = 0, gather_bytes = 0, nvme_bytes = 0;
  double peak_device = 0;
  double tflops = 0;
  zero3::MemoryPlan plan;
};

// Model FLOPs of one step (forward and backward, without the recomputation), as in the TFLOPS column.
double model_flops(const model::ModelConfig& mcfg, const Opts& o) {
  model::LlamaModel m(mcfg);
  return 3.0 * m.forward_flops(o.batch, o.seq);
}

Row run_placement(const std::string& p, bool overlap, const std::string& ratio, bool frozen,
                  const model::ModelConfig& mcfg, const Opts& o, const Split& ceiling) {
  Row r;
  r.placement = p;
  r.frozen = frozen;
  zero3::EngineOptions eo;
  model::ModelConfig twin = mcfg;
  if (frozen && o.lora > 0)
    twin.lora = model::resolve_lora(mcfg, {.modules = {"all-linear"}},
                                    {.r = o.lora, .alpha = 2.0 * o.lora, .nf4_base = o.nf4}, "--lora");
  else if (frozen)
    eo.frozen_chunks = chunk_list(o.frozen);
  eo.backend = o.backend;
  if (!o.device_cap.empty()) eo.device_memory_cap = parse_byte_size(o.device_cap, "--device-cap");
  eo.seq_len = o.seq;
  zero3::Engine e(placement_config(p, o, overlap, ratio), twin, eo);
  r.plan = e.plan();
  r.overlapped = r.plan.overlap_groups > 0;
  model::LlamaModel m(twin, e.model_options());
  for (int i = 1 - o.warmup; i <= o.steps; ++i) {
    e.forward_backward(m, random_batch(mcfg, o.batch, o.seq, 100 + std::uint64_t(i)));
    const zero3::StepResult s = e.step();
    r.losses.push_back(s.loss);
    std::fprintf(stderr,
                 "  %s step %d/%d: %.2fs (fwd %.2f bwd %.2f opt %.2f wait %.2f) loss %.4f grad norm %.4g%s\n",
                 p.c_str(), i, o.steps, s.times.total, s.times.forward, s.times.backward, s.times.optimizer,
                 s.times.wait, s.loss, s.grad_norm, o.clip > 0 && s.grad_norm > o.clip ? " (clipped)" : "");
    if (i <= 0) continue;  // the first records the trace; the others touch the memory first
    r.step.forward += s.times.forward / o.steps, r.step.backward += s.times.backward / o.steps;
    r.step.optimizer += s.times.optimizer / o.steps, r.step.wait += s.times.wait / o.steps;
    r.step.total += s.times.total / o.steps;
  }
  // The same transfers with nothing to hide them.
  double t_only = 0;
  const int reps = 2;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    transfer_pass(e, twin);
    e.step();
    t_only += since(t0) / reps;
  }
  r.transfers = std::max(0.0, t_only - ceiling.optimizer);
  r.exposed = std::max(0.0, r.step.total - ceiling.total);
  if (r.transfers > 0.01 * ceiling.total) {
    r.overlap = std::clamp((r.transfers - r.exposed) / r.transfers, 0.0, 1.0);
    r.overlap_wait = std::clamp((r.transfers - r.step.wait) / r.transfers, 0.0, 1.0);
  }
  r.ratio = ceiling.total / r.step.total;
  // The overlapped step's bounds: nothing can beat the longest of the three measured alone, and a step
  // that overlaps nothing takes their sum.
  const double compute = ceiling.forward + ceiling.backward;
  r.ideal = std::max({compute, ceiling.optimizer, r.transfers});
  r.sum = compute + ceiling.optimizer + r.transfers;
  r.overlap_stats = e.overlap_stats();
  r.tflops = model_flops(mcfg, o) / r.step.total / 1e12;
  r.misses = e.prefetch_stats().misses;
  r.late = e.prefetch_stats().late;
  r.gather_bytes = e.transfer_stats().gather_bytes;
  const tiering::Snapshot snap = e.tiers().snapshot(false);
  for (int d = 0; d < tiering::kDirectionCount; ++d)
    if (tiering::direction_from(d) == tiering::Tier::nvme || tiering::direction_to(d) == tiering::Tier::nvme)
      r.nvme_bytes += snap.moves[std::size_t(d)].bytes;
  r.peak_device = double(e.device().memory_stats().peak_in_use);
  return r;
}

struct Copies {
  std::uint64_t elements = 0;
  double gather_gbs = 0, h2d_gbs = 0, grads_gbs = 0, d2h_gbs = 0;
};

// Median seconds of `reps` runs of fn (each ends with the stream synchronized).
template <typename Fn>
double median_seconds(int reps, Fn&& fn) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

Copies measure_copies(const model::ModelConfig& mcfg, const Opts& o) {
  DeviceOptions dopts;
  dopts.backend = o.backend;
  std::unique_ptr<Device> dev = open_device(dopts);
  std::unique_ptr<Stream> s = dev->create_stream("bench-copies");
  std::unique_ptr<kernels::Ops> ops = kernels::make_ops(*dev, *s);
  model::ModelLayout layout(mcfg);
  Copies c;
  for (const model::ChunkLayout& ch : layout.chunks())
    c.elements = std::max<std::uint64_t>(c.elements, ch.padded_numel);
  const std::size_t n = c.elements;
  const DType act = ops->caps().activation;
  PinnedBuffer params(*dev, n * 2), grads_host(*dev, n * 4), staging(*dev, n * 4);
  std::memset(params.data(), 0x3f, n * 2);  // bf16 1.49 everywhere: finite values for the cast
  DeviceBuffer gathered(*dev, n * dtype_bytes(act)), raw(*dev, n * 2), grads(*dev, n * 4);
  ops->zero(kernels::Tensor{grads.data(), DType::fp32, n});
  const int reps = 7;
  const double gather = median_seconds(reps, [&] {
    ops->cast(kernels::Tensor{gathered.data(), act, n}, kernels::Tensor{params.data(), DType::bf16, n});
    s->synchronize();
  });
  const double h2d = median_seconds(reps, [&] {
    s->copy_async(raw.data(), params.data(), n * 2, CopyKind::host_to_device);
    s->synchronize();
  });
  const double d2h = median_seconds(reps, [&] {
    s->copy_async(grads_host.data(), grads.data(), n * 4, CopyKind::device_to_host);
    s->synchronize();
  });
  const double accumulate = median_seconds(reps, [&] {
    s->copy_async(staging.data(), grads.data(), n * 4, CopyKind::device_to_host);
    s->synchronize();
    float* dst = static_cast<float*>(grads_host.data());
    const float* src = static_cast<const float*>(staging.data());
    for (std::size_t i = 0; i < n; ++i) dst[i] += src[i];
  });
  c.gather_gbs = double(n) * 2 / gather / 1e9;
  c.h2d_gbs = double(n) * 2 / h2d / 1e9;
  c.grads_gbs = double(n) * 4 / accumulate / 1e9;
  c.d2h_gbs = double(n) * 4 / d2h / 1e9;
  return c;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');)
    if (!x.empty()) v.push_back(x);
  return v;
}

// "1-3,7" -> {1, 2, 3, 7}.
std::vector<int> chunk_list(const std::string& spec) {
  std::vector<int> out;
  for (const std::string& part : split(spec)) {
    const std::size_t dash = part.find('-');
    const int a = std::stoi(part.substr(0, dash)),
              b = dash == std::string::npos ? a : std::stoi(part.substr(dash + 1));
    if (b < a) throw ConfigError("--frozen: " + part + " is an empty range");
    for (int c = a; c <= b; ++c) out.push_back(c);
  }
  return out;
}

double load_average() {
  double l[1] = {0};
  return ::getloadavg(l, 1) == 1 ? l[0] : -1;
}

}  // namespace

int main(int argc, char** argv) {
  Opts o;
  CLI::App app{"step_bench: per-step time split under each offload placement vs. the compute-only step"};
  app.add_option("--model", o.model, "Preset or model.json");
  app.add_option("-B,--batch", o.batch, "Micro batch (rows)");
  app.add_option("-T,--seq", o.seq, "Sequence length");
  app.add_option("--steps", o.steps, "Measured steps per placement (after the warm-up steps)");
  app.add_option("--warmup", o.warmup,
                 "Warm-up steps per placement, not measured (at least 1: it records the trace)")
      ->check(CLI::PositiveNumber);
  app.add_option("--placements", o.placements, "Comma-separated: none, cpu, nvme (both offloads)");
  app.add_option("--nvme-path", o.nvme_path, "Directory for the nvme placement");
  app.add_option("--device-cap", o.device_cap, "Device memory cap, e.g. 1GiB");
  app.add_option("--backend", o.backend, "Device backend");
  app.add_option("--ceiling", o.ceiling,
                 "Compute-only step: host (ordinary memory, cpu_optim), device (model::DeviceChunks, the "
                 "device optimizer) or auto (device on cuda)")
      ->check(CLI::IsMember({"auto", "host", "device"}));
  app.add_option("--threads", o.threads, "CPU threads (0: all)");
  app.add_option("--overlap", o.overlap,
                 "strata.overlap_optimizer per row, comma-separated: off, on (a placement that cannot "
                 "overlap gets no \"on\" row)");
  app.add_option("--optimizer-cores", o.optimizer_cores,
                 "strata.cpu_optim.cores: cores kept for the CPU optimizer (the compute-only step then "
                 "measures the model on the others and the optimizer on these)");
  app.add_option("--clip", o.clip, "gradient_clipping (0: off; clipped steps are not overlapped)");
  app.add_option("--ratio", o.ratio,
                 "zero_optimization.offload_optimizer.ratio per row, comma-separated: numbers in [0, 1] "
                 "and/or auto (offloaded placements only)");
  app.add_option("--checkpoint", o.checkpoint,
                 "Activation checkpointing in the placements and the compute-only step (default true)");
  app.add_option("--sub-group-size", o.sub_group, "zero_optimization.sub_group_size");
  app.add_option("--frozen", o.frozen, "Chunks frozen in a twin of every row, e.g. 1-12 (a,b-c)");
  app.add_option(
      "--lora", o.lora,
      "A twin of every row training LoRA adapters of this rank (every linear layer, alpha 2R) over "
      "the frozen base");
  app.add_flag("--nf4", o.nf4, "With --lora: the frozen base's block projections in NF4 (QLoRA's base)");
  app.add_option("--max-in-cpu", o.max_in_cpu,
                 "offload_param.max_in_cpu for the nvme placement (0: every parameter read from NVMe)");
  CLI11_PARSE(app, argc, argv);
  try {
    const int threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
    kernels::cpu::set_blas_threads(threads);
    const model::ModelConfig mcfg = load_model(o.model);
    std::printf(
        "model %s: %lld parameters (%.2f GiB of state at 16 B/param), B %d, T %d, %d threads, load %.2f\n",
        mcfg.name.c_str(), (long long)mcfg.num_parameters(), double(mcfg.num_parameters()) * 16 / (1 << 30),
        o.batch, o.seq, threads, load_average());
    std::fflush(stdout);
    const Split c = compute_only(mcfg, o);
    std::printf("compute-only step: %.3f s (forward %.3f, backward %.3f, optimizer %.3f)  [ceiling]\n",
                c.total, c.forward, c.backward, c.optimizer);
    std::fflush(stdout);
    const Copies cp = measure_copies(mcfg, o);
    std::printf("copies of the largest chunk (%llu elements), %s backend:\n", (unsigned long long)cp.elements,
                o.backend.c_str());
    std::printf(
        "  gather (pinned bf16 -> device cast) %7.2f GB/s   plain pinned -> device copy %7.2f GB/s   ratio "
        "%.2f\n",
        cp.gather_gbs, cp.h2d_gbs, cp.gather_gbs / cp.h2d_gbs);
    std::printf(
        "  gradients accumulated into pinned   %7.2f GB/s   plain device -> pinned copy %7.2f GB/s   ratio "
        "%.2f\n",
        cp.grads_gbs, cp.d2h_gbs, cp.grads_gbs / cp.d2h_gbs);
    std::fflush(stdout);
    std::vector<Row> rows;
    for (const std::string& p : split(o.placements))
      for (const std::string& ratio : split(o.ratio))
        for (const std::string& ov : split(o.overlap)) {
          if (ov != "on" && ov != "off") throw ConfigError("--overlap: expected on and/or off, got " + ov);
          if (ratio != "auto" && ratio.find_first_not_of("0123456789.") != std::string::npos)
            throw ConfigError("--ratio: expected numbers in [0, 1] and/or auto, got " + ratio);
          if (ratio != "1" && p == "none") continue;  // nothing offloaded to split
          for (bool frozen : {false, true}) {
            if (frozen && o.frozen.empty() && o.lora == 0) continue;
            Row r = run_placement(p, ov == "on", ratio, frozen, mcfg, o, c);
            if (ov == "on" && !r.overlapped) {
              std::fprintf(stderr, "  %s: the optimizer is not overlapped in this placement; no \"on\" row\n",
                           p.c_str());
              continue;
            }
            r.ratio_setting = ratio;
            rows.push_back(std::move(r));
          }
        }

    const double flops = model_flops(mcfg, o);
    std::printf("\n%-13s %8s %8s %8s %8s %8s %9s %8s %8s %8s %6s %7s %10s %10s %8s %7s %7s %9s %16s\n",
                "placement", "step s", "fwd", "bwd", "opt", "wait", "transfer", "exposed", "ovl wait",
                "ovl step", "ratio", "misses", "NVMe GiB", "dev peak", "TFLOPS", "/ideal", "/sum",
                "kept/rb/w", "offload (dev/G)");
    std::printf(
        "%-13s %8.3f %8.3f %8.3f %8.3f %8s %9s %8s %8s %8s %6s %7s %10s %10s %8.4f %7s %7s %9s %16s\n",
        "compute", c.total, c.forward, c.backward, c.optimizer, "-", "-", "-", "-", "-", "1.00", "-", "-",
        "-", flops / c.total / 1e12, "-", "-", "-", "-");
    nlohmann::json out = {{"bench", "step"},
                          {"model", mcfg.name},
                          {"parameters", mcfg.num_parameters()},
                          {"batch", o.batch},
                          {"seq", o.seq},
                          {"threads", threads},
                          {"device_cap", o.device_cap},
                          {"compute_only",
                           {{"step_s", c.total},
                            {"forward_s", c.forward},
                            {"backward_s", c.backward},
                            {"optimizer_s", c.optimizer},
                            {"model_tflops", flops / c.total / 1e12}}},
                          {"model_flops_per_step", flops},
                          {"copies",
                           {{"elements", cp.elements},
                            {"gather_gbs", cp.gather_gbs},
                            {"plain_h2d_gbs", cp.h2d_gbs},
                            {"grads_accumulate_gbs", cp.grads_gbs},
                            {"plain_d2h_gbs", cp.d2h_gbs}}},
                          {"placements", nlohmann::json::array()}};
    for (const Row& r : rows) {
      char overlap[16] = "-", overlap_wait[16] = "-";
      if (r.overlap >= 0) std::snprintf(overlap, sizeof overlap, "%.2f", r.overlap);
      if (r.overlap_wait >= 0) std::snprintf(overlap_wait, sizeof overlap_wait, "%.2f", r.overlap_wait);
      const zero3::OverlapStats& os = r.overlap_stats;
      const std::string name = r.placement + (r.overlapped ? " overlap" : "") +
                               (r.frozen ? (o.lora > 0 ? (o.nf4 ? " qlora" : " lora") : " frozen") : "");
      const std::string counts = r.overlapped
                                     ? std::to_string(os.steps) + "/" + std::to_string(os.rollbacks) + "/" +
                                           std::to_string(os.waited)
                                     : "-";
      char split_text[48];
      std::snprintf(split_text, sizeof split_text, "%s%.2f (%d/%d)", r.ratio_setting == "auto" ? "auto " : "",
                    r.plan.offload_ratio, r.plan.device_optimizer_groups, r.plan.optimizer_groups);
      std::printf(
          "%-13s %8.3f %8.3f %8.3f %8.3f %8.3f %9.3f %8.3f %8s %8s %6.2f %7llu %10.2f %9.0fM %8.4f %7.3f "
          "%7.3f "
          "%9s %16s\n",
          name.c_str(), r.step.total, r.step.forward, r.step.backward, r.step.optimizer, r.step.wait,
          r.transfers, r.exposed, overlap_wait, overlap, r.ratio, (unsigned long long)r.misses,
          double(r.nvme_bytes) / double(1ull << 30), r.peak_device / double(1 << 20), r.tflops,
          r.step.total / r.ideal, r.step.total / r.sum, counts.c_str(), split_text);
      std::printf("%-13s state %s device, %s pinned host, %s NVMe\n", "",
                  format_bytes(r.plan.device_state).c_str(), format_bytes(r.plan.pinned_state).c_str(),
                  format_bytes(r.plan.nvme_state).c_str());
      out["placements"].push_back(
          {{"placement", r.placement},
           {"frozen_chunks",
            r.frozen && o.lora == 0 ? nlohmann::json(chunk_list(o.frozen)) : nlohmann::json::array()},
           {"lora_r", r.frozen ? o.lora : 0},
           {"nf4_base", r.frozen && o.nf4},
           {"state_device_bytes", r.plan.device_state},
           {"state_pinned_bytes", r.plan.pinned_state},
           {"state_nvme_bytes", r.plan.nvme_state},
           {"overlap_optimizer", r.overlapped},
           {"offload_ratio_setting", r.ratio_setting},
           {"offload_ratio", r.plan.offload_ratio},
           {"device_optimizer_groups", r.plan.device_optimizer_groups},
           {"optimizer_groups", r.plan.optimizer_groups},
           {"overlap_host_bytes", r.plan.overlap_host},
           {"overlap_kept_steps", r.overlap_stats.steps},
           {"overlap_rollbacks", r.overlap_stats.rollbacks},
           {"overlap_rollback_s", r.overlap_stats.rollback_seconds},
           {"overlap_waited_steps", r.overlap_stats.waited},
           {"ideal_s", r.ideal},
           {"sum_s", r.sum},
           {"step_over_ideal", r.step.total / r.ideal},
           {"step_over_sum", r.step.total / r.sum},
           {"step_s", r.step.total},
           {"forward_s", r.step.forward},
           {"backward_s", r.step.backward},
           {"optimizer_s", r.step.optimizer},
           {"wait_s", r.step.wait},
           {"transfer_s", r.transfers},
           {"exposed_s", r.exposed},
           {"overlap", r.overlap >= 0 ? nlohmann::json(r.overlap) : nlohmann::json(nullptr)},
           {"overlap_by_wait",
            r.overlap_wait >= 0 ? nlohmann::json(r.overlap_wait) : nlohmann::json(nullptr)},
           {"ratio_to_compute_only", r.ratio},
           {"prefetch_misses", r.misses},
           {"prefetch_late", r.late},
           {"nvme_bytes", r.nvme_bytes},
           {"device_peak_bytes", r.peak_device},
           {"model_tflops", r.tflops},
           {"state_bytes", r.plan.total_state()},
           {"losses", r.losses}});
    }
    out["load_average_end"] = load_average();
    std::printf("%s\n", out.dump().c_str());
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "step_bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
