// The step-time model (Note [The step-time model] in step_time.h) and the placements "auto" chooses from.
#include "zero3/step_time.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "core/error.h"
#include "model/lora.h"

namespace strata::zero3 {

using detail::cat;

namespace {

double number(const nlohmann::json& doc, const char* key, const std::string& origin, bool required) {
  if (!doc.contains(key)) {
    if (required)
      throw ConfigError(cat(origin, ": \"", key, "\" is missing; ",
                            "docs/train.md, \"Predicted step times\" lists the keys"));
    return 0;
  }
  const nlohmann::json& v = doc[key];
  if (!v.is_number() || v.get<double>() < 0)
    throw ConfigError(cat(origin, ": \"", key, "\" is ", v.dump(), "; give a number >= 0"));
  return v.get<double>();
}

std::uint64_t bytes(const nlohmann::json& doc, const char* key, const std::string& origin) {
  if (!doc.contains(key))
    throw ConfigError(cat(origin, ": \"", key, "\" is missing; give bytes or a size such as \"80GiB\""));
  const nlohmann::json& v = doc[key];
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_string()) return parse_byte_size(v.get<std::string>(), cat(origin, ": ", key));
  throw ConfigError(cat(origin, ": \"", key, "\" is ", v.dump(), "; give bytes or a size such as \"80GiB\""));
}

}  // namespace

MachineRates machine_from_json(const nlohmann::json& doc, const std::string& origin) {
  if (!doc.is_object())
    throw ConfigError(cat(origin, ": a machine is a JSON object (docs/train.md, \"Predicted step times\")"));
  static const char* const kKeys[] = {"name",
                                      "device_memory",
                                      "bf16_tflops",
                                      "link_gbps",
                                      "h2d_gbps",
                                      "d2h_gbps",
                                      "host_memory",
                                      "cores",
                                      "memory_gbps",
                                      "attention_tflops",
                                      "cpu_optimizer_gelems",
                                      "device_optimizer_gelems",
                                      "nvme_read_gbps",
                                      "nvme_write_gbps",
                                      "collective_gbps",
                                      "grad_norm_gelems",
                                      "note"};
  for (const auto& item : doc.items()) {
    const std::string& k = item.key();
    if (std::find_if(std::begin(kKeys), std::end(kKeys), [&](const char* s) { return k == s; }) ==
        std::end(kKeys))
      throw ConfigError(cat(origin, ": unknown key \"", k,
                            "\"; the keys are name, device_memory, bf16_tflops, "
                            "attention_tflops, memory_gbps, link_gbps (or h2d_gbps and d2h_gbps), "
                            "host_memory, cores, cpu_optimizer_gelems, "
                            "device_optimizer_gelems, nvme_read_gbps, nvme_write_gbps, collective_gbps, "
                            "grad_norm_gelems, note"));
  }
  MachineRates m;
  m.name = doc.value("name", std::string("described machine"));
  m.source = cat("described in ", origin);
  m.device_memory = bytes(doc, "device_memory", origin);
  m.host_memory = bytes(doc, "host_memory", origin);
  m.compute_flops = number(doc, "bf16_tflops", origin, true) * 1e12;
  m.attention_flops = doc.contains("attention_tflops") ? number(doc, "attention_tflops", origin, true) * 1e12
                                                       : m.compute_flops / 2;
  m.memory_bandwidth = number(doc, "memory_gbps", origin, true) * 1e9;
  const double link = number(doc, "link_gbps", origin, false);
  m.link_h2d = (doc.contains("h2d_gbps") ? number(doc, "h2d_gbps", origin, true) : link) * 1e9;
  m.link_d2h = (doc.contains("d2h_gbps") ? number(doc, "d2h_gbps", origin, true) : link) * 1e9;
  if (m.link_h2d <= 0 || m.link_d2h <= 0)
    throw ConfigError(cat(origin, ": give \"link_gbps\" (GB/s each way), or \"h2d_gbps\" and \"d2h_gbps\""));
  m.cores = int(number(doc, "cores", origin, true));
  m.cpu_optimizer = number(doc, "cpu_optimizer_gelems", origin, true) * 1e9;
  m.grad_norm = doc.contains("grad_norm_gelems") ? number(doc, "grad_norm_gelems", origin, true) * 1e9
                                                 : 4 * m.cpu_optimizer;
  // A GPU's AdamW streams 16 bytes in and 12 out an element at ~3 TB/s; a quarter of that is what the
  // compute interface's unfused kernels reach, unless the description says.
  m.device_optimizer = doc.contains("device_optimizer_gelems")
                           ? number(doc, "device_optimizer_gelems", origin, true) * 1e9
                           : 25e9;
  m.nvme_read = number(doc, "nvme_read_gbps", origin, false) * 1e9;
  m.nvme_write = number(doc, "nvme_write_gbps", origin, false) * 1e9;
  m.collective = number(doc, "collective_gbps", origin, false) * 1e9;
  if (m.compute_flops <= 0 || m.attention_flops <= 0 || m.memory_bandwidth <= 0 || m.cpu_optimizer <= 0 ||
      m.cores <= 0)
    throw ConfigError(
        cat(origin,
            ": bf16_tflops, attention_tflops, memory_gbps, cpu_optimizer_gelems and cores must be above 0"));
  return m;
}

