#include "model/dtype.h"

#include <cstring>

#include "kernels/cpu/ops.h"

namespace strata::model {

namespace kc = strata::kernels::cpu;

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
  }
  return "?";
}

size_t dtype_size(DType t) {
  return t == DType::F32 ? 4 : 2;
}

bool parse_dtype(std::string_view s, DType* out) {
  if (s == "F32") return *out = DType::F32, true;
  if (s == "BF16") return *out = DType::BF16, true;
  if (s == "F16") return *out = DType::F16, true;
  return false;
}

void convert_from_f32(DType t, const float* src, size_t n, void* dst) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::BF16:
      kc::cast_f32_to_bf16(static_cast<kc::bf16_t*>(dst), src, n);
      return;
    case DType::F16:
      kc::cast_f32_to_f16(static_cast<kc::fp16_t*>(dst), src, n);
      return;
  }
}

// `src` points into a memory-mapped file whose data section need not be 2-byte aligned, so 16-bit input
// is staged through an aligned block.
void convert_to_f32(DType t, const void* src, size_t n, float* dst) {
  if (t == DType::F32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  constexpr size_t kBlock = 4096;
  uint16_t staged[kBlock];
  const auto* s = static_cast<const unsigned char*>(src);
  for (size_t i = 0; i < n; i += kBlock) {
    size_t m = n - i < kBlock ? n - i : kBlock;
    std::memcpy(staged, s + 2 * i, 2 * m);
    if (t == DType::BF16)
      kc::cast_bf16_to_f32(dst + i, staged, m);
    else
      kc::cast_f16_to_f32(dst + i, staged, m);
  }
}

}  // namespace strata::model
