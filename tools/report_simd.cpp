#include "tools/report_simd.h"

#include "core/error.h"
#include "cpu_optim/cpu_optim.h"

namespace strata::cli {
namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s.empty() ? "none" : s;
}

}  // namespace

std::vector<std::tuple<std::string, bool, std::string>> simd_rows() {
  std::vector<std::tuple<std::string, bool, std::string>> rows;
  rows.emplace_back("SIMD compiled", true, "cpu_optim targets: " + join(cpu_optim::compiled_targets()));
  rows.emplace_back("SIMD usable", true, "on this CPU: " + join(cpu_optim::supported_targets()));
  try {
    rows.emplace_back("SIMD chosen", true,
                      cpu_optim::chosen_target() +
                          " (strata.cpu_optim.simd auto; "
                          "STRATA_CPU_OPTIM_SIMD overrides)");
  } catch (const Error& e) {
    rows.emplace_back("SIMD chosen", false, e.what());
  }
  return rows;
}

}  // namespace strata::cli
