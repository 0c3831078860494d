// Ops::dequantize_nf4 (kernels/ops.h) on every backend against kernels/cpu/nf4.h called directly: the fp32
// output is dequantize_nf4's value bit for bit, a bf16 output that value rounded to nearest even, a
// double-quantised absmax dequantised first (dequantize_nf4_absmax); the blocks are read where the gather's
// source lives (device or pinned host memory); n = 0 writes nothing; misuse is refused. The ops are a
// runtime-role object, as the engine's gather stream holds. cuda skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/nf4.h"
#include "kernels/ops.h"
#include "tests/core/device_fixture.h"
#include "tests/kernels/reference.h"

namespace strata::kernels {
namespace {

namespace kc = kernels::cpu;

// 300 whole blocks of 64 and a shorter one of 37: n odd and not a multiple of 64, 301 blocks (over 256, so a
// double-quantised absmax has two absmax2 entries), and past the CPU backend's bf16 tile of 8192 values.
constexpr std::size_t kN = 64 * 300 + 37;

// Values whose blocks span six orders of magnitude, with one block all zeros.
std::vector<float> weights(std::size_t n, std::size_t blocksize) {
  std::vector<float> x = test::random_floats(n, 61);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t b = i / blocksize;
    x[i] = b == 7 ? 0.0f : x[i] * std::ldexp(1.0f, int(b % 20) - 12);
  }
  return x;
}

// A quantised tensor on the host, and what kernels/cpu dequantises it to.
struct Quantised {
  std::size_t n = 0, blocksize = 64;
  std::vector<std::uint8_t> codes;  // (nf4_code_bytes(n))
  std::vector<float> absmax;        // (nblocks) fp32
  kc::Nf4DoubleQuant dq;            // the absmax double-quantised
  std::vector<float> want;          // (n) fp32: dequantize_nf4 with the fp32 absmax
  std::vector<float> want_dq;       // (n) fp32: with the absmax through dequantize_nf4_absmax first
};

Quantised quantised(std::size_t n, std::size_t blocksize) {
  Quantised q;
  q.n = n, q.blocksize = blocksize;
  const std::size_t nblocks = kc::nf4_blocks(n, blocksize);
  const std::vector<float> x = weights(n, blocksize);
  q.codes.resize(kc::nf4_code_bytes(n));
  q.absmax.resize(nblocks);
  kc::quantize_nf4(x.data(), n, blocksize, q.codes.data(), q.absmax.data());
  q.dq = kc::quantize_nf4_absmax(q.absmax.data(), nblocks);
  q.want.resize(n);
  kc::dequantize_nf4(q.codes.data(), q.absmax.data(), n, blocksize, q.want.data());
  std::vector<float> absmax_dq(nblocks);
  kc::dequantize_nf4_absmax(q.dq, nblocks, absmax_dq.data());
  q.want_dq.resize(n);
  kc::dequantize_nf4(q.codes.data(), absmax_dq.data(), n, blocksize, q.want_dq.data());
  return q;
}

// fp32 values rounded to bf16 (core/dtype.h's round to nearest even), as bit patterns.
std::vector<std::uint16_t> bf16_bits(const std::vector<float>& v) {
  std::vector<std::uint16_t> b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
  return b;
}

class Nf4Op : public strata::testing::DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped()) return;
    dev = open();
    stream = dev->create_stream("nf4-op-test");
    ops = make_ops(*dev, *stream, {.role = OpsRole::runtime});
  }
  void TearDown() override {
    if (stream) stream->synchronize();
  }

  // `bytes` of host memory copied into device memory.
  const void* upload(const void* host, std::size_t bytes) {
    bufs.emplace_back(*dev, bytes, "nf4 op test");
    stream->copy_async(bufs.back().data(), host, bytes, CopyKind::host_to_device);
    stream->synchronize();
    return bufs.back().data();
  }
  // `bytes` of host memory copied into pinned host memory of the device.
  const void* pin(const void* host, std::size_t bytes) {
    pinned.emplace_back(*dev, bytes);
    std::memcpy(pinned.back().data(), host, bytes);
    return pinned.back().data();
  }
  // The blocks of `q`, each array placed by `place` (upload or pin).
  template <typename Place>
  Nf4Blocks blocks(const Quantised& q, bool double_quant, Place place) {
    if (!double_quant)
      return {.codes = place(q.codes.data(), q.codes.size()),
              .absmax = place(q.absmax.data(), q.absmax.size() * sizeof(float)),
              .blocksize = q.blocksize};
    return {.codes = place(q.codes.data(), q.codes.size()),
            .absmax = place(q.dq.codes.data(), q.dq.codes.size()),
            .absmax2 = place(q.dq.absmax2.data(), q.dq.absmax2.size() * sizeof(float)),
            .offset = q.dq.offset,
            .double_quant = true,
            .blocksize = q.blocksize};
  }
  Nf4Blocks on_device(const Quantised& q, bool double_quant) {
    return blocks(q, double_quant, [&](const void* p, std::size_t b) { return upload(p, b); });
  }
  // An output of n values of `dtype` in device memory, every byte 0xAB.
  Tensor output(std::size_t n, DType dtype) {
    bufs.emplace_back(*dev, std::max<std::size_t>(1, n * dtype_bytes(dtype)), "nf4 op test output");
    Tensor t{bufs.back().data(), dtype, n};
    stream->memset_async(t.data, 0xAB, std::max<std::size_t>(1, t.bytes()));
    return t;
  }
  // The bytes of `t` (waits for the stream).
  template <typename T>
  std::vector<T> read(Tensor t, std::size_t n) {
    std::vector<T> h(n);
    stream->copy_async(h.data(), t.data, n * sizeof(T), CopyKind::device_to_host);
    stream->synchronize();
    return h;
  }
  // Dequantises `b` into fp32 and into bf16 and compares both with `want`'s bits and its bf16 rounding.
  void expect_both_dtypes(const Nf4Blocks& b, const std::vector<float>& want, const std::string& what) {
    const std::size_t n = want.size();
    const Tensor f = output(n, DType::fp32), h = output(n, DType::bf16);
    ops->dequantize_nf4(f, b);
    ops->dequantize_nf4(h, b);
    const std::vector<float> got = read<float>(f, n);
    const std::vector<std::uint16_t> got_bf16 = read<std::uint16_t>(h, n), want_bf16 = bf16_bits(want);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), n * sizeof(float))) << what << ", fp32";
    EXPECT_EQ(0, std::memcmp(got_bf16.data(), want_bf16.data(), n * sizeof(std::uint16_t)))
        << what << ", bf16";
  }

  std::unique_ptr<Device> dev;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<Ops> ops;
  std::vector<DeviceBuffer> bufs;
  std::vector<PinnedBuffer> pinned;
};

