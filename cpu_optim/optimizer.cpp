// strata/cpu_optim/optimizer.cpp: the Optimizer: argument checks, step bookkeeping, threads, dispatch.
#include <pthread.h>
#include <sched.h>
#include <tbb/blocked_range.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/arena_pin.h"
#include "core/error.h"
#include "core/log.h"
#include "core/topology.h"
#include "cpu_optim/cpu_optim.h"
#include "cpu_optim/kernels_impl.h"
#include "cpu_optim/target_impl.h"

namespace strata::cpu_optim {
namespace {

// Shards below this many elements run on the calling thread: waking workers costs more than it saves.
constexpr std::size_t kSerialBelow = std::size_t(1) << 16;
// Per-thread ranges start at multiples of this many elements (whole cache lines of every dtype).
constexpr std::size_t kRangeAlign = 64;

void check_buffer(const void* p, std::size_t n, std::size_t elem, const char* what, const char* call) {
  STRATA_CHECK(n == 0 || p != nullptr, call, ": shard.", what, " is null but the shard has ", n, " elements");
  STRATA_CHECK(reinterpret_cast<std::uintptr_t>(p) % elem == 0, call, ": shard.", what, " (", p,
               ") is not aligned to its ", elem, "-byte element");
}

void check_shard(const Shard& s, bool uses_m, bool uses_v, const char* call) {
  STRATA_CHECK(dtype_is_float(s.grad_dtype), call, ": grad_dtype ", dtype_name(s.grad_dtype),
               " is not supported; use fp32, bf16 or fp16");
  STRATA_CHECK(s.state_dtype == DType::fp32 || s.state_dtype == DType::bf16, call, ": state_dtype ",
               dtype_name(s.state_dtype), " is not supported; use fp32 or bf16");
  STRATA_CHECK(s.out == nullptr || s.out_dtype == DType::bf16 || s.out_dtype == DType::fp16, call,
               ": out_dtype must be bf16 or fp16 (the fp32 result is already in params)");
  check_buffer(s.params, s.n, 4, "params", call);
  check_buffer(s.grads, s.n, dtype_bytes(s.grad_dtype), "grads", call);
  if (uses_m) check_buffer(s.exp_avg, s.n, dtype_bytes(s.state_dtype), "exp_avg", call);
  if (uses_v) check_buffer(s.exp_avg_sq, s.n, dtype_bytes(s.state_dtype), "exp_avg_sq", call);
  if (s.out != nullptr) check_buffer(s.out, s.n, 2, "out", call);
}

void check_beta(float beta, const char* name, const char* call, bool closed) {
  if (!(beta >= 0.0f && (closed ? beta <= 1.0f : beta < 1.0f))) {
    throw ConfigError(detail::cat(call, ": ", name, " = ", beta, " is outside [0, 1", closed ? "]" : ")"));
  }
}

// True when `step` is new for this shard; false when it repeats the last one (nothing to do).
bool begin_step(const ShardStep& st, std::int64_t step, const char* call) {
  STRATA_CHECK(step >= 1, call, ": step ", step, " must be at least 1 (steps are numbered from 1)");
  if (step == st.step) return false;
  if (step < st.step) {
    throw ConfigError(detail::cat(call, ": step ", step, " is behind this shard's last step ", st.step,
                                  "; steps only go forward (reset the shard's ShardStep when restoring an "
                                  "earlier checkpoint)"));
  }
  return true;
}

impl::UpdateArgs base_args(const Shard& s, float grad_scale, bool uses_m, bool uses_v, bool stream_out) {
  impl::UpdateArgs a;
  a.p = s.params;
  a.g = s.grads;
  a.m = uses_m ? s.exp_avg : nullptr;
  a.v = uses_v ? s.exp_avg_sq : nullptr;
  a.out = s.out;
  a.grad_scale = grad_scale;
  a.stream_out = stream_out;
  return a;
}

impl::UpdateFn pick(const impl::UpdateTable* t, const Shard& s) {
  STRATA_CHECK(t != nullptr, "cpu_optim: no kernel table for the chosen SIMD target");
  const int g = int(s.grad_dtype);
  const int st = s.state_dtype == DType::bf16 ? 1 : 0;
  const int o = s.out == nullptr ? 0 : (s.out_dtype == DType::bf16 ? 1 : 2);
  return t->fn[g][st][o];
}

}  // namespace

struct Optimizer::Impl {
  impl::Target target;
  int threads = 1;
  bool stream_output = true;
  tbb::task_arena arena;
  std::unique_ptr<ArenaPin> pin;

