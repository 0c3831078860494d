// Measuring this machine for the step-time model.
//
// Note [Measured rates]: what a step's time is made of, measured where a run is about to train:
//   - the products: each distinct (rows, inner, cols) of the model's forward (step_time.h,
//     forward_products), forward and backward (the input's gradient, and the weight's where it trains),
//     run once on the compute interface to warm it, then timed in three rounds of ~10 ms of back-to-back
//     runs over sets of operands taken in turn (so that they are not in the cache, as a model's are not),
//     the fastest kept. Rows and columns are capped so
//     that an operand stays under 64 MiB, the time scaled back by both (the products are long enough there
//     to be linear in them). Their FLOP over their time are the rates forward, backward and recompute are
//     predicted at. Measured every run: they depend on the shapes; the cache keeps the fastest measured
//     for each set of shapes, and that is what is predicted with (Note [The fastest run's compute]);
//   - the attention (forward and backward on one row of up to 4096 tokens) and the elementwise ops (an
//     RMSNorm, a residual add, the MLP's gate), likewise;
//   - the host link: 64 MiB from pinned memory to the device and back on a copy stream, the faster of two;
//   - the optimizers: the engine's own measurements (Note [Offload ratio]) on 16 Mi elements, beyond any
//     cache as a model's shards are (the device's on at most a quarter of the device);
//   - each NVMe directory's drive: sequential writes then reads of a 256 MiB scratch file there for half a
//     second each, through the aio settings the run swaps with (as strata nvme-tune measures); a run after
//     one that swapped takes the rate the swap itself got (Note [Drive rates from the swap] in machine.h).
// The last three do not depend on the model: they are kept in rates_cache_path() under the machine's
// identity (backend, device, CPU model, cpus; each drive by its directory), and a later run takes them
// from there (the log says which). Delete the file to measure again.
#include "zero3/machine.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string_view>

#include "core/error.h"
#include "core/log.h"
#include "nvme/tune.h"

namespace strata::zero3 {

using detail::cat;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

constexpr std::size_t kOperandBytes = std::size_t(64) << 20;
constexpr std::size_t kLinkBytes = std::size_t(64) << 20;
// Large enough that the optimizer's arrays (20 bytes an element) are far beyond any cache, as a model's are.
constexpr std::size_t kOptimizerElements = std::size_t(16) << 20;
constexpr std::uint64_t kNvmeFileBytes = std::uint64_t(256) << 20;
constexpr double kNvmeSeconds = 0.5;
// The attention is timed on one row of at most this many tokens; its time grows with T^2 beyond.
constexpr int kAttentionTokens = 4096;

nlohmann::json read_cache(const std::string& path) {
  if (path.empty()) return nlohmann::json::object();
  std::ifstream f(path);
  if (!f) return nlohmann::json::object();
  try {
    nlohmann::json j = nlohmann::json::parse(f);
    return j.is_object() ? j : nlohmann::json::object();
  } catch (const nlohmann::json::exception&) {
    STRATA_LOG_WARN("rates: ", path, " is not JSON; measuring again and writing it anew");
    return nlohmann::json::object();
  }
}

// Written whole to a temporary beside it and renamed over it, so that runs starting together never read
// half a file (the last rename wins; each writes what it measured).
void write_cache(const std::string& path, const nlohmann::json& j) {
  if (path.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  const std::string tmp = cat(path, ".", ::getpid(), ".tmp");
  {
    std::ofstream f(tmp);
    if (!f) {
      STRATA_LOG_WARN("rates: cannot write ", tmp, "; the rates are measured again next run");
      return;
    }
    f << j.dump(2) << "\n";
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) std::remove(tmp.c_str());
}

double link_rate(Device& dev, Stream& copy, CopyKind kind) {
  const std::size_t n = std::min<std::size_t>(kLinkBytes, dev.caps().capacity / 8);
  PinnedBuffer host(dev, n);
  DeviceBuffer device(dev, n, "rates.link");
  std::fill_n(static_cast<char*>(host.data()), n, char(1));
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = Clock::now();
    if (kind == CopyKind::host_to_device)
      copy.copy_async(device.data(), host.data(), n, kind);
    else
      copy.copy_async(host.data(), device.data(), n, kind);
    copy.synchronize();
    const double t = since(t0);
    if (i > 0) best = std::max(best, double(n) / t);
  }
  return best;
}

// The CPU's norm and overflow check over fp32 gradients in pinned memory, elements a second.
double grad_norm_rate(Device& dev, cpu_optim::Optimizer& opt) {
  const std::size_t n = kOptimizerElements;
  PinnedBuffer g(dev, n * sizeof(float));
  std::fill_n(static_cast<float*>(g.data()), n, 1e-3f);
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = Clock::now();
    (void)opt.grad_stats(g.data(), DType::fp32, n);
    const double t = since(t0);
    if (i > 0) best = std::max(best, double(n) / t);
  }
  return best;
}

