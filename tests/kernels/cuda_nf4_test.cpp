// NF4 dequantisation on the device (kernels/cuda/nf4_cuda.h) against the CPU reference (kernels/cpu/nf4.h),
// bit for bit: fp32 outputs equal the CPU's values, bf16 outputs equal them rounded to nearest even, for
// single-level and double-quantised absmax, at lengths and block sizes that leave partial byte pairs,
// partial groups of 8 and partial blocks, into aligned and unaligned outputs. Skipped without a GPU.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/nf4.h"
#include "kernels/cuda/nf4_cuda.h"
#include "tests/kernels/cuda_test_util.h"

namespace strata::kernels::test {
namespace {

namespace cpu = strata::kernels::cpu;
namespace kc = strata::kernels::cuda;

struct Nf4Shape {
  const char* name;
  std::size_t n, blocksize;
  bool double_quant;
  std::size_t out_offset;  // elements before the output (1: an output not 16-byte aligned)
};

void PrintTo(const Nf4Shape& s, std::ostream* os) {
  *os << s.name;
}

// A quantised tensor, its CPU dequantisation (the oracle), and its arrays on the device.
struct Quantised {
  std::vector<std::uint8_t> codes;
  std::vector<float> absmax, want;  // want: the CPU's fp32 values
  cpu::Nf4DoubleQuant dq;
};

Quantised quantise(const Nf4Shape& s, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> x(s.n);
  for (float& v : x) v = normal(rng);
  Quantised q;
  const std::size_t nb = cpu::nf4_blocks(s.n, s.blocksize);
  q.codes.resize(cpu::nf4_code_bytes(s.n));
  q.absmax.resize(nb);
  cpu::quantize_nf4(x.data(), s.n, s.blocksize, q.codes.data(), q.absmax.data());
  std::vector<float> absmax = q.absmax;
  if (s.double_quant) {
    q.dq = cpu::quantize_nf4_absmax(q.absmax.data(), nb);
    cpu::dequantize_nf4_absmax(q.dq, nb, absmax.data());
  }
  q.want.resize(s.n);
  cpu::dequantize_nf4(q.codes.data(), absmax.data(), s.n, s.blocksize, q.want.data());
  return q;
}

class CudaNf4 : public CudaTest, public ::testing::WithParamInterface<Nf4Shape> {
 protected:
  // Dequantises q on the device into a poisoned buffer of T (float, or cpu::bf16_t for bf16) and returns
  // the n values after the shape's offset.
  template <typename T>
  std::vector<T> run(const Quantised& q) {
    const Nf4Shape& s = GetParam();
    DeviceBuffer<std::uint8_t> codes(q.codes);
    DeviceBuffer<T> out(s.n + s.out_offset);
    out.poison();
    using DevOut = std::conditional_t<std::is_same_v<T, float>, float, kc::bf16>;
    DevOut* dst = out.template as<DevOut>() + s.out_offset;
    if (s.double_quant) {
      DeviceBuffer<std::uint8_t> codes8(q.dq.codes);
      DeviceBuffer<float> absmax2(q.dq.absmax2);
      kc::dequantize_nf4(dst, codes.get(), kc::Nf4DoubleQuantDevice{codes8.get(), absmax2.get(), q.dq.offset},
                         s.n, s.blocksize, stream_);
      STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    } else {
      DeviceBuffer<float> absmax(q.absmax);
      kc::dequantize_nf4(dst, codes.get(), absmax.get(), s.n, s.blocksize, stream_);
      STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    std::vector<T> all = out.download();
    return std::vector<T>(all.begin() + std::ptrdiff_t(s.out_offset), all.end());
  }
};

#define SEED_TRACE() SCOPED_TRACE(::testing::Message() << "seed " << seed_)

TEST_P(CudaNf4, Fp32IsTheCpuValueBitForBit) {
  SEED_TRACE();
  const Quantised q = quantise(GetParam(), next_seed());
  const std::vector<float> got = run<float>(q);
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(q.want[i]))
        << "value " << i << ": " << got[i] << ", the CPU's " << q.want[i];
}

TEST_P(CudaNf4, Bf16IsTheCpuValueRoundedToNearestEven) {
  SEED_TRACE();
  const Quantised q = quantise(GetParam(), next_seed());
  const std::vector<cpu::bf16_t> got = run<cpu::bf16_t>(q);
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i], cpu::f32_to_bf16(q.want[i]))
        << "value " << i << " (the CPU's fp32 " << q.want[i] << ")";
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaNf4,
                         ::testing::Values(Nf4Shape{"blocks64", 64 * 1000, 64, false, 0},
                                           Nf4Shape{"ragged_odd", 64 * 37 + 13, 64, false, 0},
                                           Nf4Shape{"blocks7_unaligned", 7 * 301 + 3, 7, false, 1},
                                           Nf4Shape{"blocks4096", 4096 * 3 + 100, 4096, false, 0},
                                           Nf4Shape{"double_quant", 64 * 600 + 13, 64, true, 0},
                                           Nf4Shape{"double_quant_unaligned", 64 * 257 + 1, 64, true, 3},
                                           Nf4Shape{"double_quant_blocks5", 5 * 700 + 4, 5, true, 0}),
                         [](const ::testing::TestParamInfo<Nf4Shape>& i) {
                           return std::string(i.param.name);
                         });

class CudaNf4Empty : public CudaTest {};

TEST_F(CudaNf4Empty, NothingToDequantiseLaunchesNothing) {
  kc::dequantize_nf4(static_cast<float*>(nullptr), nullptr, static_cast<const float*>(nullptr), 0, 64,
                     stream_);
  kc::dequantize_nf4(static_cast<kc::bf16*>(nullptr), nullptr, kc::Nf4DoubleQuantDevice{}, 0, 64, stream_);
  STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  EXPECT_THROW(kc::dequantize_nf4(static_cast<float*>(nullptr), nullptr, static_cast<const float*>(nullptr),
                                  8, 0, stream_),
               strata::Error);
}

}  // namespace
}  // namespace strata::kernels::test