  // Contiguous range `part` of `parts` over [0, n), starting at a multiple of kRangeAlign.
  static std::pair<std::size_t, std::size_t> range(std::size_t n, std::size_t parts, std::size_t part) {
    std::size_t chunk = (n + parts - 1) / parts;
    chunk = (chunk + kRangeAlign - 1) / kRangeAlign * kRangeAlign;
    const std::size_t b = std::min(n, part * chunk);
    return {b, std::min(n, b + chunk)};
  }

  std::size_t parts_for(std::size_t n) const { return n < kSerialBelow ? 1 : std::size_t(threads); }

  template <class Fn>
  void parallel(std::size_t parts, const Fn& fn) {
    if (parts == 1) {
      fn(std::size_t(0));
      return;
    }
    arena.execute([&] {
      tbb::parallel_for(
          tbb::blocked_range<std::size_t>(0, parts, 1),
          [&](const tbb::blocked_range<std::size_t>& r) {
            for (std::size_t t = r.begin(); t != r.end(); ++t) fn(t);
          },
          tbb::static_partitioner());
    });
  }

  bool update(impl::UpdateFn fn, const impl::UpdateArgs& a, std::size_t n) {
    const std::size_t parts = parts_for(n);
    std::vector<char> finite(parts, 1);
    parallel(parts, [&](std::size_t t) {
      const auto [b, e] = range(n, parts, t);
      if (b < e) finite[t] = fn(a, b, e) ? 1 : 0;
    });
    return std::all_of(finite.begin(), finite.end(), [](char f) { return f != 0; });
  }
};

Optimizer::Optimizer(const Options& options) : impl_(std::make_unique<Impl>()) {
  if (options.threads < 0) {
    throw ConfigError(detail::cat("strata.threads: ", options.threads,
                                  " is negative; use 0 (all cores) or a thread count"));
  }
  impl_->target = impl::resolve_target(options.simd);
  impl_->stream_output = options.stream_output;
  if (impl_->target.from_env) {
    STRATA_LOG_INFO("cpu_optim: SIMD target ", impl_->target.name, " forced by ", impl::kSimdEnv);
  }
  const int cores = std::max(1, tbb::info::default_concurrency());
  impl_->threads = options.threads > 0 ? options.threads : cores;
  // More ranges than cores is allowed (the split is then finer than the parallelism) but oneTBB would
  // refuse the extra workers, so the arena asks for no more than it may have.
  impl_->arena.initialize(std::min(impl_->threads, cores));
  if (options.pin)
    impl_->pin = std::make_unique<ArenaPin>(
        impl_->arena, options.cpus.empty() ? Topology::get().all_cpus() : options.cpus, "optimizer");
  STRATA_LOG_DEBUG("cpu_optim: SIMD target ", impl_->target.name, ", ", impl_->threads, " threads",
                   options.pin ? ", pinned" : "");
}

Optimizer::~Optimizer() = default;

const std::string& Optimizer::target() const {
  return impl_->target.name;
}
int Optimizer::threads() const {
  return impl_->threads;
}

bool Optimizer::adam(ShardStep& state, const AdamParams& hp, std::int64_t step, const Shard& shard,
                     float grad_scale) {
  check_shard(shard, true, true, "adam");
  check_beta(hp.beta1, "beta1", "adam", false);
  check_beta(hp.beta2, "beta2", "adam", false);
  if (!begin_step(state, step, "adam")) return state.finite;
  impl::UpdateArgs a = base_args(shard, grad_scale, true, true, impl_->stream_output);
  const double t = double(step);
  const double bc1 = hp.bias_correction ? 1.0 - std::pow(double(hp.beta1), t) : 1.0;
  const double bias2 = hp.bias_correction ? 1.0 / std::sqrt(1.0 - std::pow(double(hp.beta2), t)) : 1.0;
  a.beta1 = hp.beta1;
  a.one_minus_beta1 = 1.0f - hp.beta1;
  a.beta2 = hp.beta2;
  a.one_minus_beta2 = 1.0f - hp.beta2;
  a.eps = hp.eps;
  a.bias2 = float(bias2);
  a.step_size = float(-double(hp.lr) / bc1);
  a.weight_decay = hp.weight_decay;
  a.w_decay = float(-double(hp.lr) * double(hp.weight_decay));
  const impl::AdamDecay decay = hp.weight_decay == 0.0f ? impl::AdamDecay::none
                                : hp.adamw              ? impl::AdamDecay::decoupled
                                                        : impl::AdamDecay::l2;
  state.finite = impl_->update(pick(impl::adam_table(decay, impl_->target.bit), shard), a, shard.n);
  state.step = step;
  return state.finite;
}

bool Optimizer::adagrad(ShardStep& state, const AdagradParams& hp, std::int64_t step, const Shard& shard,
                        float grad_scale) {
  check_shard(shard, false, true, "adagrad");
  if (!begin_step(state, step, "adagrad")) return state.finite;
  impl::UpdateArgs a = base_args(shard, grad_scale, false, true, impl_->stream_output);
  a.eps = hp.eps;
  a.step_size = -hp.lr;
  a.weight_decay = hp.weight_decay;
  const bool l2 = hp.weight_decay != 0.0f;
  state.finite = impl_->update(pick(impl::adagrad_table(l2, impl_->target.bit), shard), a, shard.n);
  state.step = step;
  return state.finite;
}

bool Optimizer::lion(ShardStep& state, const LionParams& hp, std::int64_t step, const Shard& shard,
                     float grad_scale) {
  check_shard(shard, true, false, "lion");
  check_beta(hp.beta1, "beta1", "lion", true);
  check_beta(hp.beta2, "beta2", "lion", true);
  if (!begin_step(state, step, "lion")) return state.finite;
  impl::UpdateArgs a = base_args(shard, grad_scale, true, false, impl_->stream_output);
  a.beta1 = hp.beta1;
  a.one_minus_beta1 = 1.0f - hp.beta1;
  a.beta2 = hp.beta2;
  a.one_minus_beta2 = 1.0f - hp.beta2;
  a.step_size = -hp.lr;
  a.w_decay = float(-double(hp.lr) * double(hp.weight_decay));
  const bool decoupled = hp.weight_decay != 0.0f;
  state.finite = impl_->update(pick(impl::lion_table(decoupled, impl_->target.bit), shard), a, shard.n);
  state.step = step;
  return state.finite;
}

std::vector<double> Optimizer::grad_block_sums(const void* grads, DType grad_dtype, std::size_t n,
                                               float scale) {
  STRATA_CHECK(dtype_is_float(grad_dtype), "grad_stats: grad_dtype ", dtype_name(grad_dtype),
               " is not supported; use fp32, bf16 or fp16");
  check_buffer(grads, n, dtype_bytes(grad_dtype), "grads", "grad_stats");
  if (n == 0) return {};
  const impl::StatsTable* table = impl::stats_table(impl_->target.bit);
  STRATA_CHECK(table != nullptr, "cpu_optim: no statistics kernels for the chosen SIMD target");
  const impl::SumSqFn fn = table->fn[int(grad_dtype)];
  const std::size_t blocks = (n + impl::kStatsBlock - 1) / impl::kStatsBlock;
  std::vector<double> sums(blocks, 0.0);
  const std::size_t parts = std::min(blocks, impl_->parts_for(n));
  impl_->parallel(parts, [&](std::size_t t) {
    const std::size_t b = blocks * t / parts, e = blocks * (t + 1) / parts;
    if (b < e) fn(grads, n, scale, b, e, sums.data());
  });
  return sums;
}

GradStats Optimizer::grad_stats(const void* grads, DType grad_dtype, std::size_t n, float scale) {
  GradStats out;
  for (double s : grad_block_sums(grads, grad_dtype, n, scale)) out.sum_sq += s;
  out.finite = std::isfinite(out.sum_sq);
  return out;
}

void Optimizer::for_each_range(std::size_t n, const std::function<void(std::size_t, std::size_t)>& fn) {
  const std::size_t parts = impl_->parts_for(n);
  impl_->parallel(parts, [&](std::size_t t) {
    const auto [b, e] = Impl::range(n, parts, t);
    if (b < e) fn(b, e);
  });
}

}  // namespace strata::cpu_optim
