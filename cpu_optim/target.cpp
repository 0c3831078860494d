// strata/cpu_optim/target.cpp: which SIMD targets are compiled in, which this CPU runs, and the choice.
#include <cctype>
#include <cstdlib>

#include "core/error.h"
#include "cpu_optim/cpu_optim.h"
#include "cpu_optim/target_impl.h"
#include "hwy/highway.h"
#include "hwy/targets.h"

namespace strata::cpu_optim {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Target bits of a Highway mask, best (lowest bit) first. HWY_TARGETS is the set this library's kernel
// files were compiled for: every file sees the same HWY_DISABLED_TARGETS (cpu_optim/CMakeLists.txt).
std::vector<std::int64_t> bits_of(std::int64_t mask) {
  std::vector<std::int64_t> out;
  for (std::int64_t m = mask; m != 0; m &= m - 1) out.push_back(m & -m);
  return out;
}

std::vector<std::string> names_of(std::int64_t mask) {
  std::vector<std::string> out;
  for (std::int64_t bit : bits_of(mask)) out.push_back(lower(hwy::TargetName(bit)));
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::int64_t compiled_mask() {
  return HWY_TARGETS;
}
std::int64_t supported_mask() {
  return hwy::SupportedTargets() & HWY_TARGETS;
}

}  // namespace

std::vector<std::string> compiled_targets() {
  return names_of(compiled_mask());
}
std::vector<std::string> supported_targets() {
  return names_of(supported_mask());
}
std::string chosen_target(const std::string& simd) {
  return impl::resolve_target(simd).name;
}

impl::Target impl::resolve_target(const std::string& requested) {
  std::string want = lower(requested);
  std::string source = "strata.cpu_optim.simd";
  if (const char* env = std::getenv(kSimdEnv); env != nullptr && *env != '\0') {
    want = lower(env);
    source = kSimdEnv;
  }
  const std::int64_t supported = supported_mask();
  if (want.empty() || want == "auto") {
    const std::int64_t best = supported != 0 ? (supported & -supported) : HWY_STATIC_TARGET;
    return {best, lower(hwy::TargetName(best))};
  }
  // "scalar" and "emu128" both name the portable fallback, whichever of the two this build compiled
  // (Highway uses HWY_SCALAR instead of HWY_EMU128 with GCC before 12.3).
  if (want == "scalar" && (compiled_mask() & HWY_SCALAR) == 0) want = "emu128";
  if (want == "emu128" && (compiled_mask() & HWY_EMU128) == 0) want = "scalar";
  for (std::int64_t bit : bits_of(compiled_mask())) {
    if (lower(hwy::TargetName(bit)) != want) continue;
    if ((supported & bit) == 0) {
      throw ConfigError(source + ": SIMD target \"" + want +
                        "\" is compiled in but this CPU cannot run it; " +
                        "use \"auto\" or one of: " + join(supported_targets()));
    }
    return {bit, want, source == kSimdEnv};
  }
  throw ConfigError(source + ": \"" + want +
                    "\" is not a SIMD target of this build; use \"auto\" or one of: " +
                    join(supported_targets()) + " (compiled: " + join(compiled_targets()) + ")");
}

}  // namespace strata::cpu_optim
