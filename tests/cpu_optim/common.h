// Shared pieces of the cpu_optim tests: the parameter space (optimizer x dtypes x SIMD target), shard
// buffers at chosen alignments filled from a seed, and one call into the optimizer or the reference.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "cpu_optim/cpu_optim.h"
#include "cpu_optim/reference.h"

namespace strata::cpu_optim::test {

// Every kernel variant: the weight decay variants are separate kernels.
enum class Opt { adam, adam_l2, adamw, adagrad, adagrad_l2, lion, lion_wd };
inline constexpr Opt kAllOpts[] = {Opt::adam,       Opt::adam_l2, Opt::adamw,  Opt::adagrad,
                                   Opt::adagrad_l2, Opt::lion,    Opt::lion_wd};
enum class Out { none, bf16, f16 };
inline constexpr Out kAllOuts[] = {Out::none, Out::bf16, Out::f16};

struct Case {
  Opt opt = Opt::adamw;
  DType grad = DType::fp32;
  DType state = DType::fp32;
  Out out = Out::none;
  std::string target;
};

const char* opt_name(Opt o);
std::string case_name(const Case& c);  // "avx2_adamw_gbf16_sf32" ("adamw_gbf16_sf32" without a target)
struct CaseName {
  std::string operator()(const ::testing::TestParamInfo<Case>& info) const { return case_name(info.param); }
};

// All compiled targets x optimizers x grad dtypes x state dtypes (out = none: tests loop over the
// outputs themselves, since the output does not change params or states).
std::vector<Case> all_cases();
Case with_out(Case c, Out out);
// Optimizers x grad dtypes x state dtypes, without a target (for tests that loop over targets inside).
std::vector<Case> dtype_cases();
// Each compiled target with the AdamW / fp32 / bf16-out case (for tests of one behaviour per target).
std::vector<Case> per_target_cases();

// GTEST_SKIP()s the calling test when this CPU cannot run `target` (it is compiled in but unsupported).
bool target_runnable(const std::string& target);
#define STRATA_SKIP_UNLESS_RUNNABLE(target)                                                       \
  do {                                                                                            \
    if (!::strata::cpu_optim::test::target_runnable(target))                                      \
      GTEST_SKIP() << "SIMD target " << (target) << " is compiled in but this CPU cannot run it"; \
  } while (0)

Options options_for(const std::string& target, int threads = 2);

// 64-byte aligned storage, then `offset_bytes` further in.
// Contents start uninitialised.
class Buf {
 public:
  Buf() = default;
  Buf(std::size_t bytes, std::size_t offset_bytes);
  void* get() const { return ptr_; }

 private:
  std::unique_ptr<std::uint64_t[]> mem_;
  void* ptr_ = nullptr;
};

// One shard's buffers for a Case. Values: p = +-[0.5, 2), Adam m in +-[0, 0.1), v in [0, 0.01), Adagrad
// v in [0, 1), Lion m in +-[0, 0.1); gradients +-[2^-10, 2^4) with random mantissas. Misaligned
// buffers sit 1, 1, 3, 5 and 7 elements past a 64-byte boundary (p, g, m, v, out).
struct TestShard {
  Case c;
  std::size_t n = 0;
  Buf p, g, m, v, out;
  // fill = false leaves the buffers uninitialised (for copy_from).
  TestShard(const Case& c, std::size_t n, bool misaligned, std::uint64_t seed, bool fill = true);
  Shard shard() const;
  // Copies every buffer's contents from a shard of the same case and size (any alignment).
  void copy_from(const TestShard& other);
  std::vector<std::uint8_t> grad_bytes() const;
  void set_grad_bytes(const std::vector<std::uint8_t>& bytes);
  void copy_grads_from(const TestShard& other);
  float* params() const { return static_cast<float*>(p.get()); }
  void fill_grads(std::uint64_t seed);
  void scaled_grads(float scale, std::vector<double>& out) const;  // widened, times scale, in double
};

bool uses_m(Opt o);
bool uses_v(Opt o);

// The hyper-parameters every test uses for `o` (lr 1e-3; weight decay 0.01 where the variant has it).
AdamParams adam_params(Opt o);
AdagradParams adagrad_params(Opt o);
LionParams lion_params(Opt o);

bool run_step(Optimizer& opt, Opt o, ShardStep& st, std::int64_t step, const Shard& s, float scale);
void run_reference(reference::State& ref, Opt o, const std::vector<double>& g, std::int64_t step);

// splitmix64: a small, fast, well-mixed generator.
struct Rng {
  std::uint64_t s;
  explicit Rng(std::uint64_t seed) : s(seed) {}
  std::uint64_t next();
  double uniform();  // [0, 1)
};

inline constexpr float kGradScale = 0.75f;
inline constexpr int kSteps = 10;

}  // namespace strata::cpu_optim::test
