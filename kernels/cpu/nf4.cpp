// NF4 quantisation and dequantisation on the CPU (kernels/cpu/nf4.h, Note [NF4 as bitsandbytes stores it]).
#include "kernels/cpu/nf4.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

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

// bitsandbytes' create_dynamic_map(signed=True) as fp32 bit patterns.
constexpr std::array<std::uint32_t, 256> kDynamicMapBits = {
    0xbf7e3333, 0xbf7a999a, 0xbf770000, 0xbf736666, 0xbf6fcccd, 0xbf6c3333, 0xbf68999a, 0xbf650000,
    0xbf616666, 0xbf5dcccd, 0xbf5a3333, 0xbf56999a, 0xbf530000, 0xbf4f6666, 0xbf4bcccd, 0xbf483333,
    0xbf44999a, 0xbf410000, 0xbf3d6666, 0xbf39cccd, 0xbf363334, 0xbf32999a, 0xbf2f0000, 0xbf2b6666,
    0xbf27cccd, 0xbf243334, 0xbf20999a, 0xbf1d0000, 0xbf196666, 0xbf15cccd, 0xbf123334, 0xbf0e999a,
    0xbf0b0000, 0xbf076666, 0xbf03cccc, 0xbf003333, 0xbef93332, 0xbef20000, 0xbeeacccc, 0xbee3999a,
    0xbedc6666, 0xbed53333, 0xbece0000, 0xbec6cccc, 0xbebf999a, 0xbeb86666, 0xbeb13333, 0xbeaa0000,
    0xbea2cccc, 0xbe9b999a, 0xbe946666, 0xbe8d3334, 0xbe860000, 0xbe7d9999, 0xbe6f3333, 0xbe60cccd,
    0xbe526666, 0xbe440000, 0xbe35999a, 0xbe273333, 0xbe18cccd, 0xbe0a6666, 0xbdf80000, 0xbddb3334,
    0xbdc9eb85, 0xbdc428f7, 0xbdbe6667, 0xbdb8a3d7, 0xbdb2e148, 0xbdad1eb8, 0xbda75c2a, 0xbda1999a,
    0xbd9bd70a, 0xbd96147b, 0xbd9051eb, 0xbd8a8f5d, 0xbd84cccd, 0xbd7e147b, 0xbd728f5d, 0xbd670a3d,
    0xbd5b851f, 0xbd500000, 0xbd447ae1, 0xbd38f5c3, 0xbd2d70a3, 0xbd21eb85, 0xbd166667, 0xbd0ae148,
    0xbcfeb852, 0xbce7ae15, 0xbcd0a3d7, 0xbcb9999a, 0xbca28f5d, 0xbc8b851f, 0xbc68f5c3, 0xbc3ae148,
    0xbc1f3b64, 0xbc160418, 0xbc0ccccd, 0xbc039581, 0xbbf4bc6a, 0xbbe24dd3, 0xbbcfdf3b, 0xbbbd70a4,
    0xbbab020d, 0xbb989374, 0xbb8624dd, 0xbb676c8a, 0xbb428f5c, 0xbb1db22d, 0xbaf1a9fc, 0xbaa7ef9d,
    0xba7765ff, 0xba59e83e, 0xba3c6a80, 0xba1eecc1, 0xba016f01, 0xb9c7e283, 0xb98ce705, 0xb923d70b,
    0xb8ba1f4b, 0xb88aefb3, 0xb8378034, 0xb7b24206, 0xb70205ff, 0xb65a1a94, 0xb513a3b7, 0x00000000,
    0x3513a3b7, 0x365a1a94, 0x370205ff, 0x37b24206, 0x38378034, 0x388aefb3, 0x38ba1f4b, 0x3923d70b,
    0x398ce705, 0x39c7e283, 0x3a016f01, 0x3a1eecc1, 0x3a3c6a80, 0x3a59e83e, 0x3a7765ff, 0x3aa7ef9d,
    0x3af1a9fc, 0x3b1db22d, 0x3b428f5c, 0x3b676c8a, 0x3b8624dd, 0x3b989374, 0x3bab020d, 0x3bbd70a4,
    0x3bcfdf3b, 0x3be24dd3, 0x3bf4bc6a, 0x3c039581, 0x3c0ccccd, 0x3c160418, 0x3c1f3b64, 0x3c3ae148,
    0x3c68f5c3, 0x3c8b851f, 0x3ca28f5d, 0x3cb9999a, 0x3cd0a3d7, 0x3ce7ae15, 0x3cfeb852, 0x3d0ae148,
    0x3d166667, 0x3d21eb85, 0x3d2d70a3, 0x3d38f5c3, 0x3d447ae1, 0x3d500000, 0x3d5b851f, 0x3d670a3d,
    0x3d728f5d, 0x3d7e147b, 0x3d84cccd, 0x3d8a8f5d, 0x3d9051eb, 0x3d96147b, 0x3d9bd70a, 0x3da1999a,
    0x3da75c2a, 0x3dad1eb8, 0x3db2e148, 0x3db8a3d7, 0x3dbe6667, 0x3dc428f7, 0x3dc9eb85, 0x3ddb3334,
    0x3df80000, 0x3e0a6666, 0x3e18cccd, 0x3e273333, 0x3e35999a, 0x3e440000, 0x3e526666, 0x3e60cccd,
    0x3e6f3333, 0x3e7d9999, 0x3e860000, 0x3e8d3334, 0x3e946666, 0x3e9b999a, 0x3ea2cccc, 0x3eaa0000,
    0x3eb13333, 0x3eb86666, 0x3ebf999a, 0x3ec6cccc, 0x3ece0000, 0x3ed53333, 0x3edc6666, 0x3ee3999a,
    0x3eeacccc, 0x3ef20000, 0x3ef93332, 0x3f003333, 0x3f03cccc, 0x3f076666, 0x3f0b0000, 0x3f0e999a,
    0x3f123334, 0x3f15cccd, 0x3f196666, 0x3f1d0000, 0x3f20999a, 0x3f243334, 0x3f27cccd, 0x3f2b6666,
    0x3f2f0000, 0x3f32999a, 0x3f363334, 0x3f39cccd, 0x3f3d6666, 0x3f410000, 0x3f44999a, 0x3f483333,
    0x3f4bcccd, 0x3f4f6666, 0x3f530000, 0x3f56999a, 0x3f5a3333, 0x3f5dcccd, 0x3f616666, 0x3f650000,
    0x3f68999a, 0x3f6c3333, 0x3f6fcccd, 0x3f736666, 0x3f770000, 0x3f7a999a, 0x3f7e3333, 0x3f800000};

