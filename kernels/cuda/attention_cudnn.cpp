// cuDNN's fused attention (kernels/cuda/attention_cudnn.h): one forward and one backward cuDNN frontend
// SDPA graph per shape, built on first use, kept, and executed on the interface's stream. Without
// STRATA_WITH_CUDNN only the "not built" answers at the end of this file are compiled. Compiled, never run
// on a GPU.
//
// Note [cuDNN attention saved state]: cuDNN's backward needs the forward's output O and its softmax
// statistics (per query row: max + ln(sum exp) of the scaled scores, fp32). kernels/ops.h hands the
// backward the forward's out (its caller keeps it: the model's o_proj backward reads the same tensor), so
// backward() gives cuDNN that pointer as O and the forward keeps only the statistics in `saved`, an fp32
// tensor of plan().sizes.saved = B*NH*T elements, (B, NH, T): B*NH*T*4 bytes instead of the unfused
// kernel's B*NH*T*T*4. The statistics begin `saved` and O is the pointer the forward wrote, so neither
// sits at an offset inside a buffer (cuDNN checks its operands' alignment) and no padding is needed.
// Backward's scratch is cuDNN's workspace for the backward plan (its size, in whole fp32 elements), so the
// engine plans it with the other activations. The forward's workspace (often 0) is not part of `saved`
// (which is kept per layer); the caller passes it separately (CudaOps: its grown compute scratch).
//
// Note [cuDNN attention determinism]: by default (strata.deterministic_attention, OpsOptions) the backward
// graph asks for cuDNN's deterministic algorithm, so the interface stays bit-reproducible run to run
// (OpsCaps::bit_reproducible) and a step repeats bit for bit. On Hopper that algorithm takes the path that
// keeps dP in a workspace of O(B·NH·T²) fp32 — counted in the plan, as the backward's scratch is part of
// the activations (attention_sizes) — and is slower than the default one, whose dQ accumulation uses
// atomics (the last bits of dq vary run to run). false asks for that one. Where cuDNN has no plan for a
// shape it is refused and kernels/cuda's own (deterministic, unfused) kernel runs that shape; that
// fallback keeps (B,NH,T,T) fp32 scores and is far slower, so it is a warning naming the shape and why,
// and OpsCaps/attention_path() say which path runs.
//
// Note [cuDNN attention graph checks]: plan() builds a shape's two graphs in two halves. The first runs on
// the host alone (make_graphs, also reachable as cudnn_impl::check_graphs for the tests): constructing the
// graphs (the frontend picks its SDPA implementation by the library's version) and Graph::validate(),
// whose SDPA support surface refuses what the frontend knows cuDNN cannot run. That surface depends on the
// compute capability, which the frontend reads from the current device unless the graph was given one
// (context.h, populate_sm_version_from_device), so the graphs are built for an explicit `sm`: the device's
// in plan(), each target's in the tests; no cuDNN handle and no GPU is needed, only libcudnn for its
// version. The second half needs the handle and the GPU (finish): lowering to cuDNN's backend graph,
// the heuristics (which find no engine without a device), the support check, the plan build, the
// workspace size. The tests run the first half, and the lowering without a handle (cuDNN 9.8 and later
// accept that), over every shape the cuda tests and the GPU bundle's runs use, on CI machines without a
// GPU (tests/kernels/cuda_attention_cudnn_host_test.cpp).
//
// One shape a config may ask for is refused by the first half: a sequence of one token (seq_len 1). The
// backward graph refuses s_q = s_kv = 1 (cudnn_frontend/node/scaled_dot_product_flash_attention.h,
// CompositeSDPABackwardNode::pre_validate_node: "s_q = s_kv = 1 is not supported."), so plan() says so and
// kernels/cuda's own kernel runs that shape (its (B,NH,1,1) scores cost nothing).
//
// Note [cuDNN attention mask]: causal is the frontend's diagonal band with TOP_LEFT alignment and right
// bound 0 (key s is seen by query t when s <= t), which is kernels/cpu's mask for equal query and key
// lengths. The frontend's older set_causal_mask is the same setting, marked deprecated. A sliding window w
// adds the band's left bound w (set_diagonal_band_left_bound; its older name set_sliding_window_length):
// with TOP_LEFT alignment the frontend keeps key s for query t when s + w > t
// (cudnn_frontend/utils/attn_score_modifiers.h, sliding_window_mask), which is kernels/cpu's t - w < s
// and transformers' sliding_window_overlay. Where the frontend or cuDNN has no windowed graph for a shape
// (its support surface: cuDNN versions, architectures), plan() says why and kernels/cuda's own kernel,
// which takes the same window, runs that shape.
#include "kernels/cuda/attention_cudnn.h"