MachineRates load_machine(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw ConfigError(cat("--machine ", path, ": cannot read the file; check the path"));
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(cat("--machine ", path, ": not JSON (", e.what(), ")"));
  }
  return machine_from_json(doc, path);
}

nlohmann::json to_json(const MachineRates& m) {
  return {{"name", m.name},
          {"source", m.source},
          {"host_backend", m.host_backend},
          {"compute_flops", m.compute_flops},
          {"backward_flops", m.backward_flops},
          {"attention_flops", m.attention_flops},
          {"memory_bandwidth", m.memory_bandwidth},
          {"link_h2d", m.link_h2d},
          {"link_d2h", m.link_d2h},
          {"cpu_optimizer", m.cpu_optimizer},
          {"grad_norm", m.grad_norm},
          {"device_optimizer", m.device_optimizer},
          {"nvme_read", m.nvme_read},
          {"nvme_write", m.nvme_write},
          {"nvme_swap", m.nvme_swap},
          {"collective", m.collective},
          {"device_memory", m.device_memory},
          {"host_memory", m.host_memory},
          {"cores", m.cores}};
}

std::vector<Product> forward_products(const model::ModelConfig& m, int B, int T, bool frozen_base) {
  const std::int64_t N = std::int64_t(B) * T, C = m.d_model, F = m.ffn_dim, Q = m.q_dim(), KV = m.kv_dim();
  const int L = int(m.n_layers);
  const bool base = !frozen_base;
  std::vector<Product> p = {{N, C, Q, L, base}, {N, C, KV, 2 * L, base},
                            {N, Q, C, L, base}, {N, C, F, 2 * L, base},
                            {N, F, C, L, base}, {N, C, m.vocab_size, 1, base || m.lora.save_lm_head}};
  if (m.lora.active())
    for (int site : model::lora_sites_of(m)) {
      int layers = 0;
      for (int l = 0; l < L; ++l) layers += m.lora.adapts(l, site) ? 1 : 0;
      if (layers == 0) continue;
      p.push_back({N, model::lora_site_in(m, site), m.lora.r, layers, true});
      p.push_back({N, m.lora.r, model::lora_site_out(m, site), layers, true});
    }
  return p;
}

double attention_flops(const model::ModelConfig& m, int B, int T) {
  double f = 0;
  for (std::int64_t l = 0; l < m.n_layers; ++l) {
    const std::int64_t w = m.window_of(l);
    // Keys a query sees, summed over the row: the causal half, or the window's.
    const double keys = w > 0 && w < T ? double(w) * double(T) - double(w) * double(w - 1) / 2.0
                                       : double(T) * double(T + 1) / 2.0;
    f += 4.0 * double(B) * double(m.n_heads) * double(m.head_dim()) * keys;
  }
  return f;
}

