#include "tests/cpu_optim/common.h"

#include <malloc.h>
#include <algorithm>
#include <cmath>

#include <cstdlib>
#include <cstring>

namespace strata::cpu_optim::test {
namespace {

// The tests choose their SIMD targets explicitly; an override left in the environment would silently
// test one target under every name.
const bool kEnvCleared = [] {
  unsetenv("STRATA_CPU_OPTIM_SIMD");
  // Keep freed shard buffers in the heap for the next test instead of unmapping them: the suite
  // allocates the same few sizes hundreds of times and would otherwise spend its time in page faults.
  mallopt(M_MMAP_THRESHOLD, 512 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  return true;
}();

const char* dtype_tag(DType t) {
  return t == DType::fp32 ? "f32" : t == DType::bf16 ? "bf16" : "f16";
}

}  // namespace

const char* opt_name(Opt o) {
  switch (o) {
    case Opt::adam:
      return "adam";
    case Opt::adam_l2:
      return "adam_l2";
    case Opt::adamw:
      return "adamw";
    case Opt::adagrad:
      return "adagrad";
    case Opt::adagrad_l2:
      return "adagrad_l2";
    case Opt::lion:
      return "lion";
    case Opt::lion_wd:
      return "lion_wd";
  }
  return "?";
}

std::string case_name(const Case& c) {
  std::string name = (c.target.empty() ? "" : c.target + "_") + opt_name(c.opt) + "_g" + dtype_tag(c.grad) +
                     "_s" + dtype_tag(c.state);
  if (c.out != Out::none) name += std::string("_o") + (c.out == Out::bf16 ? "bf16" : "f16");
  return name;
}

Case with_out(Case c, Out out) {
  c.out = out;
  return c;
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (Opt o : kAllOpts)
    for (DType g : {DType::fp32, DType::bf16, DType::fp16})
      for (DType s : {DType::fp32, DType::bf16})
        for (const std::string& t : compiled_targets()) cases.push_back({o, g, s, Out::none, t});
  return cases;
}

std::vector<Case> dtype_cases() {
  std::vector<Case> cases;
  for (Opt o : kAllOpts)
    for (DType g : {DType::fp32, DType::bf16, DType::fp16})
      for (DType s : {DType::fp32, DType::bf16}) cases.push_back({o, g, s, Out::none, ""});
  return cases;
}

std::vector<Case> per_target_cases() {
  std::vector<Case> cases;
  for (const std::string& t : compiled_targets())
    cases.push_back({Opt::adamw, DType::fp32, DType::fp32, Out::bf16, t});
  return cases;
}

bool target_runnable(const std::string& target) {
  const auto s = supported_targets();
  return std::find(s.begin(), s.end(), target) != s.end();
}

Options options_for(const std::string& target, int threads) {
  Options o;
  o.simd = target;
  o.threads = threads;
  return o;
}

Buf::Buf(std::size_t bytes, std::size_t offset_bytes)
    : mem_(new std::uint64_t[(bytes + offset_bytes + 128) / 8 + 1]) {
  const auto base = (reinterpret_cast<std::uintptr_t>(mem_.get()) + 63) & ~std::uintptr_t(63);
  ptr_ = reinterpret_cast<void*>(base + offset_bytes);
}

std::uint64_t Rng::next() {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double Rng::uniform() {
  return double(next() >> 11) * 0x1p-53;
}

bool uses_m(Opt o) {
  return o != Opt::adagrad && o != Opt::adagrad_l2;
}
bool uses_v(Opt o) {
  return o != Opt::lion && o != Opt::lion_wd;
}

namespace {

void store(void* buf, DType t, std::size_t i, float x) {
  if (t == DType::fp32)
    static_cast<float*>(buf)[i] = x;
  else if (t == DType::bf16)
    static_cast<std::uint16_t*>(buf)[i] = f32_to_bf16(x);
  else
    static_cast<std::uint16_t*>(buf)[i] = f32_to_f16(x);
}

}  // namespace

TestShard::TestShard(const Case& c_, std::size_t n_, bool misaligned, std::uint64_t seed, bool fill)
    : c(c_), n(n_) {
  const std::size_t gb = dtype_bytes(c.grad), sb = dtype_bytes(c.state);
  p = Buf(n * 4, misaligned ? 4 : 0);
  g = Buf(n * gb, misaligned ? gb : 0);
  m = Buf(n * sb, misaligned ? 3 * sb : 0);
  v = Buf(n * sb, misaligned ? 5 * sb : 0);
  out = Buf(n * 2, misaligned ? 14 : 0);
  if (!fill) return;
  Rng r(seed);
  const bool adagrad = c.opt == Opt::adagrad || c.opt == Opt::adagrad_l2;
  for (std::size_t i = 0; i < n; ++i) {
    const double sign = (r.next() & 1) ? 1.0 : -1.0;
    params()[i] = float(sign * (0.5 + 1.5 * r.uniform()));
    store(m.get(), c.state, i, float((r.uniform() - 0.5) * 0.2));
    store(v.get(), c.state, i, float(r.uniform() * (adagrad ? 1.0 : 0.01)));
    static_cast<std::uint16_t*>(out.get())[i] = 0;
  }
  fill_grads(seed ^ 0x5eedull);
}

void TestShard::fill_grads(std::uint64_t seed) {
  // Random sign, binary exponent in [-10, 3] (magnitudes ~1e-3 .. 16) and random mantissa bits, built
  // directly in the gradient's own format (no rounding needed, and fast: the suite makes ~10^9 of them).
  Rng r(seed);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t bits = r.next();
    const std::uint32_t sign = std::uint32_t(bits & 1);
    const std::uint32_t e = std::uint32_t(((bits >> 1) & 0xffffu) * 14 >> 16);  // 2^(e - 10), e in [0, 13]
    const std::uint32_t mant = std::uint32_t(bits >> 32);
    if (c.grad == DType::fp32) {
      static_cast<std::uint32_t*>(g.get())[i] = (sign << 31) | ((117 + e) << 23) | (mant & 0x7fffffu);
    } else if (c.grad == DType::bf16) {
      static_cast<std::uint16_t*>(g.get())[i] =
          std::uint16_t((sign << 15) | ((117 + e) << 7) | (mant & 0x7fu));
    } else {
      static_cast<std::uint16_t*>(g.get())[i] =
          std::uint16_t((sign << 15) | ((5 + e) << 10) | (mant & 0x3ffu));
    }
  }
}

void TestShard::copy_from(const TestShard& o) {
  const std::size_t gb = dtype_bytes(c.grad), sb = dtype_bytes(c.state);
  std::memcpy(p.get(), o.p.get(), n * 4);
  std::memcpy(g.get(), o.g.get(), n * gb);
  std::memcpy(m.get(), o.m.get(), n * sb);
  std::memcpy(v.get(), o.v.get(), n * sb);
  std::memcpy(out.get(), o.out.get(), n * 2);
}

std::vector<std::uint8_t> TestShard::grad_bytes() const {
  const auto* b = static_cast<const std::uint8_t*>(g.get());
  return std::vector<std::uint8_t>(b, b + n * dtype_bytes(c.grad));
}

void TestShard::set_grad_bytes(const std::vector<std::uint8_t>& bytes) {
  // An empty shard's gradient vector has no storage (data() is null); memcpy from null is undefined even
  // for 0 bytes (UBSan: "null pointer passed as argument 2").
  if (bytes.empty()) return;
  std::memcpy(g.get(), bytes.data(), bytes.size());
}

void TestShard::copy_grads_from(const TestShard& o) {
  std::memcpy(g.get(), o.g.get(), n * dtype_bytes(c.grad));
}

Shard TestShard::shard() const {
  Shard s;
  s.params = params();
  s.grads = g.get();
  s.exp_avg = uses_m(c.opt) ? m.get() : nullptr;
  s.exp_avg_sq = uses_v(c.opt) ? v.get() : nullptr;
  s.out = c.out == Out::none ? nullptr : out.get();
  s.n = n;
  s.grad_dtype = c.grad;
  s.state_dtype = c.state;
  s.out_dtype = c.out == Out::f16 ? DType::fp16 : DType::bf16;
  return s;
}

void TestShard::scaled_grads(float scale, std::vector<double>& out_g) const {
  out_g.resize(n);
  if (c.grad == DType::fp32) {
    const float* x = static_cast<const float*>(g.get());
    for (std::size_t i = 0; i < n; ++i) out_g[i] = double(x[i]) * double(scale);
  } else {
    for (std::size_t i = 0; i < n; ++i) out_g[i] = reference::widen(g.get(), c.grad, i) * double(scale);
  }
}

AdamParams adam_params(Opt o) {
  AdamParams hp;
  hp.lr = 1e-3f;
  hp.weight_decay = o == Opt::adam ? 0.0f : 0.01f;
  hp.adamw = o != Opt::adam_l2;
  return hp;
}

AdagradParams adagrad_params(Opt o) {
  AdagradParams hp;
  hp.lr = 1e-3f;
  hp.weight_decay = o == Opt::adagrad_l2 ? 0.01f : 0.0f;
  return hp;
}

LionParams lion_params(Opt o) {
  LionParams hp;
  hp.lr = 1e-3f;
  hp.weight_decay = o == Opt::lion_wd ? 0.01f : 0.0f;
  return hp;
}

bool run_step(Optimizer& opt, Opt o, ShardStep& st, std::int64_t step, const Shard& s, float scale) {
  switch (o) {
    case Opt::adam:
    case Opt::adam_l2:
    case Opt::adamw:
      return opt.adam(st, adam_params(o), step, s, scale);
    case Opt::adagrad:
    case Opt::adagrad_l2:
      return opt.adagrad(st, adagrad_params(o), step, s, scale);
    case Opt::lion:
    case Opt::lion_wd:
      return opt.lion(st, lion_params(o), step, s, scale);
  }
  return false;
}

void run_reference(reference::State& ref, Opt o, const std::vector<double>& g, std::int64_t step) {
  switch (o) {
    case Opt::adam:
    case Opt::adam_l2:
    case Opt::adamw:
      reference::adam(ref, g, adam_params(o), step);
      break;
    case Opt::adagrad:
    case Opt::adagrad_l2:
      reference::adagrad(ref, g, adagrad_params(o));
      break;
    case Opt::lion:
    case Opt::lion_wd:
      reference::lion(ref, g, lion_params(o));
      break;
  }
}

}  // namespace strata::cpu_optim::test
