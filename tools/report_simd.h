// The SIMD lines of `strata report`: targets compiled into cpu_optim and the one chosen at run time.
#pragma once

#include <string>
#include <tuple>
#include <vector>

namespace strata::cli {
// (what, ok, detail) rows.
std::vector<std::tuple<std::string, bool, std::string>> simd_rows();
}  // namespace strata::cli