struct DriveRates {
  double read = 0, write = 0;
};

// Sequential writes, then reads, of a scratch file under `dir` for kNvmeSeconds each, through an engine of
// `aio`. (Reads of one file while another was written measured 1.43 GB/s together here, where the swap
// moved 4.11 GB/s: the swap's own rate is what later runs take, Note [Drive rates from the swap].)
DriveRates drive_rates(const std::string& dir, const nvme::AioOptions& aio) {
  nvme::ScratchFile file(dir, kNvmeFileBytes, aio.use_direct);
  const std::size_t buf_bytes = nvme::measure_buffer_bytes(aio);
  void* buf = nullptr;
  if (posix_memalign(&buf, 4096, buf_bytes) != 0 || !buf)
    throw OutOfMemory(cat("cannot allocate a ", format_size(buf_bytes), " NVMe measurement buffer"));
  std::fill_n(static_cast<char*>(buf), buf_bytes, char(7));
  DriveRates r;
  try {
    nvme::AioEngine engine(aio);
    r.write = nvme::measure(engine, file.file(), file.bytes(), nvme::Pattern::seq_write, kNvmeSeconds, buf,
                            buf_bytes)
                  .gbps *
              1e9;
    r.read = nvme::measure(engine, file.file(), file.bytes(), nvme::Pattern::seq_read, kNvmeSeconds, buf,
                           buf_bytes)
                 .gbps *
             1e9;
  } catch (...) {
    std::free(buf);
    throw;
  }
  std::free(buf);
  return r;
}

// The drive's key: the directory's device number, so that two directories on one drive share it.
std::string drive_key(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return cat("dir:", dir);
  return cat("dev:", std::uint64_t(st.st_dev));
}

}  // namespace

std::vector<std::string> nvme_dirs(const Config& cfg) {
  std::vector<std::string> dirs;
  for (const auto* paths :
       {&cfg.zero_optimization.offload_optimizer.nvme_paths, &cfg.zero_optimization.offload_param.nvme_paths})
    for (const std::string& d : *paths)
      if (std::find(dirs.begin(), dirs.end(), d) == dirs.end()) dirs.push_back(d);
  return dirs;
}

double adam_rate(Device& dev, cpu_optim::Optimizer& opt, std::size_t n) {
  PinnedBuffer buf(dev, n * (4 * sizeof(float) + sizeof(std::uint16_t)));
  std::memset(buf.data(), 0, buf.size());
  float* f = static_cast<float*>(buf.data());
  cpu_optim::Shard sh;
  sh.params = f;
  sh.grads = f + n;
  sh.exp_avg = f + 2 * n;
  sh.exp_avg_sq = f + 3 * n;
  sh.out = f + 4 * n;
  sh.n = n;
  cpu_optim::ShardStep st;
  double best = 0;
  for (int step = 1; step <= 4; ++step) {
    const auto t0 = Clock::now();
    opt.adam(st, cpu_optim::AdamParams{}, step, sh);
    const double t = since(t0);
    if (step > 1) best = std::max(best, double(n) / t);
  }
  return best;
}

void record_swap_rate(const Device& dev, int cores, const std::vector<std::string>& dirs,
                      const nvme::IoStats& io) {
  const double bytes = double(io.bytes_read + io.bytes_written);
  if (dirs.empty() || bytes < double(std::uint64_t(1) << 30) || io.busy_seconds <= 0) return;
  const std::string path = rates_cache_path();
  nlohmann::json cache = read_cache(path);
  nlohmann::json& mine = cache[machine_identity(dev, cores)];
  // A swap file striped over several drives: each drive's share.
  for (const std::string& dir : dirs)
    mine["nvme"][drive_key(dir)]["swap"] = bytes / io.busy_seconds / double(dirs.size());
  write_cache(path, cache);
}

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

std::string rates_cache_path() {
  if (const char* p = std::getenv("STRATA_RATES_CACHE"); p && *p) return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return cat(x, "/strata/rates.json");
  if (const char* h = std::getenv("HOME"); h && *h) return cat(h, "/.cache/strata/rates.json");
  return {};
}