ElementwiseBytes elementwise_bytes(const model::ModelConfig& m, int B, int T, DType activation) {
  const double N = double(B) * double(T), a = double(dtype_bytes(activation));
  const double C = double(m.d_model), F = double(m.ffn_dim), QK = double(m.q_dim() + m.kv_dim());
  ElementwiseBytes e;
  // Forward, a block: two norms (x in, out), rope on q and k (in, out), two residual adds (two in, one
  // out), the MLP's gate (gate and up in, one out). Backward: the norms read x and dout and write dx, rope
  // as forward, the residuals' gradient read and written twice, the gate's reads dout, gate, up and writes
  // two.
  e.forward = double(m.n_layers) * N * a * (10 * C + 2 * QK + 3 * F);
  e.backward = double(m.n_layers) * N * a * (12 * C + 2 * QK + 5 * F);
  // The loss: the logits written by the head's product, read for the loss, their gradient written.
  e.head = 3 * N * double(m.vocab_size) * a;
  return e;
}

StepModel step_model(const model::ModelConfig& m, int B, int T, const PlanInput& in, const Plan& p) {
  using R = UpdateRoute;
  StepModel s;
  const std::vector<Product> products = forward_products(m, B, T, m.lora.active());
  double head = 0;
  for (const Product& pr : products) {
    s.forward_flops += pr.flops();
    s.backward_flops += pr.flops() * (pr.trains ? 2 : 1);  // input gradients, and the weights' if it trains
    if (pr.cols == m.vocab_size && pr.inner == m.d_model) head = pr.flops();
  }
  s.attention_forward = attention_flops(m, B, T);
  s.attention_backward = 2 * s.attention_forward;  // dQ; dK and dV
  const ElementwiseBytes e = elementwise_bytes(m, B, T, in.activation);
  s.elementwise_forward = e.forward + e.head;
  s.elementwise_backward = e.backward;
  if (p.memory.checkpoint_activations) {
    s.recompute_flops = s.forward_flops - head;
    s.attention_recompute = s.attention_forward;
    s.elementwise_recompute = e.forward;
  }
  s.micro_batches = std::max(1, in.accumulation_steps);
  const std::uint64_t micro = std::uint64_t(s.micro_batches);
  s.link = link_bytes_per_step(in, p);
  // NVMe params: a gather reads the chunk unless the parameter cache (max_in_cpu) kept its pinned copy.
  std::uint64_t nvme_param_elems = 0, nvme_param_bytes = 0;
  for (std::size_t c = 0; c < in.chunks.size(); ++c) {
    const PlannedChunk& pc = in.chunks[c];
    const R& r = p.routes[c];
    if (r.param_home == tiering::Tier::nvme) {
      nvme_param_elems += pc.param_numel;
      nvme_param_bytes += in.param_bytes(pc);
    }
    const std::uint64_t shard = pc.shard.numel;
    if (!r.trains) continue;
    if (r.device_optimizer())
      s.device_optimizer_elements += shard;
    else
      s.cpu_optimizer_elements += shard;
    if (r.overlap) s.overlapped_elements += shard;
    if (r.norm == R::Norm::host || r.norm == R::Norm::host_blocks)
      s.host_norm_elements += shard;
    else
      s.device_norm_elements += shard;
    if (r.grads_nvme)
      s.nvme_grad_writes += shard * sizeof(float) * (r.grads == R::Grads::device_accumulator ? 1 : micro);
    if (r.stepper == R::Stepper::nvme_pipeline) {
      const std::uint64_t tensors = 1 + std::uint64_t(in.optimizer_states);
      s.nvme_state_reads += shard * sizeof(float) * (tensors + (r.grads_nvme ? 1 : 0));
      s.nvme_state_writes += shard * sizeof(float) * tensors;
    }
    if (r.params == R::Params::nvme) s.nvme_state_writes += shard * std::uint64_t(dtype_bytes(in.working));
    if (r.all_gather)
      s.collective_bytes +=
          2 * micro * in.param_bytes(pc) / std::uint64_t(in.world) * std::uint64_t(in.world - 1);
    if (r.reduce == R::Reduce::every_handoff)
      s.collective_bytes +=
          micro * pc.numel * sizeof(float) / std::uint64_t(in.world) * std::uint64_t(in.world - 1);
    if (r.reduce == R::Reduce::once_a_step)
      s.collective_bytes += pc.numel * sizeof(float) / std::uint64_t(in.world) * std::uint64_t(in.world - 1);
  }
  if (nvme_param_elems > 0) {
    const double uncached = 1.0 - std::min(1.0, double(p.memory.param_cache) / double(nvme_param_elems));
    s.nvme_param_reads = std::uint64_t(double(2 * micro * nvme_param_bytes) * uncached);
  }
  if (p.memory.activation_offload) {
    const std::uint64_t inputs = std::uint64_t(m.n_layers) * std::uint64_t(B) * std::uint64_t(T) *
                                 std::uint64_t(m.d_model) * std::uint64_t(dtype_bytes(in.activation));
    s.pinned_activations = inputs;
    if (in.checkpoints_on_nvme) s.nvme_activations = inputs;
  }
  return s;
}