#include <cmath>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/cuda/attention_cudnn_impl.h"

#ifdef STRATA_WITH_CUDNN
#include <cudnn.h>
#include <cudnn_frontend.h>

#define STRATA_CUDNN_CHECK(stmt)                                                          \
  do {                                                                                    \
    cudnnStatus_t strata_s_ = (stmt);                                                     \
    if (strata_s_ != CUDNN_STATUS_SUCCESS)                                                \
      ::strata::detail::throw_backend(__FILE__, __LINE__, #stmt, "cuDNN", int(strata_s_), \
                                      cudnnGetErrorString(strata_s_));                    \
  } while (0)

namespace strata::kernels {
namespace {

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// Tensor ids in the graphs' variant packs.
enum Uid : std::int64_t { kQ = 1, kK, kV, kO, kStats, kdO, kdQ, kdK, kdV };

// The saved state: the statistics alone (Note [cuDNN attention saved state]).
std::size_t stats_elems(const AttentionShape& s) {
  return std::size_t(s.B) * std::size_t(s.NH) * std::size_t(s.T);
}
std::size_t fp32_elems(std::size_t bytes) {
  return (bytes + sizeof(float) - 1) / sizeof(float);
}

std::string describe(const AttentionShape& s) {
  return detail::cat("B=", s.B, " T=", s.T, " NH=", s.NH, " NKV=", s.NKV, " HD=", s.HD,
                     s.window > 0 ? detail::cat(" window=", s.window) : std::string(), " ",
                     dtype_name(s.dtype));
}

// cuDNN's logical dims are (B, H, T, D); ours are stored (B, T, H, D).
struct Layout {
  std::vector<std::int64_t> dim, stride;
};
Layout bthd(std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D) {
  return {{B, H, T, D}, {T * H * D, D, H * D, 1}};
}
Layout stats_layout(const AttentionShape& s) {  // fp32 (B, NH, T, 1)
  const std::int64_t B = s.B, H = s.NH, T = s.T;
  return {{B, H, T, 1}, {H * T, T, 1, 1}};
}

TensorPtr input(fe::graph::Graph& g, const char* name, std::int64_t uid, const Layout& l) {
  return g.tensor(
      fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(l.dim).set_stride(l.stride));
}
void output(const TensorPtr& t, std::int64_t uid, const Layout& l) {
  t->set_output(true).set_uid(uid).set_dim(l.dim).set_stride(l.stride);
}

// `sm` is set before any node is added: each node copies the graph's context when it is made (Note [cuDNN
// attention graph checks]).
std::shared_ptr<fe::graph::Graph> new_graph(DType dtype, int sm) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(dtype == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT)
      .set_sm_version(sm);
  return g;
}

float attn_scale(int HD) {
  return float(1.0 / std::sqrt(double(HD)));
}  // kernels/cpu's

// out, stats = sdpa(q, k, v), causal (in the shape's sliding window), with the statistics for training.
std::shared_ptr<fe::graph::Graph> forward_graph(const AttentionShape& s, int sm) {
  auto g = new_graph(s.dtype, sm);
  const Layout ql = bthd(s.B, s.T, s.NH, s.HD), kvl = bthd(s.B, s.T, s.NKV, s.HD);
  TensorPtr q = input(*g, "q", kQ, ql), k = input(*g, "k", kK, kvl), v = input(*g, "v", kV, kvl);
  auto attrs = fe::graph::SDPA_attributes()
                   .set_name("attention")
                   .set_generate_stats(true)
                   .set_attn_scale(attn_scale(s.HD))
                   .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                   .set_diagonal_band_right_bound(0);
  if (s.window > 0) attrs.set_diagonal_band_left_bound(s.window);  // Note [cuDNN attention mask]
  auto [o, stats] = g->sdpa(q, k, v, attrs);
  output(o, kO, ql);
  output(stats, kStats, stats_layout(s));
  stats->set_data_type(fe::DataType_t::FLOAT);
  return g;
}

// dq, dk, dv = sdpa_backward(q, k, v, o, dout, stats): written; dk, dv summed over each group's heads.
std::shared_ptr<fe::graph::Graph> backward_graph(const AttentionShape& s, bool deterministic, int sm) {
  auto g = new_graph(s.dtype, sm);
  const Layout ql = bthd(s.B, s.T, s.NH, s.HD), kvl = bthd(s.B, s.T, s.NKV, s.HD);
  TensorPtr q = input(*g, "q", kQ, ql), k = input(*g, "k", kK, kvl), v = input(*g, "v", kV, kvl);
  TensorPtr o = input(*g, "o", kO, ql), dout = input(*g, "dout", kdO, ql);
  TensorPtr stats = input(*g, "stats", kStats, stats_layout(s));
  stats->set_data_type(fe::DataType_t::FLOAT);
  auto attrs = fe::graph::SDPA_backward_attributes()
                   .set_name("attention_backward")
                   .set_attn_scale(attn_scale(s.HD))
                   .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                   .set_diagonal_band_right_bound(0)
                   .set_deterministic_algorithm(deterministic);    // Note [cuDNN attention determinism]
  if (s.window > 0) attrs.set_diagonal_band_left_bound(s.window);  // Note [cuDNN attention mask]
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, attrs);
  output(dq, kdQ, ql);
  output(dk, kdK, kvl);
  output(dv, kdV, kvl);
  return g;
}