std::string machine_identity(const Device& dev, int cores) {
  const DeviceCaps& c = dev.caps();
  return cat(to_string(c.backend), " | ", c.name, " | ", cpu_model_name(), " | ", cores, " cpus");
}

namespace {

// Seconds one fn() takes on `compute`: one untimed run (a library's first call of a shape prepares it),
// then the best of `timed` rounds, each as many runs back to back as fill ~10 ms (at most 16), so that a
// stream's hand-off and synchronisation do not count against short ops.
template <class Fn>
double best_of(Stream& compute, int timed, Fn&& fn) {
  compute.synchronize();
  auto t0 = Clock::now();
  fn();
  compute.synchronize();
  const double first = since(t0);
  const int reps = int(std::clamp(0.01 / std::max(first, 1e-6), 1.0, 16.0));
  double best = 0;
  for (int i = 0; i < timed; ++i) {
    t0 = Clock::now();
    for (int r = 0; r < reps; ++r) fn();
    compute.synchronize();
    const double t = since(t0) / reps;
    best = best == 0 ? t : std::min(best, t);
  }
  return best;
}

// The compute samples' key in the cache: what their times depend on (the products' shapes, the attention's
// row and heads, the elementwise ops' rows and widths, the activation dtype).
std::string compute_key(const std::vector<Product>& products, const model::ModelConfig& m, int B, int T,
                        DType activation) {
  std::vector<std::string> shapes;
  for (const Product& p : products)
    shapes.push_back(cat(p.rows, "x", p.inner, "x", p.cols, p.trains ? "" : " frozen"));
  std::sort(shapes.begin(), shapes.end());
  shapes.erase(std::unique(shapes.begin(), shapes.end()), shapes.end());
  std::string key = cat(dtype_name(activation), " products");
  for (const std::string& sh : shapes) key += " " + sh;
  return cat(key, "; attention ", std::min(T, kAttentionTokens), " tokens ", m.n_heads, "/", m.n_kv_heads,
             "x", m.head_dim(), "; elementwise ", B * T, " rows ", m.d_model, "/", m.ffn_dim);
}

}  // namespace

ProductRates measure_products(Device& dev, Stream& compute, kernels::Ops& ops,
                              const std::vector<Product>& products, DType activation, DType working) {
  using kernels::Tensor;
  const std::size_t ab = dtype_bytes(activation), wb = dtype_bytes(working);
  struct Timed {
    double forward = 0, backward = 0;  // seconds a product of the shape at its full rows and columns
  };
  std::map<std::array<std::int64_t, 4>, Timed> timed;
  double forward_flops = 0, backward_flops = 0, forward_s = 0, backward_s = 0;
  for (const Product& p : products) {
    const std::array<std::int64_t, 4> key{p.rows, p.inner, p.cols, p.trains ? 1 : 0};
    if (!timed.count(key)) {
      // Operands of at most `room` bytes: the rows and the columns cut, the time scaled back by both.
      const std::size_t room = std::min<std::size_t>(kOperandBytes, dev.caps().capacity / 32);
      const std::int64_t cols = std::max<std::int64_t>(
          1, std::min<std::int64_t>(p.cols, std::int64_t(room / (sizeof(float) * std::size_t(p.inner)))));
      const std::int64_t widest = std::max(p.inner, cols);
      const std::int64_t rows = std::max<std::int64_t>(
          1, std::min<std::int64_t>(p.rows, std::int64_t(room / (ab * std::size_t(widest)))));
      const std::size_t nx = std::size_t(rows * p.inner), nw = std::size_t(p.inner * cols),
                        no = std::size_t(rows * cols);
      // Sets of operands taken in turn, as many as make 4x the room: a model's products read weights and
      // inputs that are not in the cache, and neither are these.
      const std::size_t set_bytes = 2 * nx * ab + nw * (wb + sizeof(float)) + 2 * no * ab;
      const std::size_t sets = std::clamp<std::size_t>(4 * room / std::max<std::size_t>(1, set_bytes), 1, 16);
      DeviceBuffer buf(dev, sets * set_bytes + 256, "rates.products");
      compute.memset_async(buf.data(), 0, buf.size());
      struct Set {
        Tensor x, dx, w, dw, out, dout;
      };
      std::vector<Set> ts(sets);
      char* at = static_cast<char*>(buf.data());
      auto take = [&](std::size_t n, DType t) {
        Tensor x{at, t, n};
        at += n * dtype_bytes(t);
        return x;
      };
      for (Set& t : ts)
        t = {take(nx, activation),  take(nx, activation), take(nw, working),
             take(nw, DType::fp32), take(no, activation), take(no, activation)};
      std::size_t turn = 0;
      const double scale = double(p.rows) / double(rows) * double(p.cols) / double(cols);
      Timed& tm = timed[key];
      if (timed.size() == 1)  // the first shape: a round untimed wakes the compute threads
        best_of(compute, 1,
                [&] { ops.linear_forward(ts[0].out, ts[0].x, ts[0].w, int(rows), int(p.inner), int(cols)); });
      tm.forward = scale * best_of(compute, 3, [&] {
                     const Set& t = ts[turn++ % sets];
                     ops.linear_forward(t.out, t.x, t.w, int(rows), int(p.inner), int(cols));
                   });
      tm.backward = scale * best_of(compute, 3, [&] {
                      const Set& t = ts[turn++ % sets];
                      ops.linear_backward(t.dx, p.trains ? t.dw : Tensor{}, t.dout, t.x, t.w, int(rows),
                                          int(p.inner), int(cols));
                    });
    }
    forward_flops += p.flops();
    backward_flops += p.flops() * (p.trains ? 2 : 1);
    forward_s += timed[key].forward * p.count;
    backward_s += timed[key].backward * p.count;
  }
  return {forward_s > 0 ? forward_flops / forward_s : 0, backward_s > 0 ? backward_flops / backward_s : 0};
}

