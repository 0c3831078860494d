// matmul_bench: Strata's bf16 linear ops against the CPU's ceiling for bf16 matrix products — oneDNN's
// best rate for the same products, measured in the same run — at the shapes of a model preset.
//
//   matmul_bench --preset 125m -B 4 -T 256 --threads 2 [--torch PYTHON]
//
// For every linear layer of one block (q, k, v, o, gate, up, down) and the LM head, with N = B * T rows:
//   forward   out (N, OC)  = x (N, IC) W^T
//   backward  dx  (N, IC) += dout (N, OC) W        dw (OC, IC) += dout^T x (fp32)
// Three rates per product:
//   - strata: kernels/cpu's linear_forward / linear_backward on bf16 operands (what the host
//     backend runs with bf16 activations), on oneTBB's threads;
//   - onednn: the best of oneDNN's matmul over the whole product as one call on `threads` OpenMP threads,
//     with the second operand in the plain layout and in the blocked layout oneDNN asks for (reordered
//     before the timing: packing is free for the ceiling). This is the ceiling: the library's own best on
//     this CPU at this shape;
//   - torch (with --torch): PyTorch's bf16 matmul of the same shapes on the same thread count, through
//     bench/model/torch_matmul.py, as a peer.
// "frac" is the ceiling's time over Strata's. The step line weighs each product by how often a step runs
// it (n_layers per block layer). Prints a table, then one JSON line.
#include <omp.h>
#include <tbb/global_control.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "model/config.h"

namespace {

namespace kc = strata::kernels::cpu;
using Clock = std::chrono::steady_clock;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

double now_s() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

// Best time of fn() over at least 3 runs and 0.2 s, after one warm-up run.
template <typename Fn>
double best_seconds(Fn&& fn) {
  fn();
  double best = 1e30, spent = 0;
  for (int rep = 0; rep < 3 || spent < 0.2; ++rep) {
    const double t0 = now_s();
    fn();
    const double dt_s = now_s() - t0;
    best = std::min(best, dt_s), spent += dt_s;
    if (rep >= 200) break;
  }
  return best;
}

std::vector<kc::bf16_t> random_bf16(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<kc::bf16_t> v(n);
  for (auto& x : v) x = strata::f32_to_bf16(u(rng));
  return v;
}

struct Layer {
  std::string name;
  int ic, oc, per_step;  // in and out features; how many a step runs
};

// One product C (M, N) [+]= op(A) (M, K) op(B) (K, N) as the linear ops run it.
struct Gemm {
  int M, N, K;
  bool trans_a, trans_b, c_bf16, accumulate;
  double flops() const { return 2.0 * M * N * K; }
};

// oneDNN's times for `g` as one call on the current OpenMP thread count: B plain, and B in the layout the
// primitive picks for it (reordered before timing).
struct Ceiling {
  double plain = 0, packed = 0;
  double best() const { return std::min(plain, packed); }
  Ceiling operator+(const Ceiling& o) const { return {plain + o.plain, packed + o.packed}; }
};

Ceiling onednn_seconds(const Gemm& g, const dnnl::engine& eng) {
  using dims = dnnl::memory::dims;
  const dnnl::memory::dim M = g.M, N = g.N, K = g.K;
  const dnnl::memory::desc a({M, K}, dt::bf16, g.trans_a ? dims{1, M} : dims{K, 1});
  const dnnl::memory::desc b_plain({K, N}, dt::bf16, g.trans_b ? dims{1, K} : dims{N, 1});
  const dnnl::memory::desc b_any({K, N}, dt::bf16, tag::any);
  const dnnl::memory::desc c({M, N}, g.c_bf16 ? dt::bf16 : dt::f32, dims{N, 1});
  dnnl::primitive_attr attr;
  if (g.accumulate) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  const auto av = random_bf16(std::size_t(M) * K, 1), bv = random_bf16(std::size_t(K) * N, 2);
  std::vector<float> cv(std::size_t(M) * N, 0.0f);
  dnnl::stream s(eng);
  Ceiling out;
  for (const bool packed : {false, true}) {
    const dnnl::memory::desc& bd = packed ? b_any : b_plain;
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, bd, c), attr, eng);
    const dnnl::matmul prim(pd);
    dnnl::memory am(a, eng, const_cast<kc::bf16_t*>(av.data())), cm(c, eng, cv.data());
    dnnl::memory bsrc(b_plain, eng, const_cast<kc::bf16_t*>(bv.data()));
    dnnl::memory bm = bsrc;
    if (pd.weights_desc() != b_plain) {
      bm = dnnl::memory(pd.weights_desc(), eng);
      dnnl::reorder(bsrc, bm).execute(s, bsrc, bm);
      s.wait();
    }
    (packed ? out.packed : out.plain) = best_seconds([&] {
      prim.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
      s.wait();
    });
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Strata's bf16 linear ops against oneDNN's bf16 matmul ceiling at a preset's shapes"};
  std::string preset = "125m", torch_python;
  int B = 4, T = 256, threads = 2;
  app.add_option("--preset", preset, "model preset (10m, 125m, 350m, 1b, ...)");
  app.add_option("-B,--batch", B, "sequences per step");
  app.add_option("-T,--seq", T, "tokens per sequence");
  app.add_option("--threads", threads, "oneTBB threads for Strata, OpenMP threads for oneDNN, torch threads");
  app.add_option("--torch", torch_python, "a python with torch: also measure PyTorch (torch_matmul.py)");
  CLI11_PARSE(app, argc, argv);

