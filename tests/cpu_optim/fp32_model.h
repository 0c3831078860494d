// The update formulas of cpu_optim.h written out in scalar fp32, in their documented order: the model the
// SIMD kernels must equal bit for bit (this file is compiled with -ffp-contract=off, as the library is).
#pragma once

#include <cstdint>

#include "tests/cpu_optim/common.h"

namespace strata::cpu_optim::test {

// Applies one step of `o` to every element of `ts` (params, states and output) with the hyper-parameters
// given, as the library documents it.
void model_adam(TestShard& ts, const AdamParams& hp, std::int64_t step, float scale);
void model_adagrad(TestShard& ts, const AdagradParams& hp, float scale);
void model_lion(TestShard& ts, const LionParams& hp, float scale);
void model_step(TestShard& ts, Opt o, std::int64_t step, float scale);  // with the Opt's test parameters

// Whether two shards of the same case hold the same bytes in every buffer the case uses; on a mismatch,
// `where` names the first differing buffer and element. any_nan_payload: two NaNs match whatever their
// payloads (which of two NaN operands an operation passes on is not fixed across compiled code).
bool same_bytes(const TestShard& a, const TestShard& b, std::string* where, bool any_nan_payload = false);

}  // namespace strata::cpu_optim::test