double measure_attention(Device& dev, Stream& compute, kernels::Ops& ops, const model::ModelConfig& m, int T,
                         DType activation) {
  using kernels::Tensor;
  const int Tm = std::max(1, std::min(T, kAttentionTokens)), NH = int(m.n_heads), NKV = int(m.n_kv_heads),
            HD = int(m.head_dim());
  const std::size_t a = dtype_bytes(activation), q = std::size_t(Tm) * std::size_t(NH * HD),
                    kv = std::size_t(Tm) * std::size_t(NKV * HD);
  const kernels::AttentionSizes as = ops.attention_sizes(1, Tm, NH, NKV, HD);
  DeviceBuffer buf(dev, (4 * q + 4 * kv) * a + (as.saved + as.scratch) * sizeof(float) + 256,
                   "rates.attention");
  compute.memset_async(buf.data(), 0, buf.size());
  char* p = static_cast<char*>(buf.data());
  auto take = [&](std::size_t n, DType t) {
    Tensor x{p, t, n};
    p += n * dtype_bytes(t);
    return x;
  };
  const Tensor Q = take(q, activation), K = take(kv, activation), V = take(kv, activation),
               O = take(q, activation), dO = take(q, activation), dQ = take(q, activation),
               dK = take(kv, activation), dV = take(kv, activation), saved = take(as.saved, DType::fp32),
               scratch = take(as.scratch, DType::fp32);
  const double t = best_of(compute, 2, [&] {
    ops.attention_forward(O, saved, Q, K, V, 1, Tm, NH, NKV, HD);
    ops.attention_backward(dQ, dK, dV, scratch, dO, Q, K, V, O, saved, 1, Tm, NH, NKV, HD);
  });
  // Forward's FLOP and backward's twice them, as the step-time model counts them.
  const double flops = 3.0 * 4.0 * double(NH) * double(HD) * double(Tm) * double(Tm + 1) / 2.0;
  return t > 0 ? flops / t : 0;
}