TEST_P(Nf4Op, Fp32OutputIsTheCpusDequantisationBitForBit) {
  const Quantised q = quantised(kN, 64);
  const Tensor out = output(kN, DType::fp32);
  ops->dequantize_nf4(out, on_device(q, false));
  const std::vector<float> got = read<float>(out, kN);
  EXPECT_EQ(0, std::memcmp(got.data(), q.want.data(), kN * sizeof(float)));
  EXPECT_EQ(got[64 * 7], 0.0f) << "the zero block";
}

TEST_P(Nf4Op, Bf16OutputIsTheFp32ValueRoundedToNearestEven) {
  const Quantised q = quantised(kN, 64);
  const Tensor out = output(kN, DType::bf16);
  ops->dequantize_nf4(out, on_device(q, false));
  const std::vector<std::uint16_t> got = read<std::uint16_t>(out, kN), want = bf16_bits(q.want);
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), kN * sizeof(std::uint16_t)));
}

TEST_P(Nf4Op, DoubleQuantisedAbsmaxIsDequantisedFirstBitForBit) {
  const Quantised q = quantised(kN, 64);
  ASSERT_EQ(q.dq.absmax2.size(), 2u);
  ASSERT_NE(0, std::memcmp(q.want.data(), q.want_dq.data(), kN * sizeof(float)))
      << "the double quantisation changes no value: the test would not tell the absmax apart";
  expect_both_dtypes(on_device(q, true), q.want_dq, "double-quantised");
}

TEST_P(Nf4Op, ABlocksizeOtherThan64IsHonoured) {
  const std::size_t n = 128 * 70 + 5;
  const Quantised q = quantised(n, 128);
  expect_both_dtypes(on_device(q, false), q.want, "blocksize 128");
  expect_both_dtypes(on_device(q, true), q.want_dq, "blocksize 128, double-quantised");
}

// A gather's source in the tier's pinned host memory is read where it lives (cuda: over the link).
TEST_P(Nf4Op, BlocksInPinnedHostMemoryAreReadInPlace) {
  const Quantised q = quantised(kN, 64);
  auto place = [&](const void* p, std::size_t b) { return pin(p, b); };
  expect_both_dtypes(blocks(q, false, place), q.want, "pinned, fp32 absmax");
  expect_both_dtypes(blocks(q, true, place), q.want_dq, "pinned, double-quantised");
}

TEST_P(Nf4Op, ZeroValuesWriteNothing) {
  const Tensor out = output(4, DType::fp32);
  ops->dequantize_nf4(Tensor{out.data, DType::fp32, 0}, Nf4Blocks{});  // no blocks needed
  ops->dequantize_nf4(Tensor{out.data, DType::bf16, 0}, Nf4Blocks{.double_quant = true});
  const std::vector<std::uint8_t> got = read<std::uint8_t>(out, out.bytes());
  EXPECT_EQ(got, std::vector<std::uint8_t>(out.bytes(), 0xAB));
}

TEST_P(Nf4Op, AnFp16OutputIsRefused) {
  const Quantised q = quantised(kN, 64);
  try {
    ops->dequantize_nf4(output(kN, DType::fp16), on_device(q, false));
    FAIL() << "an fp16 output was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp32 or bf16"), std::string::npos) << e.what();
  }
}

TEST_P(Nf4Op, MissingBlocksAndBlocksizeZeroAreRefused) {
  const Quantised q = quantised(kN, 64);
  const Tensor out = output(kN, DType::fp32);
  const Nf4Blocks ok = on_device(q, true);
  Nf4Blocks b = ok;
  b.codes = nullptr;
  EXPECT_THROW(ops->dequantize_nf4(out, b), Error) << "null codes";
  b = ok, b.absmax = nullptr;
  EXPECT_THROW(ops->dequantize_nf4(out, b), Error) << "null absmax";
  b = ok, b.absmax2 = nullptr;
  EXPECT_THROW(ops->dequantize_nf4(out, b), Error) << "double_quant without absmax2";
  b = ok, b.blocksize = 0;
  EXPECT_THROW(ops->dequantize_nf4(out, b), Error) << "blocksize 0";
}

STRATA_INSTANTIATE_BACKENDS(Nf4Op);

}  // namespace
}  // namespace strata::kernels