StepPrediction predict_step(const StepModel& s, const MachineRates& m) {
  StepPrediction p;
  auto over = [&](double amount, double rate, const char* what) {
    if (amount <= 0) return 0.0;
    if (rate <= 0) {
      if (p.missing.empty()) p.missing = what;
      return 0.0;
    }
    return amount / rate;
  };
  const double micro = s.micro_batches;
  const double backward =
      over(micro * s.backward_flops, m.backward_flops > 0 ? m.backward_flops : m.compute_flops,
           "the device's product rate") +
      over(micro * s.recompute_flops, m.compute_flops, "the device's product rate") +
      over(micro * (s.attention_backward + s.attention_recompute), m.attention_flops,
           "the attention's rate") +
      over(micro * (s.elementwise_backward + s.elementwise_recompute), m.memory_bandwidth,
           "the device memory's rate");
  p.compute = backward + over(micro * s.forward_flops, m.compute_flops, "the device's product rate") +
              over(micro * s.attention_forward, m.attention_flops, "the attention's rate") +
              over(micro * s.elementwise_forward, m.memory_bandwidth, "the device memory's rate");
  p.link = over(double(s.link.gathers + s.link.params) + micro * double(s.pinned_activations), m.link_h2d,
                "the host link's rate") +
           over(double(s.link.gradients) + micro * double(s.pinned_activations), m.link_d2h,
                "the host link's rate");
  const double nvme_reads = double(s.nvme_param_reads) + micro * double(s.nvme_activations),
               nvme_writes = double(s.nvme_grad_writes) + micro * double(s.nvme_activations);
  p.nvme_pass = m.nvme_swap > 0 ? over(nvme_reads + nvme_writes, m.nvme_swap, "the NVMe drive's rate")
                                : over(nvme_reads, m.nvme_read, "the NVMe drive's read rate") +
                                      over(nvme_writes, m.nvme_write, "the NVMe drive's write rate");
  p.collectives = over(double(s.collective_bytes), m.collective, "the collectives' rate");
  // Gradients crossing to a pinned shard are added into it by the CPU (the gradient stream's thread): a
  // read of the crossing and of the shard and a write, at the rate the CPU reads fp32 (the norm's) over 3.
  p.host_adds = over(double(s.link.gradients) / sizeof(float) * 3, m.grad_norm, "the gradient norm's rate");
  // On the host backend the copies and the adds are the CPU's work as the compute is, on the same cores and
  // memory: they add to it rather than run beside it (measured: bench/RESULTS.md, issue 44).
  p.pass = m.host_backend ? std::max({p.compute + p.link + p.host_adds, p.nvme_pass, p.collectives})
                          : std::max({p.compute, p.link, p.host_adds, p.nvme_pass, p.collectives});
  // The overlap's updates run beside backward; what backward does not hide is left for after it.
  const double overlapped = over(double(s.overlapped_elements), m.cpu_optimizer, "the CPU optimizer's rate");
  p.cpu_optimizer = over(double(s.cpu_optimizer_elements - s.overlapped_elements), m.cpu_optimizer,
                         "the CPU optimizer's rate") +
                    std::max(0.0, overlapped - backward);
  p.norm =
      over(double(s.host_norm_elements), m.grad_norm, "the gradient norm's rate") +
      over(double(s.device_norm_elements) * sizeof(float), m.memory_bandwidth, "the device memory's rate");
  // The swap pipeline reads the next sub-group's states while it writes the last one's, and a drive serves
  // both at once: the longer of the two (measured on the development machine: 125m's 1.9 GiB each way a
  // step kept the drive busy about as long as the reads alone take; bench/RESULTS.md, issue 44).
  p.nvme_optimizer =
      m.nvme_swap > 0
          ? over(double(s.nvme_state_reads + s.nvme_state_writes), m.nvme_swap, "the NVMe drive's rate")
          : std::max(over(double(s.nvme_state_reads), m.nvme_read, "the NVMe drive's read rate"),
                     over(double(s.nvme_state_writes), m.nvme_write, "the NVMe drive's write rate"));
  p.device_optimizer =
      over(double(s.device_optimizer_elements), m.device_optimizer, "the device optimizer's rate");
  // On the host backend the device optimizer is the same SIMD code on the same cores: the two add up.
  p.update = p.norm + (m.host_backend ? std::max(p.cpu_optimizer + p.device_optimizer, p.nvme_optimizer)
                                      : std::max({p.cpu_optimizer, p.nvme_optimizer, p.device_optimizer}));
  p.step = p.pass + p.update;
  struct Part {
    double t;
    const char* name;
  };
  const Part parts[] = {{p.compute, "compute"},
                        {m.host_backend ? p.link + p.host_adds : std::max(p.link, p.host_adds), "host link"},
                        {p.nvme_pass, "NVMe (params, gradients)"},
                        {p.collectives, "collectives"},
                        {p.norm, "gradient norm"},
                        {p.cpu_optimizer, "CPU optimizer"},
                        {p.nvme_optimizer, "NVMe (optimizer states)"},
                        {p.device_optimizer, "device optimizer"}};
  const Part* top = &parts[0];
  for (const Part& x : parts)
    if (x.t > top->t) top = &x;
  p.bottleneck = top->name;
  return p;
}

