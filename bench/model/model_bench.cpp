// model_bench: forward + backward of one preset on the CPU, per op and per block, against plain OpenBLAS
// sgemm measured in the same run.
//
//   model_bench --preset 10m -B 4 -T 256 --threads 2 --steps 3 [--checkpoint] [--bf16]
//
// Ceilings, measured here before the model runs:
//   - sgemm 2048^3 (row-major, no transposes): the machine's matrix-product rate (ANCHORS.md: ~274 GFLOP/s
//     on 2 threads on the development machine);
//   - for every linear op, a plain sgemm of the same sizes: forward (N, OC, IC); backward the two products
//     (N, IC, OC) and (OC, IC, N). "frac" is that sgemm time over the op's time.
// A block's "frac" is its GEMM-equivalent time (plain sgemm time of its linear ops + its attention flops
// at the 2048^3 rate) over its measured time. Elementwise ops have no flops; their share of the step is
// shown instead. Prints the tables, then one JSON line.
#include <cblas.h>
#include <tbb/global_control.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/ops.h"
#include "model/chunk.h"
#include "model/device_chunks.h"
#include "model/llama.h"
#include "model/profile.h"

namespace {

using namespace strata::model;
using Clock = std::chrono::steady_clock;

double now_s() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

// Best time of one plain row-major sgemm C (m, n) = A (m, k) B (k, n), repeated for at least 0.1 s.
double sgemm_seconds(int m, int n, int k) {
  std::vector<float> a(size_t(m) * k), b(size_t(k) * n), c(size_t(m) * n);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& x : a) x = u(rng);
  for (float& x : b) x = u(rng);
  auto run = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f,
                c.data(), n);
  };
  run();  // warm up: page in, spin up OpenBLAS's threads
  double best = 1e30, spent = 0;
  for (int rep = 0; rep < 3 || spent < 0.1; ++rep) {
    double t0 = now_s();
    run();
    double dt = now_s() - t0;
    best = std::min(best, dt);
    spent += dt;
    if (rep >= 50) break;
  }
  return best;
}

double load_average() {
  std::ifstream in("/proc/loadavg");
  double l = -1;
  in >> l;
  return l;
}

struct GemmKey {
  int64_t n, ic, oc;
  bool operator<(const GemmKey& o) const { return std::tie(n, ic, oc) < std::tie(o.n, o.ic, o.oc); }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Forward + backward time per op and per block of a model preset on the CPU"};
  std::string preset = "10m", config_path;
  int B = 4, T = 256, threads = 2, steps = 3;
  bool checkpoint = false;
  app.add_option("--preset", preset, "model preset (tiny, 10m, 125m, 350m, 1b, ...)");
  app.add_option("--config", config_path, "model JSON file instead of a preset");
  app.add_option("-B,--batch", B, "sequences per step");
  app.add_option("-T,--seq", T, "tokens per sequence");
  app.add_option("--threads", threads, "oneTBB and OpenBLAS threads");
  app.add_option("--steps", steps, "measured steps (after one warm-up step)");
  app.add_flag("--checkpoint", checkpoint, "activation checkpointing (recompute each block in backward)");
  bool bf16 = false;
  app.add_flag("--bf16", bf16, "bf16 matrix products (bf16 training's CPU ops: kernels/cpu/linear_bf16.cpp)");
  CLI11_PARSE(app, argc, argv);