// Why this class takes no graph for `s` at all (its dtype, an empty or ungrouped shape), or "".
std::string shape_refusal(const AttentionShape& s) {
  if (s.dtype != DType::bf16 && s.dtype != DType::fp16)
    return detail::cat("the activations are ", dtype_name(s.dtype), "; cuDNN's attention takes bf16 or fp16");
  if (s.B < 1 || s.T < 1 || s.NH < 1 || s.NKV < 1 || s.HD < 1 || s.NH % s.NKV != 0)
    return "an empty shape, or NH not a multiple of NKV";
  if (s.window < 0) return detail::cat("a sliding window of ", s.window, "; it must be 0 (none) or positive");
  return "";
}

// The frontend's message for a failed step, or "" (its calls may also throw).
template <class Step>
std::string run_step(Step&& step) {
  try {
    if (fe::error_t e = step(); e.is_bad()) return e.get_message();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// The host half of plan() (Note [cuDNN attention graph checks]): both graphs built for `sm` and validated.
struct Graphs {
  std::shared_ptr<fe::graph::Graph> fwd, bwd;
  cudnn_impl::GraphCheck check;  // "" where a graph passed
};
Graphs make_graphs(const AttentionShape& s, bool deterministic, int sm) {
  Graphs r;
  r.check.forward = run_step([&] {
    r.fwd = forward_graph(s, sm);
    return r.fwd->validate();
  });
  r.check.backward = run_step([&] {
    r.bwd = backward_graph(s, deterministic, sm);
    return r.bwd->validate();
  });
  return r;
}

// The device half: what Graph::build does after validate(), with the handle — the lowering, the heuristics,
// the support check, the build of the first plan that works — then the workspace size. "" when all of that
// succeeded, else why not.
std::string finish(fe::graph::Graph& g, cudnnHandle_t handle, std::int64_t* workspace) {
  std::string why = run_step([&] { return g.build_operation_graph(handle); });
  if (why.empty()) why = run_step([&] { return g.create_execution_plans({fe::HeurMode_t::A}); });
  if (why.empty()) why = run_step([&] { return g.check_support(); });
  if (why.empty()) why = run_step([&] { return g.build_plans(); });
  if (why.empty()) why = run_step([&] { return g.get_workspace_size(*workspace); });
  if (why.empty() && *workspace < 0) why = detail::cat("a negative workspace size (", *workspace, ")");
  return why;
}

void destroy_handle(cudnnHandle_t h) {
  (void)cudnnDestroy(h);  // best effort: called from a destructor
}

void execute(const fe::graph::Graph& g, cudnnHandle_t handle, std::unordered_map<std::int64_t, void*>& pack,
             void* workspace, cudaStream_t stream, const char* what, const AttentionShape& s) {
  fe::error_t e;
  try {
    e = g.execute(handle, pack, workspace);
  } catch (const std::exception& x) {
    e = fe::error_t(fe::error_code_t::GRAPH_EXECUTION_FAILED, x.what());
  }
  if (e.is_bad())
    throw BackendError(
        detail::cat("cuDNN attention ", what, " failed for ", describe(s), ": ", e.get_message()));
  STRATA_KERNEL_CHECK(stream);
}

}  // namespace

// Locking: every public method of CudnnAttention takes `mu` once; Impl's methods expect it held.
struct CudnnAttention::Impl {
  struct Entry {
    Plan plan;
    std::shared_ptr<fe::graph::Graph> fwd, bwd;  // built with cache's handle (Note [cuDNN handle lifetime])
  };

  Impl(cudaStream_t s, bool det) : stream(s), deterministic(det) {}

  // The handle on first use; false, with why, when cuDNN cannot run on this GPU.
  bool open(std::string* why) {
    if (!opened) {
      opened = true;
      try {
        detail::CudaDeviceGuard guard(stream);
        cudaDeviceProp p{};
        STRATA_CUDA_CHECK(cudaGetDeviceProperties(&p, guard.device()));
        sm = p.major * 10 + p.minor;
        cudnnHandle_t h = nullptr;
        if (p.major < 8) {
          open_error = detail::cat("cuDNN's fused attention needs compute capability 8.0 (Ampere) or newer; ",
                                   p.name, " is ", p.major, ".", p.minor);
        } else if (const cudnnStatus_t st = cudnnCreate(&h); st != CUDNN_STATUS_SUCCESS) {
          open_error =
              detail::cat("cudnnCreate: ", cudnnGetErrorString(st),
                          " (cuDNN 9 for CUDA 13 must be on the library path: /usr/local/cuda/lib64 or "
                          "the nvidia-cudnn-cu13 wheel)");
        } else {
          cache.adopt(h);
          STRATA_CUDNN_CHECK(cudnnSetStream(h, stream));
        }
      } catch (const std::exception& e) {
        open_error = e.what();
      }
      if (!open_error.empty())
        STRATA_LOG_WARN("attention: cuDNN fused attention is not available (", open_error,
                        "); kernels/cuda's own attention runs every shape");
    }
    if (why) *why = open_error;
    return open_error.empty();
  }

  const Entry& entry(const AttentionShape& s) {
    auto& plans = cache.dependents();
    if (auto it = plans.find(s); it != plans.end()) return it->second;
    Entry e;
    std::string why = shape_refusal(s);
    if (why.empty() && open(&why)) {
      // Both graphs pass the host checks before the device does any work for either.
      Graphs g = make_graphs(s, deterministic, sm);
      if (!g.check.forward.empty()) {
        why = "forward: " + g.check.forward;
      } else if (!g.check.backward.empty()) {
        why = "backward: " + g.check.backward;
      } else {
        try {
          detail::CudaDeviceGuard guard(stream);
          std::int64_t fwd_ws = 0, bwd_ws = 0;
          e.fwd = std::move(g.fwd);
          e.bwd = std::move(g.bwd);
          if (std::string f = finish(*e.fwd, cache.handle(), &fwd_ws); !f.empty()) {
            why = "forward: " + f;
          } else if (std::string b = finish(*e.bwd, cache.handle(), &bwd_ws); !b.empty()) {
            why = "backward: " + b;
          } else {
            e.plan.supported = true;
            e.plan.sizes = {.saved = stats_elems(s), .scratch = fp32_elems(std::size_t(bwd_ws))};
            e.plan.forward_workspace_bytes = std::size_t(fwd_ws);
          }
        } catch (const std::exception& x) {
          why = x.what();
        }
      }
    }
    if (!e.plan.supported && opened && open_error.empty()) {
      const double scores = 2.0 * double(s.B) * s.NH * double(s.T) * s.T * sizeof(float);
      STRATA_LOG_WARN("attention ", describe(s), ": cuDNN refused it (", why,
                      "); kernels/cuda's own unfused kernel runs this shape instead, which keeps (B,NH,T,T) "
                      "fp32 scores (",
                      format_bytes(std::size_t(scores)),
                      " for forward and backward) and is far slower; another sequence length or head "
                      "dimension may let cuDNN take it");
    }
    if (!e.plan.supported) {
      e.plan.why_not = why;
      e.fwd.reset();
      e.bwd.reset();
    }
    return plans.emplace(s, std::move(e)).first->second;
  }

  const Entry& supported(const AttentionShape& s) {
    const Entry& e = entry(s);
    STRATA_CHECK(e.plan.supported, "kernels: cuDNN attention called for ", describe(s),
                 ", which it refused: ", e.plan.why_not);
    return e;
  }

  cudaStream_t stream;
  bool deterministic = true;
  std::mutex mu;
  bool opened = false;
  std::string open_error;
  int sm = 0;  // the device's compute capability, major * 10 + minor, once opened
  // The handle and every shape's graphs: the graphs' plans are destroyed before the handle (Note [cuDNN
  // handle lifetime] in attention_cudnn_impl.h).
  cudnn_impl::ShapeCache<cudnnHandle_t, Entry> cache{&destroy_handle};
};

bool CudnnAttention::compiled_in() {
  return true;
}

CudnnAttention::CudnnAttention(cudaStream_t stream, bool deterministic)
    : impl_(std::make_unique<Impl>(stream, deterministic)) {}
CudnnAttention::~CudnnAttention() = default;

std::string CudnnAttention::describe_path() const {
  return impl_->deterministic ? "cuDNN fused attention (deterministic backward)"
                              : "cuDNN fused attention (non-deterministic backward)";
}

bool CudnnAttention::available(std::string* why_not) const {
  std::lock_guard lock(impl_->mu);
  return impl_->open(why_not);
}

const CudnnAttention::Plan& CudnnAttention::plan(const AttentionShape& shape) const {
  std::lock_guard lock(impl_->mu);
  return impl_->entry(shape).plan;
}

void CudnnAttention::forward(const AttentionShape& shape, Tensor out, Tensor saved, Tensor q, Tensor k,
                             Tensor v, void* forward_workspace) {
  std::lock_guard lock(impl_->mu);
  const Impl::Entry& e = impl_->supported(shape);
  STRATA_CHECK(saved.dtype == DType::fp32 && saved.numel >= e.plan.sizes.saved,
               "kernels: cuDNN attention's saved state needs ", e.plan.sizes.saved, " fp32 elements, got ",
               saved.numel, " of ", dtype_name(saved.dtype));
  std::unordered_map<std::int64_t, void*> pack{
      {kQ, q.data}, {kK, k.data}, {kV, v.data}, {kO, out.data}, {kStats, saved.data}};
  detail::CudaDeviceGuard guard(impl_->stream);
  execute(*e.fwd, impl_->cache.handle(), pack, forward_workspace, impl_->stream, "forward", shape);
}

void CudnnAttention::backward(const AttentionShape& shape, Tensor dq, Tensor dk, Tensor dv, Tensor scratch,
                              Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor saved) {
  std::lock_guard lock(impl_->mu);
  const Impl::Entry& e = impl_->supported(shape);
  STRATA_CHECK(saved.dtype == DType::fp32 && saved.numel >= e.plan.sizes.saved,
               "kernels: cuDNN attention's saved state needs ", e.plan.sizes.saved, " fp32 elements, got ",
               saved.numel);
  STRATA_CHECK(scratch.numel >= e.plan.sizes.scratch, "kernels: cuDNN attention's backward needs ",
               e.plan.sizes.scratch, " fp32 elements of scratch, got ", scratch.numel);
  // O is the caller's out (Note [cuDNN attention saved state]).
  std::unordered_map<std::int64_t, void*> pack{{kQ, q.data},   {kK, k.data},     {kV, v.data},
                                               {kO, out.data}, {kdO, dout.data}, {kStats, saved.data},
                                               {kdQ, dq.data}, {kdK, dk.data},   {kdV, dv.data}};
  detail::CudaDeviceGuard guard(impl_->stream);
  execute(*e.bwd, impl_->cache.handle(), pack, e.plan.sizes.scratch ? scratch.data : nullptr, impl_->stream,
          "backward", shape);
}

namespace cudnn_impl {

GraphCheck check_graphs(const AttentionShape& shape, bool deterministic, int sm) {
  if (std::string why = shape_refusal(shape); !why.empty()) return {why, why};
  Graphs g = make_graphs(shape, deterministic, sm);
  // The lowering plan() does with its handle, without one (Note [cuDNN attention graph checks]).
  const auto lower = [](fe::graph::Graph& graph) {
    return run_step([&] { return graph.build_operation_graph(cudnnHandle_t{nullptr}); });
  };
  if (g.check.forward.empty()) g.check.forward = lower(*g.fwd);
  if (g.check.backward.empty()) g.check.backward = lower(*g.bwd);
  return g.check;
}

std::size_t backend_version() {
  return cudnnGetVersion();
}

}  // namespace cudnn_impl

}  // namespace strata::kernels