nlohmann::json to_json(const StepPrediction& p) {
  return {{"step", p.step},
          {"pass", p.pass},
          {"compute", p.compute},
          {"link", p.link},
          {"nvme_pass", p.nvme_pass},
          {"collectives", p.collectives},
          {"update", p.update},
          {"norm", p.norm},
          {"cpu_optimizer", p.cpu_optimizer},
          {"nvme_optimizer", p.nvme_optimizer},
          {"device_optimizer", p.device_optimizer},
          {"bottleneck", p.bottleneck},
          {"missing", p.missing}};
}

std::string placement_name(const PlacementOption& o) {
  return cat("param ", offload_device_name(o.param), " / optimizer ", offload_device_name(o.optimizer));
}

std::vector<PlacementOption> placement_candidates(const ZeroConfig& z, bool param_auto, bool optimizer_auto) {
  std::vector<OffloadDevice> params, optimizers;
  const OffloadDevice all[] = {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme};
  for (OffloadDevice d : all) {
    if (param_auto ? (d == OffloadDevice::none || z.stage == 3) : d == z.offload_param.device)
      params.push_back(d);
    const bool split = z.offload_optimizer.ratio_auto || z.offload_optimizer.ratio < 1.0;
    const bool allowed = d == OffloadDevice::none  ? !split
                         : d == OffloadDevice::cpu ? z.stage >= 1
                                                   : z.stage == 3;
    if (optimizer_auto ? allowed : d == z.offload_optimizer.device) optimizers.push_back(d);
  }
  std::vector<PlacementOption> out;
  for (OffloadDevice p : params)
    for (OffloadDevice o : optimizers) {
      PlacementOption c;
      c.param = p;
      c.optimizer = o;
      if (p == OffloadDevice::nvme && z.offload_param.nvme_paths.empty())
        c.why_not = "no offload_param.nvme_path";
      else if (o == OffloadDevice::nvme && z.offload_optimizer.nvme_paths.empty())
        c.why_not = "no offload_optimizer.nvme_path";
      out.push_back(c);
    }
  return out;
}

