// NF4 quantisation and dequantisation on the CPU (kernels/cpu/nf4.h, Note [NF4 as bitsandbytes stores it]).
#include "kernels/cpu/nf4.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "core/error.h"

namespace strata::kernels::cpu {

namespace {

// The levels' fp32 bit patterns, as bitsandbytes has them.
constexpr std::array<std::uint32_t, 16> kLevelBits = {
    0xbf800000, 0xbf3239b1, 0xbf066b30, 0xbeca32a0, 0xbe91a24d, 0xbe3d353f, 0xbdba7871, 0x00000000,
    0x3da2faff, 0x3e24cae3, 0x3e7c04dd, 0x3ead033a, 0x3ee1a4b8, 0x3f1007ab, 0x3f3913b3, 0x3f800000};

constexpr std::array<float, 16> levels() {
  std::array<float, 16> l{};
  for (std::size_t i = 0; i < 16; ++i) l[i] = std::bit_cast<float>(kLevelBits[i]);
  return l;
}

// The fp32 midpoints between consecutive levels: (a + b) rounded to fp32, halved (exact).
constexpr std::array<float, 15> midpoints() {
  constexpr std::array<float, 16> l = levels();
  std::array<float, 15> m{};
  for (std::size_t i = 0; i < 15; ++i) m[i] = (l[i] + l[i + 1]) / 2.0f;
  return m;
}

constexpr std::array<float, 15> kMidpoints = midpoints();

// The number of midpoints below s: its level's code (a value on a midpoint stays below it).
std::uint8_t code_of(float s) {
  return std::uint8_t(std::lower_bound(kMidpoints.begin(), kMidpoints.end(), s) - kMidpoints.begin());
}

}  // namespace

const std::array<float, 16> kNf4Levels = levels();

void quantize_nf4(const float* x, std::size_t n, std::size_t blocksize, std::uint8_t* codes, float* absmax) {
  STRATA_CHECK(blocksize > 0, "quantize_nf4: blocksize 0");
  const std::size_t full = n / blocksize * blocksize;
  auto code = [&](std::size_t i) -> std::uint8_t {
    if (i >= n) return code_of(0.0f);  // an odd n's padding
    const std::size_t b = i / blocksize;
    const float a = std::max(absmax[b], 1e-38f);
    // A whole block scales by the reciprocal, the shorter last one divides (bitsandbytes' arithmetic).
    const float s = i < full ? x[i] * (1.0f / a) : x[i] / a;
    return code_of(std::clamp(s, -1.0f, 1.0f));
  };
  for (std::size_t b = 0; b < nf4_blocks(n, blocksize); ++b) {
    float m = 0.0f;
    for (std::size_t i = b * blocksize; i < std::min(n, (b + 1) * blocksize); ++i)
      m = std::max(m, std::fabs(x[i]));
    absmax[b] = m;
  }
  for (std::size_t j = 0; j < nf4_code_bytes(n); ++j)
    codes[j] = std::uint8_t(code(2 * j) << 4 | code(2 * j + 1));
}

void dequantize_nf4(const std::uint8_t* codes, const float* absmax, std::size_t n, std::size_t blocksize,
                    float* out) {
  STRATA_CHECK(blocksize > 0, "dequantize_nf4: blocksize 0");
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint8_t c = i % 2 == 0 ? codes[i / 2] >> 4 : codes[i / 2] & 0xf;
    out[i] = kNf4Levels[c] * absmax[i / blocksize];
  }
}

}  // namespace strata::kernels::cpu
