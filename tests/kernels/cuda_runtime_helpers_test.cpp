// The CUDA runtime helpers against kernels/cpu: casts, scaling and AdamW bit for bit; the non-finite
// check exactly; the squared norm to float64 rounding. Outputs are poisoned with NaN before each run.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/reference.h"

namespace strata::kernels::test {
namespace {

namespace cpu = strata::kernels::cpu;
namespace kc = strata::kernels::cuda;

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Every 4099th fp32 bit pattern (NaNs, infinities, subnormals and both signs included).
std::vector<float> float_sweep() {
  std::vector<float> v;
  for (std::uint64_t u = 0; u < (1ull << 32); u += 4099) v.push_back(std::bit_cast<float>(std::uint32_t(u)));
  return v;
}

class CudaHelpers : public CudaTest {};

TEST_F(CudaHelpers, CastsMatchTheCpuBitForBit) {
  const auto in = float_sweep();
  const std::size_t n = in.size();
  std::vector<cpu::bf16_t> b(n);
  std::vector<cpu::fp16_t> h(n);
  cpu::cast_f32_to_bf16(b.data(), in.data(), n);
  cpu::cast_f32_to_f16(h.data(), in.data(), n);
  std::vector<std::uint16_t> all16(0x10000);
  for (std::uint32_t i = 0; i < 0x10000u; ++i) all16[i] = std::uint16_t(i);
  std::vector<float> wide_b(0x10000), wide_h(0x10000);
  cpu::cast_bf16_to_f32(wide_b.data(), all16.data(), all16.size());
  cpu::cast_f16_to_f32(wide_h.data(), all16.data(), all16.size());

  DeviceBuffer<float> d_in(in), d_wide(all16.size());
  DeviceBuffer<std::uint16_t> d_b(n), d_h(n), d_all16(all16);
  d_b.poison();
  d_h.poison();
  kc::cast_f32_to_bf16(d_b.as<kc::bf16>(), d_in.get(), n, stream_);
  kc::cast_f32_to_f16(d_h.as<kc::fp16>(), d_in.get(), n, stream_);
  EXPECT_TRUE(same_bits(d_b.download(), b));
  EXPECT_TRUE(same_bits(d_h.download(), h));
  d_wide.poison();
  kc::cast_bf16_to_f32(d_wide.get(), d_all16.as<kc::bf16>(), all16.size(), stream_);
  EXPECT_TRUE(same_bits(d_wide.download(), wide_b));
  d_wide.poison();
  kc::cast_f16_to_f32(d_wide.get(), d_all16.as<kc::fp16>(), all16.size(), stream_);
  const auto got_h = d_wide.download();
  for (std::size_t i = 0; i < got_h.size(); ++i) {
    if (std::isnan(wide_h[i])) {
      EXPECT_TRUE(std::isnan(got_h[i])) << i;  // the payload may be canonicalised by the hardware
    } else {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(got_h[i]), std::bit_cast<std::uint32_t>(wide_h[i])) << i;
    }
  }
}

TEST_F(CudaHelpers, ScaleMatchesTheCpuBitForBit) {
  auto x = random_floats(123457, std::random_device{}());
  DeviceBuffer<float> d_x(x);
  kc::scale(d_x.get(), 0.3f, x.size(), stream_);
  cpu::scale(x.data(), 0.3f, x.size());
  EXPECT_TRUE(same_bits(d_x.download(), x));
}

// bf16 (Gemma's embedding scale on the residual stream): widened, multiplied in fp32, rounded once to
// nearest even — core/dtype.h's f32_to_bf16 of the fp32 product, bit for bit, over every finite bf16.
TEST_F(CudaHelpers, ScaleOfBf16RoundsTheFp32ProductOnce) {
  std::vector<std::uint16_t> x;
  for (std::uint32_t i = 0; i < 0x10000u; ++i)
    if ((i & 0x7F80u) != 0x7F80u) x.push_back(std::uint16_t(i));  // finite: NaN payloads may differ
  for (float s : {0.3f, 45.254833f, 1e30f}) {  // 1e30: products past bf16's range round to infinity
    std::vector<std::uint16_t> want(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) want[i] = cpu::f32_to_bf16(cpu::bf16_to_f32(x[i]) * s);
    DeviceBuffer<std::uint16_t> d_x(x);
    kc::scale(d_x.as<kc::bf16>(), s, x.size(), stream_);
    EXPECT_TRUE(same_bits(d_x.download(), want)) << "s = " << s;
  }
}

TEST_F(CudaHelpers, NonFiniteCheckFindsOneBadValueAnywhere) {
  const std::size_t n = 300001;
  auto x = random_floats(n, std::random_device{}());
  x[5] = std::numeric_limits<float>::max();
  DeviceBuffer<float> d_x(x);
  DeviceBuffer<int> d_found(1);
  d_found.poison();
  kc::nonfinite_check(d_found.get(), d_x.get(), n, stream_);
  EXPECT_EQ(d_found.download()[0], 0);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (std::size_t at : {std::size_t{0}, n / 3, n - 1}) {
      auto y = x;
      y[at] = bad;
      d_x.upload(y);
      d_found.poison();
      kc::nonfinite_check(d_found.get(), d_x.get(), n, stream_);
      EXPECT_EQ(d_found.download()[0], 1) << bad << " at " << at;
    }
  }
}

TEST_F(CudaHelpers, SquaredNormMatchesTheCpu) {
  for (std::size_t n : {std::size_t{1}, std::size_t{4097}, std::size_t{2000003}}) {
    const auto x = random_floats(n, std::random_device{}());
    DeviceBuffer<float> d_x(x);
    DeviceBuffer<double> d_out(1);
    d_out.poison();
    auto s = scratch(kc::squared_norm_scratch_bytes(n));
    kc::squared_norm(d_out.get(), d_x.get(), n, s.data(), s.size(), stream_);
    const double want = cpu::squared_norm(x.data(), n);
    EXPECT_NEAR(d_out.download()[0], want, 1e-12 * want) << n;
  }
}

TEST_F(CudaHelpers, AdamWMatchesTheCpuBitForBit) {
  const std::size_t n = 200003;
  const std::uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  auto p = random_floats(n, seed), m = random_floats(n, seed + 1, 0.01f),
       v = random_floats(n, seed + 2, 0.01f);
  for (auto& x : v) x = x * x;
  DeviceBuffer<float> d_p(p), d_m(m), d_v(v), d_g(n);
  DeviceBuffer<std::uint16_t> d_pb(n);
  std::vector<cpu::bf16_t> pb(n);
  cpu::AdamWParams hp;
  hp.lr = 1e-3f;
  hp.beta2 = 0.95f;
  hp.weight_decay = 0.1f;
  for (std::int64_t step = 1; step <= 3; ++step) {
    const auto g = random_floats(n, seed + 10 + step);
    const float grad_scale = step == 2 ? 0.125f : 1.0f;
    d_g.upload(g);
    d_pb.poison();
    kc::adamw_update(d_p.get(), d_g.get(), d_m.get(), d_v.get(), d_pb.as<kc::bf16>(), n, hp, step, grad_scale,
                     stream_);
    cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), pb.data(), n, hp, step, grad_scale);
  }
  EXPECT_TRUE(same_bits(d_p.download(), p));
  EXPECT_TRUE(same_bits(d_m.download(), m));
  EXPECT_TRUE(same_bits(d_v.download(), v));
  EXPECT_TRUE(same_bits(d_pb.download(), pb));
}

}  // namespace
}  // namespace strata::kernels::test
