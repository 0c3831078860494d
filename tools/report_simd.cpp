#include "tools/report_simd.h"

#include <hwy/targets.h>

#include <string>

namespace strata::cli {

std::vector<std::tuple<std::string, bool, std::string>> simd_rows() {
  std::string supported;
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) {
    if (!supported.empty()) supported += " ";
    supported += hwy::TargetName(t);
  }
  return {{"SIMD (this CPU)", true, "Highway targets usable here: " + supported}};
}

}  // namespace strata::cli