int fastest_placement(const std::vector<PlacementOption>& options) {
  // Without predictions (no rates): the least offloaded that fits.
  if (std::none_of(options.begin(), options.end(),
                   [](const PlacementOption& o) { return o.predicted.step > 0; }))
    for (std::size_t i = 0; i < options.size(); ++i)
      if (options[i].fits) return int(i);
  int best = -1;
  for (std::size_t i = 0; i < options.size(); ++i) {
    const PlacementOption& o = options[i];
    if (!o.fits || o.predicted.step <= 0) continue;
    if (best < 0 || o.predicted.step < options[std::size_t(best)].predicted.step * 0.99) best = int(i);
  }
  return best;
}

std::string placements_table(const std::vector<PlacementOption>& options, int chosen) {
  std::string out =
      "  placement                       fits  device need  host need    predicted s/step  bottleneck, or "
      "why it "
      "does not fit\n";
  for (std::size_t i = 0; i < options.size(); ++i) {
    const PlacementOption& o = options[i];
    char line[512];
    char pred[32] = "-";
    // A prediction is shown where the placement fits, or would with the nvme_path it lacks.
    if (o.predicted.step > 0 && (o.fits || o.why_not.rfind("no ", 0) == 0))
      std::snprintf(pred, sizeof pred, "%.3f", o.predicted.step);
    std::snprintf(line, sizeof line, "%s %-31s %-5s %-12s %-12s %-17s %s%s\n", int(i) == chosen ? "*" : " ",
                  placement_name(o).c_str(), o.fits ? "yes" : "no", format_size(o.device_need, 1).c_str(),
                  format_size(o.host_need, 1).c_str(), pred, o.fits ? o.predicted.bottleneck.c_str() : "",
                  o.fits ? (o.predicted.missing.empty()
                                ? ""
                                : cat(" (no prediction: ", o.predicted.missing, " is not known)").c_str())
                         : o.why_not.c_str());
    out += line;
  }
  return out;
}

}  // namespace strata::zero3

