// strata/cpu_optim/target_impl.h: naming and choosing the SIMD target of an Optimizer.
#pragma once

#include <cstdint>
#include <string>

namespace strata::cpu_optim::impl {

struct Target {
  std::int64_t bit = 0;   // Highway target bit (HWY_AVX2, ...)
  std::string name;       // lower-case Highway name ("avx2")
  bool from_env = false;  // chosen through kSimdEnv
};

// The environment variable that overrides Options::simd when set and non-empty.
inline constexpr const char* kSimdEnv = "STRATA_CPU_OPTIM_SIMD";

// "auto" (or empty): the best target compiled in that this CPU supports; otherwise the named one, which
// must be compiled in and supported. `requested` is replaced by kSimdEnv when that is set. Throws
// ConfigError naming the source of the request and the usable targets.
Target resolve_target(const std::string& requested);

}  // namespace strata::cpu_optim::impl