double measure_elementwise(Device& dev, Stream& compute, kernels::Ops& ops, const model::ModelConfig& m,
                           int N, DType activation, DType working) {
  using kernels::Tensor;
  const std::size_t a = dtype_bytes(activation), C = std::size_t(m.d_model), F = std::size_t(m.ffn_dim);
  const std::size_t room = std::min<std::size_t>(kOperandBytes, dev.caps().capacity / 16);
  const int rows = int(std::max<std::size_t>(1, std::min<std::size_t>(std::size_t(N), room / (a * F))));
  const std::size_t R = std::size_t(rows);
  // Sets taken in turn, as in measure_products: out of the cache, as a model's activations are.
  const std::size_t set_bytes =
      (3 * R * C + 3 * R * F) * a + R * sizeof(float) + C * dtype_bytes(working) + 256;
  const std::size_t sets = std::clamp<std::size_t>(4 * room / set_bytes, 1, 8);
  DeviceBuffer buf(dev, sets * set_bytes, "rates.elementwise");
  compute.memset_async(buf.data(), 0, buf.size());
  char* p = static_cast<char*>(buf.data());
  auto take = [&](std::size_t n, DType t) {
    Tensor x{p, t, n};
    p += (n * dtype_bytes(t) + 63) / 64 * 64;
    return x;
  };
  struct Set {
    Tensor x, y, z, gate, up, h, rstd, w;
  };
  std::vector<Set> ts(sets);
  for (Set& t : ts)
    t = {take(R * C, activation), take(R * C, activation), take(R * C, activation), take(R * F, activation),
         take(R * F, activation), take(R * F, activation), take(R, DType::fp32),    take(C, working)};
  std::size_t turn = 0;
  const double t = best_of(compute, 3, [&] {
    const Set& e = ts[turn++ % sets];
    ops.rmsnorm_forward(e.y, e.rstd, e.x, e.w, rows, int(C), 1e-5f);
    ops.residual_forward(e.z, e.x, e.y);
    if (m.traits().act == model::MlpActivation::gelu_tanh)
      ops.geglu_forward(e.h, e.gate, e.up);
    else
      ops.swiglu_forward(e.h, e.gate, e.up);
  });
  const double bytes = double(R) * double(a) * (2.0 * double(C) + 3.0 * double(C) + 3.0 * double(F));
  return t > 0 ? bytes / t : 0;
}