  try {
    tbb::global_control tbb_threads(tbb::global_control::max_allowed_parallelism, size_t(threads));
    strata::kernels::cpu::set_blas_threads(threads);

    std::printf("presets:\n");
    for (const std::string& name : ModelConfig::preset_names())
      std::printf("  %-11s %15lld parameters\n", name.c_str(),
                  (long long)ModelConfig::preset(name).num_parameters());

    ModelConfig cfg = config_path.empty() ? ModelConfig::preset(preset) : ModelConfig::from_file(config_path);
    InMemoryChunks host{ModelLayout(cfg)};
    host.init(1);
    // The host backend's device and compute stream, with the CPU ops bf16 training uses when --bf16.
    std::unique_ptr<strata::Device> dev = strata::open_device({.backend = "host"});
    std::unique_ptr<strata::Stream> stream = dev->create_stream("model-bench");
    std::unique_ptr<strata::kernels::Ops> kops = strata::kernels::make_ops(
        *dev, *stream, {.matmul = bf16 ? strata::DType::bf16 : strata::DType::fp32});
    std::printf("ops: %s\n", kops->caps().name.c_str());
    // The chunks on the device in the ops' activation dtype (bf16 with --bf16), as the engine gathers them.
    DeviceChunks chunks(*dev, *kops, host);
    auto zero_grads = [&] {
      for (int c = 0; c < chunks.layout().num_chunks(); ++c) kops->zero(chunks.grad_tensor(c));
    };
    LlamaModel model(cfg, {.checkpoint_activations = checkpoint, .device = dev.get(), .ops = kops.get()});
    std::vector<int32_t> in(size_t(B) * T), tgt(size_t(B) * T);
    std::mt19937 rng(7);
    for (size_t i = 0; i < in.size(); ++i)
      in[i] = int32_t(rng() % cfg.vocab_size), tgt[i] = int32_t(rng() % cfg.vocab_size);

    // Ceiling first, on a quiet machine state.
    const double ceil_s = sgemm_seconds(2048, 2048, 2048);
    const double ceil_gflops = 2.0 * 2048.0 * 2048.0 * 2048.0 / ceil_s / 1e9;

    zero_grads();
    model.forward(chunks, in.data(), tgt.data(), B, T);  // warm-up step: buffers, page faults
    model.backward(chunks);
    Profile prof;
    model.set_profile(&prof);
    double fwd_s = 0, bwd_s = 0;
    for (int s = 0; s < steps; ++s) {
      zero_grads();
      double t0 = now_s();
      model.forward(chunks, in.data(), tgt.data(), B, T);
      double t1 = now_s();
      model.backward(chunks);
      fwd_s += t1 - t0;
      bwd_s += now_s() - t1;
    }
    fwd_s /= steps, bwd_s /= steps;
    const double step_s = fwd_s + bwd_s;

    // Plain sgemm of every linear shape the model ran.
    std::map<GemmKey, double> fwd_ref, bwd_ref;
    for (const OpStat& o : prof.ops()) {
      if (o.gemm_n == 0) continue;
      GemmKey k{o.gemm_n, o.gemm_ic, o.gemm_oc};
      if (o.phase != Phase::backward && !fwd_ref.count(k))
        fwd_ref[k] = sgemm_seconds(int(k.n), int(k.oc), int(k.ic));
      if (o.phase == Phase::backward && !bwd_ref.count(k))
        bwd_ref[k] =
            sgemm_seconds(int(k.n), int(k.ic), int(k.oc)) + sgemm_seconds(int(k.oc), int(k.ic), int(k.n));
    }
    auto ref_seconds = [&](const OpStat& o) {
      GemmKey k{o.gemm_n, o.gemm_ic, o.gemm_oc};
      return double(o.calls) / steps * (o.phase == Phase::backward ? bwd_ref.at(k) : fwd_ref.at(k));
    };

    std::printf("\nmodel %s: %lld parameters, B %d, T %d, %d threads, checkpointing %s, load average %.2f\n",
                cfg.name.c_str(), (long long)cfg.num_parameters(), B, T, threads, checkpoint ? "on" : "off",
                load_average());
    std::printf("sgemm 2048^3: %.1f GFLOP/s (ceiling)\n\n", ceil_gflops);
    std::printf("%-13s %-9s %6s %10s %7s %9s %11s %6s\n", "op", "phase", "calls", "ms/step", "%step",
                "GFLOP/s", "sgemm GF/s", "frac");
    nlohmann::json ops = nlohmann::json::array();
    double gemm_actual = 0, gemm_ref = 0, attn_s = 0;
    for (const OpStat& o : prof.ops()) {
      double sec = o.seconds / steps, fl = o.flops / steps;
      char gf[32] = "-", rgf[32] = "-", frac[32] = "-";
      double f = -1;
      if (fl > 0) std::snprintf(gf, sizeof gf, "%.1f", fl / sec / 1e9);
      if (o.gemm_n > 0) {
        double r = ref_seconds(o);
        f = r / sec;
        gemm_actual += sec, gemm_ref += r;
        std::snprintf(rgf, sizeof rgf, "%.1f", fl / r / 1e9);
        std::snprintf(frac, sizeof frac, "%.2f", f);
      } else if (o.op == "attention") {
        f = fl / ceil_gflops / 1e9 / sec;
        attn_s += sec;
        std::snprintf(frac, sizeof frac, "%.3f*", f);
      }
      std::printf("%-13s %-9s %6lld %10.3f %6.1f%% %9s %11s %6s\n", o.op.c_str(), phase_name(o.phase),
                  (long long)(o.calls / steps), sec * 1e3, 100 * sec / step_s, gf, rgf, frac);
      ops.push_back({{"op", o.op},
                     {"phase", phase_name(o.phase)},
                     {"ms", sec * 1e3},
                     {"gflops", fl > 0 ? fl / sec / 1e9 : 0.0},
                     {"frac", f >= 0 ? nlohmann::json(f) : nlohmann::json(nullptr)}});
    }
    std::printf("(* attention: fraction of the 2048^3 sgemm rate)\n\n");

    // Per chunk: forward and backward time, flops, and the GEMM-equivalent fraction for blocks.
    std::map<int, double> chunk_ref;  // GEMM-equivalent seconds per step, per chunk and phase folded
    {
      // Recompute per-block reference from the op shapes: every block has the same shapes, so one block's
      // reference is the per-step sum over blocks divided by n_layers.
      double block_ref = 0;
      for (const OpStat& o : prof.ops()) {
        if (o.gemm_n > 0 && o.op != "lm_head") block_ref += ref_seconds(o);
        if (o.op == "attention") block_ref += o.flops / steps / (ceil_gflops * 1e9);
      }
      for (int l = 0; l < cfg.n_layers; ++l) chunk_ref[1 + l] = block_ref / double(cfg.n_layers);
    }
    std::printf("%-10s %10s %10s %10s %10s %8s\n", "chunk", "fwd ms", "bwd ms", "fwd GF/s", "bwd GF/s",
                "frac");
    const ModelLayout& layout = chunks.layout();
    nlohmann::json blocks = nlohmann::json::array();
    for (int c = 0; c < layout.num_chunks(); ++c) {
      double f_s = 0, b_s = 0, f_fl = 0, b_fl = 0;
      for (const ChunkStat& s : prof.chunks()) {
        if (s.chunk != c) continue;
        if (s.phase == Phase::forward)
          f_s += s.seconds / steps, f_fl += s.flops / steps;
        else
          b_s += s.seconds / steps, b_fl += s.flops / steps;
      }
      char frac[32] = "-";
      double f = -1;
      if (chunk_ref.count(c)) {
        f = chunk_ref[c] / (f_s + b_s);
        std::snprintf(frac, sizeof frac, "%.2f", f);
      }
      std::printf("%-10s %10.3f %10.3f %10.1f %10.1f %8s\n", layout.chunk(c).name.c_str(), f_s * 1e3,
                  b_s * 1e3, f_s > 0 ? f_fl / f_s / 1e9 : 0.0, b_s > 0 ? b_fl / b_s / 1e9 : 0.0, frac);
      blocks.push_back({{"chunk", layout.chunk(c).name},
                        {"fwd_ms", f_s * 1e3},
                        {"bwd_ms", b_s * 1e3},
                        {"frac", f >= 0 ? nlohmann::json(f) : nlohmann::json(nullptr)}});
    }

    const double flops = model.forward_flops(B, T) + model.backward_flops(B, T);
    std::printf(
        "\nstep: forward %.1f ms + backward %.1f ms = %.1f ms, %.0f tokens/s, %.1f GFLOP/s = %.2f of sgemm "
        "2048^3; "
        "linear ops at %.2f of plain sgemm of the same sizes; attention %.1f%% of the step\n",
        fwd_s * 1e3, bwd_s * 1e3, step_s * 1e3, B * T / step_s, flops / step_s / 1e9,
        flops / step_s / 1e9 / ceil_gflops, gemm_ref / gemm_actual, 100 * attn_s / step_s);

    nlohmann::json j = {{"bench", "model"},
                        {"preset", cfg.name},
                        {"params", cfg.num_parameters()},
                        {"B", B},
                        {"T", T},
                        {"threads", threads},
                        {"checkpoint", checkpoint},
                        {"steps", steps},
                        {"load_average", load_average()},
                        {"sgemm_2048_gflops", ceil_gflops},
                        {"forward_ms", fwd_s * 1e3},
                        {"backward_ms", bwd_s * 1e3},
                        {"tokens_per_s", B * T / step_s},
                        {"model_gflops", flops / step_s / 1e9},
                        {"fraction_of_sgemm_2048", flops / step_s / 1e9 / ceil_gflops},
                        {"linear_fraction_of_same_size_sgemm", gemm_ref / gemm_actual},
                        {"attention_share_of_step", attn_s / step_s},
                        {"ops", ops},
                        {"chunks", blocks}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "model_bench: %s\n", e.what());
    return 1;
  }
}
