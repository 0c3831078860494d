// strata/model/dtype.h: the storage dtypes of weight files and their conversions to and from fp32.
//
// Example:
//   DType t;
//   if (strata::model::parse_dtype("BF16", &t)) strata::model::convert_from_f32(t, src, n, dst_bytes);
//
// The conversions are the kernels' casts (kernels/cpu/ops.h): round to nearest even, NaN kept, exact
// on the way back, so a bf16/fp16 tensor read and written again is bit-identical.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::model {

enum class DType { F32, BF16, F16 };

const char* dtype_name(DType t);  // "F32", "BF16", "F16" (safetensors spelling)
size_t dtype_size(DType t);
// Parses the safetensors spelling; false for any other dtype (I64, F64, ...).
bool parse_dtype(std::string_view s, DType* out);

// n elements; `dst` / `src` hold n * dtype_size(t) bytes, little-endian.
void convert_from_f32(DType t, const float* src, size_t n, void* dst);
void convert_to_f32(DType t, const void* src, size_t n, float* dst);

}  // namespace strata::model
