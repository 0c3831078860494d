// strata/model/dtype.h: the safetensors spelling of strata::DType, and bulk conversions of weights between
// fp32 and a storage dtype.
//
// Example:
//   strata::DType t;
//   if (strata::model::parse_safetensors_dtype("BF16", &t)) strata::model::convert_from_f32(t, src, n, dst);
//
// The conversions are the kernels' casts (kernels/cpu/ops.h), element by element core/dtype.h's: round to
// nearest even, NaN kept, exact on the way back, so a bf16/fp16 tensor read and written again is
// bit-identical.
#pragma once

#include <cstddef>
#include <string_view>

#include "core/dtype.h"

namespace strata::model {

// "F32", "BF16", "F16", "U8", "I32": the names safetensors files use.
const char* safetensors_dtype_name(DType t);
// Parses "F32", "BF16", "F16" (the dtypes weights are read and written in); false for any other (I64, F64,
// U8, ...).
bool parse_safetensors_dtype(std::string_view s, DType* out);

// n elements; `dst` / `src` hold n * dtype_bytes(t) bytes, little-endian. t must be fp32, bf16 or fp16
// (dtype_is_float); another throws strata::Error.
void convert_from_f32(DType t, const float* src, std::size_t n, void* dst);
void convert_to_f32(DType t, const void* src, std::size_t n, float* dst);

}  // namespace strata::model