// The number of midpoints below s: its level's code (a value on a midpoint stays below it).
std::uint8_t code_of(float s) {
  return std::uint8_t(std::lower_bound(kMidpoints.begin(), kMidpoints.end(), s) - kMidpoints.begin());
}

// ---- torch's CPU sum of a contiguous fp32 vector, in its order (aten/src/ATen/native/cpu/SumKernel.cpp,
// cascade_sum -> vectorized_inner_sum -> row_sum -> multi_row_sum, one thread) --------------------------

constexpr std::size_t kLanes = 8;  // Vectorized<float>::size() of the AVX2 kernel x86 dispatches sum to
using Lanes = std::array<float, kLanes>;

void add_to(float& a, float b) {
  a += b;
}
void add_to(Lanes& a, const Lanes& b) {
  for (std::size_t k = 0; k < kLanes; ++k) a[k] += b[k];
}

std::int64_t ceil_log2(std::int64_t x) {  // torch's utils::CeilLog2
  return x <= 2 ? 1 : std::int64_t(std::bit_width(std::uint64_t(x - 1)));
}

// multi_row_sum with 4 rows: element (i, k) of a (size, 4) array, summed down i in chunks of 2^level_power,
// the chunk sums in chunks again, four levels deep.
template <typename T, typename Load>
std::array<T, 4> multi_row_sum(Load load /*(i, k) -> T*/, std::int64_t size) {
  constexpr int kLevels = 4;
  const std::int64_t level_power = std::max<std::int64_t>(4, ceil_log2(size) / kLevels);
  const std::int64_t level_step = std::int64_t(1) << level_power, level_mask = level_step - 1;
  std::array<std::array<T, 4>, kLevels> acc{};
  std::int64_t i = 0;
  while (i + level_step <= size) {
    for (std::int64_t j = 0; j < level_step; ++j, ++i)
      for (int k = 0; k < 4; ++k) add_to(acc[0][k], load(i, k));
    for (int j = 1; j < kLevels; ++j) {
      for (int k = 0; k < 4; ++k) {
        add_to(acc[j][k], acc[j - 1][k]);
        acc[j - 1][k] = T{};
      }
      if ((i & (level_mask << (j * level_power))) != 0) break;
    }
  }
  for (; i < size; ++i)
    for (int k = 0; k < 4; ++k) add_to(acc[0][k], load(i, k));
  for (int j = 1; j < kLevels; ++j)
    for (int k = 0; k < 4; ++k) add_to(acc[0][k], acc[j][k]);
  return acc[0];
}

// row_sum: elements 0..size-1 read as a (size / 4, 4) array, the rest added to the first column's sum,
// then the columns added.
template <typename T, typename Load>
T row_sum(Load load /*(i) -> T*/, std::int64_t size) {
  const std::int64_t size_ilp = size / 4;
  std::array<T, 4> partial =
      multi_row_sum<T>([&](std::int64_t i, int k) { return load(i * 4 + k); }, size_ilp);
  for (std::int64_t i = size_ilp * 4; i < size; ++i) add_to(partial[0], load(i));
  for (int k = 1; k < 4; ++k) add_to(partial[0], partial[k]);
  return partial[0];
}