#else  // !STRATA_WITH_CUDNN: the path is not built; every plan says so.

namespace strata::kernels {
namespace {
constexpr const char* kNotBuilt =
    "this binary was built without the cuDNN frontend (cmake/StrataCudnn.cmake: run "
    "scripts/install-deps.sh --cudnn-frontend and reconfigure)";
}  // namespace

struct CudnnAttention::Impl {};

bool CudnnAttention::compiled_in() {
  return false;
}
CudnnAttention::CudnnAttention(cudaStream_t, bool) {}
CudnnAttention::~CudnnAttention() = default;

std::string CudnnAttention::describe_path() const {
  return kNotBuilt;
}

bool CudnnAttention::available(std::string* why_not) const {
  if (why_not) *why_not = kNotBuilt;
  return false;
}

const CudnnAttention::Plan& CudnnAttention::plan(const AttentionShape&) const {
  static const Plan not_built = [] {
    Plan p;
    p.why_not = kNotBuilt;
    return p;
  }();
  return not_built;
}

void CudnnAttention::forward(const AttentionShape&, Tensor, Tensor, Tensor, Tensor, Tensor, void*) {
  STRATA_CHECK(false, "kernels: cuDNN attention called, but ", kNotBuilt);
}

void CudnnAttention::backward(const AttentionShape&, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                              Tensor, Tensor, Tensor) {
  STRATA_CHECK(false, "kernels: cuDNN attention called, but ", kNotBuilt);
}

namespace cudnn_impl {

GraphCheck check_graphs(const AttentionShape&, bool, int) {
  return {kNotBuilt, kNotBuilt};
}

std::size_t backend_version() {
  return 0;
}

}  // namespace cudnn_impl

}  // namespace strata::kernels

#endif