  try {
    const strata::model::ModelConfig cfg = strata::model::ModelConfig::preset(preset);
    const int N = B * T, C = int(cfg.d_model), F = int(cfg.ffn_dim), L = int(cfg.n_layers);
    const int Q = int(cfg.q_dim()), KV = int(cfg.kv_dim()), V = int(cfg.vocab_size);
    const std::vector<Layer> layers = {{"q", C, Q, L},    {"k", C, KV, L},   {"v", C, KV, L},
                                       {"o", Q, C, L},    {"gate", C, F, L}, {"up", C, F, L},
                                       {"down", F, C, L}, {"head", C, V, 1}};

    // The ceiling first, alone: oneDNN on `threads` OpenMP threads.
    const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    omp_set_num_threads(threads);
    struct Row {
      Layer l;
      Ceiling fwd_c, bwd_c;
      double fwd_s = 0, bwd_s = 0, fwd_torch = 0, bwd_torch = 0;
      double fwd_ceil() const { return fwd_c.best(); }
      double bwd_ceil() const { return bwd_c.best(); }
    };
    std::vector<Row> rows;
    for (const Layer& l : layers) {
      const Gemm fwd{N, l.oc, l.ic, false, true, true, false};
      const Gemm dx{N, l.ic, l.oc, false, false, true, true};
      const Gemm dw{l.oc, l.ic, N, true, false, false, true};
      rows.push_back({l, onednn_seconds(fwd, eng), onednn_seconds(dx, eng) + onednn_seconds(dw, eng)});
    }
    // Let OpenMP's team go to sleep before Strata's ops run (its workers spin for a while after a call).
    std::this_thread::sleep_for(std::chrono::seconds(1));

    // Strata's ops on oneTBB's threads.
    {
      tbb::global_control tbb_threads(tbb::global_control::max_allowed_parallelism, std::size_t(threads));
      kc::set_blas_threads(threads);
      for (Row& r : rows) {
        const int IC = r.l.ic, OC = r.l.oc;
        const auto x = random_bf16(std::size_t(N) * IC, 3), w = random_bf16(std::size_t(OC) * IC, 4),
                   dout = random_bf16(std::size_t(N) * OC, 5);
        std::vector<kc::bf16_t> out(std::size_t(N) * OC), dx(std::size_t(N) * IC, 0);
        std::vector<float> dw(std::size_t(OC) * IC, 0.0f);
        r.fwd_s = best_seconds([&] { kc::linear_forward(out.data(), x.data(), w.data(), N, IC, OC); });
        r.bwd_s = best_seconds(
            [&] { kc::linear_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), N, IC, OC); });
      }
    }

    // The peer, when asked for.
    if (!torch_python.empty()) {
      nlohmann::json shapes = nlohmann::json::array();
      for (const Row& r : rows) shapes.push_back({{"n", N}, {"ic", r.l.ic}, {"oc", r.l.oc}});
      const std::string script = std::string(STRATA_SOURCE_DIR) + "/bench/model/torch_matmul.py";
      const std::string cmd = torch_python + " " + script + " --threads " + std::to_string(threads) +
                              " --shapes '" + shapes.dump() + "'";
      FILE* p = popen(cmd.c_str(), "r");
      STRATA_CHECK(p != nullptr, "matmul_bench: cannot run ", cmd);
      std::string out;
      char buf[4096];
      while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
      if (pclose(p) != 0 || out.empty()) {
        std::fprintf(stderr, "matmul_bench: %s failed; no torch column\n", cmd.c_str());
      } else {
        const auto j = nlohmann::json::parse(out);  // torch_matmul.py prints one JSON object
        for (std::size_t i = 0; i < rows.size(); ++i) {
          rows[i].fwd_torch = j["results"][i]["fwd_s"].get<double>();
          rows[i].bwd_torch = j["results"][i]["bwd_s"].get<double>();
        }
      }
    }

    std::printf("matmul_bench: %s, N %d (B %d x T %d), %d threads\n", cfg.name.c_str(), N, B, T, threads);
    std::printf("Strata's products: %s\n\n", kc::bf16_matmul_impl().c_str());
    std::printf("%-6s %6s %6s %5s | %9s %9s %5s | %9s %9s %5s | %9s %9s\n", "layer", "IC", "OC", "/step",
                "fwd GF/s", "ceil", "frac", "bwd GF/s", "ceil", "frac", "torch fwd", "torch bwd");
    double strata_s = 0, ceil_s = 0, torch_s = 0, flops = 0, plain_s = 0, packed_s = 0;
    nlohmann::json out = nlohmann::json::array();
    for (const Row& r : rows) {
      const double f = 2.0 * N * r.l.ic * r.l.oc;  // one product's flops; backward is two
      const auto gf = [](double fl, double s) { return s > 0 ? fl / s / 1e9 : 0.0; };
      std::printf("%-6s %6d %6d %5d | %9.1f %9.1f %5.2f | %9.1f %9.1f %5.2f | %9.1f %9.1f\n",
                  r.l.name.c_str(), r.l.ic, r.l.oc, r.l.per_step, gf(f, r.fwd_s), gf(f, r.fwd_ceil()),
                  r.fwd_ceil() / r.fwd_s, gf(2 * f, r.bwd_s), gf(2 * f, r.bwd_ceil()), r.bwd_ceil() / r.bwd_s,
                  gf(f, r.fwd_torch), gf(2 * f, r.bwd_torch));
      strata_s += r.l.per_step * (r.fwd_s + r.bwd_s);
      ceil_s += r.l.per_step * (r.fwd_ceil() + r.bwd_ceil());
      torch_s += r.l.per_step * (r.fwd_torch + r.bwd_torch);
      plain_s += r.l.per_step * (r.fwd_c.plain + r.bwd_c.plain);
      packed_s += r.l.per_step * (r.fwd_c.packed + r.bwd_c.packed);
      flops += r.l.per_step * 3 * f;
      out.push_back({{"layer", r.l.name},
                     {"ic", r.l.ic},
                     {"oc", r.l.oc},
                     {"fwd_gflops", gf(f, r.fwd_s)},
                     {"fwd_ceiling_gflops", gf(f, r.fwd_ceil())},
                     {"bwd_gflops", gf(2 * f, r.bwd_s)},
                     {"bwd_ceiling_gflops", gf(2 * f, r.bwd_ceil())},
                     {"fwd_torch_gflops", gf(f, r.fwd_torch)},
                     {"bwd_torch_gflops", gf(2 * f, r.bwd_torch)}});
    }
    std::printf(
        "\nstep's linear ops: strata %.1f ms (%.1f GFLOP/s), oneDNN ceiling %.1f ms (%.1f GFLOP/s): %.2f of "
        "the ceiling",
        strata_s * 1e3, flops / strata_s / 1e9, ceil_s * 1e3, flops / ceil_s / 1e9, ceil_s / strata_s);
    if (torch_s > 0) std::printf("; torch %.1f ms (%.1f GFLOP/s)", torch_s * 1e3, flops / torch_s / 1e9);
    std::printf("\noneDNN with the second operand plain %.1f ms, packed beforehand %.1f ms\n", plain_s * 1e3,
                packed_s * 1e3);
    nlohmann::json j = {{"bench", "matmul"},
                        {"preset", cfg.name},
                        {"N", N},
                        {"threads", threads},
                        {"impl", kc::bf16_matmul_impl()},
                        {"strata_ms", strata_s * 1e3},
                        {"ceiling_ms", ceil_s * 1e3},
                        {"torch_ms", torch_s * 1e3},
                        {"ceiling_plain_ms", plain_s * 1e3},
                        {"ceiling_packed_ms", packed_s * 1e3},
                        {"fraction_of_ceiling", ceil_s / strata_s},
                        {"layers", out}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "matmul_bench: %s\n", e.what());
    return 1;
  } catch (const dnnl::error& e) {
    std::fprintf(stderr, "matmul_bench: oneDNN: %s\n", e.what());
    return 1;
  }
}