namespace strata::zero3 {

PlanInput plan_placement(PlacementOption& o, const PlacementContext& ctx, const MachineRates* rates) {
  Config c = *ctx.cfg;
  auto& z = c.zero_optimization;
  z.offload_param.device = o.param;
  z.offload_optimizer.device = o.optimizer;
  z.offload_param.device_auto = z.offload_optimizer.device_auto = false;
  PlanInput in = plan_input(c, *ctx.layout, ctx.model->tie_embeddings, ctx.world, ctx.rank, ctx.activation);
  if (!ctx.frozen_chunks.empty()) freeze_chunks(in, ctx.frozen_chunks, z, "EngineOptions.frozen_chunks");
  plan_adapters(in, *ctx.layout, z);
  in.device_state_by_ops = ctx.base.device_state_by_ops;
  in.tail_on_model_cpus = ctx.base.tail_on_model_cpus;
  in.ops = ctx.base.ops;
  in.device_capacity = ctx.base.device_capacity;
  const ActivationSizes sizes = ctx.sizes(ctx.T);
  const ActivationChoice choice = choose_activations(in, z, ctx.checkpointing, ctx.activation_offload, sizes);
  apply_activations(in, sizes, choice);
  auto host_need = [&](const MemoryPlan& m) {
    return zero3::host_need(m, ctx.host_backend, in.device_capacity);
  };
  const std::uint64_t ram = ctx.host_memory, local = std::uint64_t(std::max(1, ctx.local_ranks));
  Plan p = plan_memory(in, z);
  if (p.memory.activation_offload && ram > 0 && host_need(p.memory) > ram / 10 * 9 &&
      ctx.checkpoints_nvme_path) {
    in.checkpoints_on_nvme = true;  // as the engine's plan_memory does
    p = plan_memory(in, z);
  }
  note_activations(p.memory, sizes, choice);
  o.device_need = p.memory.device_need();
  o.host_need = host_need(p.memory);
  in.overlap_auto_here = ctx.overlap_auto_here;
  if (overlap_asked(in)) {  // as the engine's choose_overlap, with the room it would have
    const std::uint64_t usable = ram / 10 * 9, host = o.host_need * local;
    const std::uint64_t room =
        ram == 0 ? ~std::uint64_t(0) : (usable > host ? (usable - host) / 2 / local : 0);
    plan_overlap(p.routes, p.memory, in, room, [&](int chunk) {
      return overlap_copy_bytes(in, in.chunks[std::size_t(chunk)].shard.numel);
    });
  }
  if (o.why_not.empty()) {
    if (o.device_need > in.device_capacity)
      o.why_not =
          cat("device needs ", format_size(o.device_need, 1), " of ", format_size(in.device_capacity, 1));
    else if (ram > 0 && o.host_need * local > ram / 100 * kAutoHostPercent)
      o.why_not = cat("host needs ", format_size(o.host_need * local, 1), " of ", kAutoHostPercent, "% of ",
                      format_size(ram, 1));
  }
  o.fits = o.why_not.empty();
  if (rates) o.predicted = predict_step(step_model(*ctx.model, ctx.B, ctx.T, in, p), *rates);
  return in;
}

int choose_placement(std::vector<PlacementOption>& options, const PlacementContext& ctx,
                     const MachineRates& rates) {
  for (PlacementOption& o : options) plan_placement(o, ctx, &rates);
  return fastest_placement(options);
}

std::string smallest_change(const std::vector<PlacementOption>& options, const PlacementContext& ctx) {
  const std::uint64_t cap = ctx.base.device_capacity, ram = ctx.host_memory;
  // A placement through NVMe that fits but for its missing nvme_path.
  for (const PlacementOption& o : options)
    if (o.why_not.rfind("no ", 0) == 0 && o.device_need <= cap &&
        (ram == 0 || o.host_need <= ram / 100 * kAutoHostPercent))
      return cat("name ", o.why_not.substr(3), ": ", placement_name(o), " would need ",
                 format_size(o.device_need, 1), " of the device and ", format_size(o.host_need, 1),
                 " of host memory");
  const PlacementOption* least = nullptr;
  for (const PlacementOption& o : options)
    if (o.why_not.rfind("no ", 0) != 0 && (!least || o.device_need < least->device_need)) least = &o;
  if (!least) return "name an nvme_path for the state (offload_optimizer.nvme_path, offload_param.nvme_path)";
  if (least->device_need > cap) {
    PlacementOption probe = *least;
    probe.why_not.clear();
    const PlanInput in = plan_placement(probe, ctx, nullptr);
    Config c = *ctx.cfg;
    c.zero_optimization.offload_param.device = least->param;
    c.zero_optimization.offload_optimizer.device = least->optimizer;
    const std::int64_t longest = longest_sequence(in, c.zero_optimization, ctx.T - 1, ctx.sizes,
                                                  ctx.checkpointing, ctx.activation_offload);
    return cat(longest > 0 ? cat("rows of at most ", longest, " tokens (--seq-len ", longest, ") with ",
                                 placement_name(*least), ", or ")
                           : std::string(),
               "a device of at least ", format_size(least->device_need, 1), " (", least->device_need,
               " bytes: strata.device_memory_cap, --device-memory-cap) for ", placement_name(*least));
  }
  return cat("host memory of at least ", format_size(least->host_need * 100 / kAutoHostPercent + 1, 1),
             " for ", placement_name(*least),
             ", or an nvme_path for the state (offload_optimizer.nvme_path, "
             "offload_param.nvme_path)");
}

}  // namespace strata::zero3
