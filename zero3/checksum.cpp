#include "zero3/checksum.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace strata::zero3 {
namespace {

constexpr std::uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

constexpr std::array<std::uint32_t, 256> make_table() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<std::uint32_t, 256> kTable = make_table();

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) std::uint32_t crc32c_sse42(const unsigned char* p, std::size_t n,
                                                             std::uint32_t crc) {
  std::uint64_t c = ~crc;
  while (n >= 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  std::uint32_t c32 = std::uint32_t(c);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}

bool have_sse42() {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}
#endif

}  // namespace

std::uint32_t crc32c_portable(const void* data, std::size_t n, std::uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = ~crc;
  while (n--) c = kTable[(c ^ *p++) & 0xFFu] ^ (c >> 8);
  return ~c;
}

std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc) {
#if defined(__x86_64__)
  if (have_sse42()) return crc32c_sse42(static_cast<const unsigned char*>(data), n, crc);
#endif
  return crc32c_portable(data, n, crc);
}

}  // namespace strata::zero3
