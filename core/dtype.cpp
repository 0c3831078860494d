#include "core/dtype.h"

namespace strata {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::fp32:
      return "fp32";
    case DType::bf16:
      return "bf16";
    case DType::fp16:
      return "fp16";
    case DType::u8:
      return "u8";
    case DType::i32:
      return "i32";
  }
  return "?";
}

bool parse_dtype(std::string_view s, DType* out) {
  struct Name {
    std::string_view name;
    DType t;
  };
  static constexpr Name names[] = {{"fp32", DType::fp32}, {"f32", DType::fp32},      {"float32", DType::fp32},
                                   {"bf16", DType::bf16}, {"bfloat16", DType::bf16}, {"fp16", DType::fp16},
                                   {"f16", DType::fp16},  {"float16", DType::fp16},  {"u8", DType::u8},
                                   {"i32", DType::i32}};
  for (const Name& n : names)
    if (n.name == s) {
      *out = n.t;
      return true;
    }
  return false;
}

}  // namespace strata
