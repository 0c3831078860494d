#include "model/dtype.h"

#include <cstring>

#include "core/error.h"
#include "kernels/cpu/ops.h"

namespace strata::model {

namespace kc = strata::kernels::cpu;

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::fp32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::fp16:
      return "F16";
    case DType::u8:
      return "U8";
    case DType::i32:
      return "I32";
  }
  return "?";
}

bool parse_safetensors_dtype(std::string_view s, DType* out) {
  if (s == "F32") return *out = DType::fp32, true;
  if (s == "BF16") return *out = DType::bf16, true;
  if (s == "F16") return *out = DType::fp16, true;
  return false;
}

void convert_from_f32(DType t, const float* src, size_t n, void* dst) {
  STRATA_CHECK(dtype_is_float(t), "convert_from_f32: ", dtype_name(t), " is not a floating-point dtype");
  if (n == 0) return;  // an empty tensor may come with null pointers, which memcpy must not see
  if (t == DType::fp32)
    std::memcpy(dst, src, n * sizeof(float));
  else if (t == DType::bf16)
    kc::cast_f32_to_bf16(static_cast<kc::bf16_t*>(dst), src, n);
  else
    kc::cast_f32_to_f16(static_cast<kc::fp16_t*>(dst), src, n);
}

// `src` points into a memory-mapped file whose data section need not be 2-byte aligned, so 16-bit input
// is staged through an aligned block.
void convert_to_f32(DType t, const void* src, size_t n, float* dst) {
  STRATA_CHECK(dtype_is_float(t), "convert_to_f32: ", dtype_name(t), " is not a floating-point dtype");
  if (n == 0) return;  // an empty tensor may come with null pointers, which memcpy must not see
  if (t == DType::fp32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  constexpr size_t kBlock = 4096;
  uint16_t staged[kBlock];
  const auto* s = static_cast<const unsigned char*>(src);
  for (size_t i = 0; i < n; i += kBlock) {
    size_t m = n - i < kBlock ? n - i : kBlock;
    std::memcpy(staged, s + 2 * i, 2 * m);
    if (t == DType::bf16)
      kc::cast_bf16_to_f32(dst + i, staged, m);
    else
      kc::cast_f16_to_f32(dst + i, staged, m);
  }
}

}  // namespace strata::model