float torch_sum(const float* x, std::size_t n) {
  const auto size = std::int64_t(n);
  if (n < kLanes) return 0.0f + row_sum<float>([&](std::int64_t i) { return x[i]; }, size);
  const std::int64_t vecs = size / std::int64_t(kLanes);
  const Lanes lanes = row_sum<Lanes>(
      [&](std::int64_t v) {
        Lanes l;
        std::copy_n(x + v * std::int64_t(kLanes), kLanes, l.begin());
        return l;
      },
      vecs);
  float total = 0.0f;  // the tail first, then the lanes in order
  for (std::int64_t i = vecs * std::int64_t(kLanes); i < size; ++i) total += x[i];
  for (float l : lanes) total += l;
  return 0.0f + total;  // accumulated into the zero-filled output
}

// ---- the 8-bit codes: bitsandbytes' quantize_cpu -------------------------------------------------------

constexpr std::array<float, 256> dynamic_map() {
  std::array<float, 256> m{};
  for (std::size_t i = 0; i < 256; ++i) m[i] = std::bit_cast<float>(kDynamicMapBits[i]);
  return m;
}

constexpr std::array<float, 255> dynamic_midpoints() {
  constexpr std::array<float, 256> m = dynamic_map();
  std::array<float, 255> mid{};
  for (std::size_t i = 0; i < 255; ++i) mid[i] = 0.5f * (m[i] + m[i + 1]);
  return mid;
}

constexpr std::array<float, 255> kDynamicMidpoints = dynamic_midpoints();
constexpr int kGridPoints = 65536;  // bitsandbytes' lookup table: 2^16 points on [-1, 1]

// The code of s = v / absmax2: s onto the grid, then the level nearest the grid point (the number of
// midpoints below it), as bitsandbytes' build_quantize_lut and norm_to_lut_index compute them (a NaN goes
// to grid point 0, as the x86 conversion there takes it).
std::uint8_t dynamic_code_of(float s) {
  const float t = (std::clamp(s, -1.0f, 1.0f) + 1.0f) * 0.5f;
  const float f = std::fma(t, float(kGridPoints - 1), 0.5f);  // bitsandbytes' build contracts to an FMA
  const int j = f >= 0.0f ? int(f) : 0;                       // truncation, as its uint16_t cast
  const float point = 2.0f * float(j) / float(kGridPoints - 1) - 1.0f;
  return std::uint8_t(std::lower_bound(kDynamicMidpoints.begin(), kDynamicMidpoints.end(), point) -
                      kDynamicMidpoints.begin());
}

}  // namespace

const std::array<float, 16> kNf4Levels = levels();
const std::array<float, 256> kDynamicMap = dynamic_map();

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

Nf4DoubleQuant quantize_nf4_absmax(const float* absmax, std::size_t nblocks) {
  Nf4DoubleQuant q;
  if (nblocks == 0) return q;
  q.offset = torch_sum(absmax, nblocks) / float(nblocks);
  q.codes.resize(nblocks);
  q.absmax2.resize(nf4_blocks(nblocks, kNf4AbsmaxBlocksize));
  std::vector<float> v(kNf4AbsmaxBlocksize);
  for (std::size_t b = 0; b < q.absmax2.size(); ++b) {
    const std::size_t first = b * kNf4AbsmaxBlocksize, len = std::min(kNf4AbsmaxBlocksize, nblocks - first);
    float m = 0.0f;
    for (std::size_t i = 0; i < len; ++i) {
      v[i] = absmax[first + i] - q.offset;
      m = std::max(m, std::fabs(v[i]));
    }
    q.absmax2[b] = m;
    if (m == 0.0f) continue;  // codes 0, as bitsandbytes writes them
    const float inv = 1.0f / m;
    for (std::size_t i = 0; i < len; ++i) q.codes[first + i] = dynamic_code_of(v[i] * inv);
  }
  return q;
}

void dequantize_nf4_absmax(const Nf4DoubleQuant& q, std::size_t nblocks, float* absmax_out) {
  STRATA_CHECK(q.codes.size() == nblocks && q.absmax2.size() == nf4_blocks(nblocks, kNf4AbsmaxBlocksize),
               "dequantize_nf4_absmax: a state of ", q.codes.size(), " codes and ", q.absmax2.size(),
               " absmax2 for ", nblocks, " blocks (it needs ", nblocks, " and ",
               nf4_blocks(nblocks, kNf4AbsmaxBlocksize), ")");
  dequantize_nf4_absmax(q.codes.data(), q.absmax2.data(), q.offset, nblocks, absmax_out);
}

void dequantize_nf4_absmax(const std::uint8_t* codes, const float* absmax2, float offset, std::size_t nblocks,
                           float* absmax_out) {
  for (std::size_t b = 0; b < nblocks; ++b) {
    const float scaled = kDynamicMap[codes[b]] * absmax2[b / kNf4AbsmaxBlocksize];
    absmax_out[b] = scaled + offset;  // two roundings (the library builds with -ffp-contract=off)
  }
}

}  // namespace strata::kernels::cpu