MachineRates measure_machine(const MeasureKit& kit, const model::ModelConfig& m, int B, int T) {
  MachineRates r;
  const DeviceCaps& caps = kit.dev.caps();
  r.host_backend = caps.backend == BackendKind::host;
  r.name = cat(to_string(caps.backend), " backend, ", r.host_backend ? cpu_model_name() : caps.name, " (",
               kit.cores, " cpus)");
  r.device_memory = caps.capacity;
  r.cores = kit.cores;
  const auto t0 = Clock::now();
  // A device too small for the samples' operands (a cap the plan will refuse anyway) leaves the rates it
  // could not measure at 0: the prediction then names what it lacks (StepPrediction.missing).
  auto sampled = [&](const char* what, auto&& fn) {
    try {
      fn();
    } catch (const OutOfMemory&) {
      kit.compute.synchronize();
      STRATA_LOG_WARN("rates: the device has no room to measure ", what, " (", format_size(caps.capacity, 1),
                      "); the step is predicted without it");
    }
  };
  const std::vector<Product> products = forward_products(m, B, T, m.lora.active());
  sampled("the products", [&] {
    const ProductRates pr =
        measure_products(kit.dev, kit.compute, kit.ops, products, kit.activation, kit.working);
    r.compute_flops = pr.forward;
    r.backward_flops = pr.backward;
  });
  sampled("the attention", [&] {
    r.attention_flops = measure_attention(kit.dev, kit.compute, kit.ops, m, T, kit.activation);
  });
  sampled("the elementwise ops", [&] {
    r.memory_bandwidth =
        measure_elementwise(kit.dev, kit.compute, kit.ops, m, B * T, kit.activation, kit.working);
  });
  const std::string path = rates_cache_path();
  nlohmann::json cache = read_cache(path);
  const std::string id = machine_identity(kit.dev, kit.cores);
  nlohmann::json& mine = cache[id];
  bool measured = false;
  // Note [The fastest run's compute]: a sample taken while something else held the cores (the last
  // process's teardown, the kernel's writeback) read 150 - 610 GFLOP/s here where the steps that followed ran
  // at the ~750 the other runs measured, and the prediction missed by a third. The compute's rates are kept
  // per shape (the products', the attention's and the elementwise ops' sizes and dtype) as the fastest any
  // run here measured, and the prediction takes that: the steps run at the machine's rate, not at that of
  // the start-up's worst moment.
  std::string now;
  {
    nlohmann::json& best = mine["compute"][compute_key(products, m, B, T, kit.activation)];
    const std::array<std::pair<const char*, double*>, 4> rates{{{"forward", &r.compute_flops},
                                                                {"backward", &r.backward_flops},
                                                                {"attention", &r.attention_flops},
                                                                {"elementwise", &r.memory_bandwidth}}};
    for (const auto& [key, rate] : rates) {
      if (*rate <= 0) continue;  // not measured (no room): nothing to compare
      now += cat(now.empty() ? "" : ", ", key, " ", *rate / 1e9,
                 std::string_view(key) == "elementwise" ? " GB/s" : " GFLOP/s");
      const double kept = best.is_object() ? best.value(key, 0.0) : 0.0;
      if (*rate > kept) {
        best[key] = *rate;
        measured = true;
      } else {
        *rate = kept;
      }
    }
  }
  // The CPU's rates are cached as measured; the link's and the device optimizer's only where the device
  // had room for their whole samples (1 GiB), so that a run on a larger device measures them whole.
  if (!mine.contains("cpu_optimizer") || !mine.contains("grad_norm")) {
    mine["grad_norm"] = kit.optimizer ? grad_norm_rate(kit.dev, *kit.optimizer) : 0.0;
    mine["cpu_optimizer"] = kit.cpu_optimizer ? kit.cpu_optimizer(kOptimizerElements) : 0.0;
    measured = true;
  }
  r.cpu_optimizer = mine["cpu_optimizer"].get<double>();
  r.grad_norm = mine["grad_norm"].get<double>();
  if (mine.contains("link_h2d") && mine.contains("device_optimizer")) {
    r.link_h2d = mine["link_h2d"].get<double>();
    r.link_d2h = mine["link_d2h"].get<double>();
    r.device_optimizer = mine["device_optimizer"].get<double>();
  } else {
    sampled("the link", [&] {
      r.link_h2d = link_rate(kit.dev, kit.copy, CopyKind::host_to_device);
      r.link_d2h = link_rate(kit.dev, kit.copy, CopyKind::device_to_host);
    });
    // The device's sample takes at most a quarter of the device (20 bytes an element).
    sampled("the device optimizer", [&] {
      r.device_optimizer = kit.device_optimizer
                               ? kit.device_optimizer(std::max<std::size_t>(
                                     1 << 10, std::min(kOptimizerElements, caps.capacity / 80)))
                               : 0.0;
    });
    if (caps.capacity >= std::uint64_t(1) << 30 && r.link_h2d > 0 && r.device_optimizer > 0) {
      mine["link_h2d"] = r.link_h2d;
      mine["link_d2h"] = r.link_d2h;
      mine["device_optimizer"] = r.device_optimizer;
      measured = true;
    }
  }
  std::string drives;
  for (const std::string& dir : kit.nvme_dirs) {
    const std::string key = drive_key(dir);
    nlohmann::json& d = mine["nvme"][key];
    if (!d.contains("read")) {
      try {
        const DriveRates dr = drive_rates(dir, kit.aio);
        d = {{"read", dr.read}, {"write", dr.write}, {"dir", dir}};
        measured = true;
      } catch (const Error& e) {
        STRATA_LOG_WARN("rates: cannot measure the drive under ", dir, " (", e.what(),
                        "); its placements have no prediction");
        continue;
      }
    }
    // Several directories stripe a swap file over their drives: their rates add up.
    r.nvme_read += d["read"].get<double>();
    r.nvme_write += d["write"].get<double>();
    // The swap's own rate once a run has recorded one (Note [Drive rates from the swap]).
    if (d.contains("swap")) r.nvme_swap += d["swap"].get<double>();
    drives += cat(drives.empty() ? "" : ", ", dir);
  }
  if (measured) write_cache(path, cache);
  r.source = cat(measured ? "measured" : "products measured, the rest from the cache", " (",
                 path.empty() ? "no cache file" : path, ")");
  STRATA_LOG_INFO(
      "rates: ", r.name, ": products ", r.compute_flops / 1e9, " GFLOP/s forward and ",
      r.backward_flops / 1e9, " backward at the model's shapes, attention ", r.attention_flops / 1e9,
      " GFLOP/s, elementwise ops ", r.memory_bandwidth / 1e9,
      " GB/s (the fastest measured here at these shapes; this run: ", now, "), link ", r.link_h2d / 1e9,
      " / ", r.link_d2h / 1e9, " GB/s to / from the device, CPU optimizer ", r.cpu_optimizer / 1e6,
      " M elements/s, gradient norm ", r.grad_norm / 1e6, " M elements/s, device optimizer ",
      r.device_optimizer / 1e6, " M elements/s",
      drives.empty()
          ? ""
          : cat(", NVMe ", r.nvme_read / 1e9, " / ", r.nvme_write / 1e9, " GB/s read / write",
                r.nvme_swap > 0 ? cat(", ", r.nvme_swap / 1e9, " GB/s as an earlier run's swap moved it")
                                : std::string(),
                " under ", drives),
      "; ", measured ? "measured" : "cached", " in ", path.empty() ? "(none)" : path, ", ", since(t0), " s");
  return r;
}

}  // namespace strata::zero3
