// An NF4 base's chunks (model/nf4_chunk.h, Note [NF4 base]): which tensors are quantised, the packed layout,
// and that unpacking gives each projection bitsandbytes' dequantisation of that tensor alone, loaded in bf16
// (kernels/cpu/ nf4.h, itself checked bit for bit against bitsandbytes in tests/kernels/nf4_test.cpp), the
// norms and biases their working-dtype rounding, and zeros in the padding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/nf4.h"
#include "kernels/cpu/ops.h"
#include "model/config.h"
#include "model/layout.h"
#include "model/nf4_chunk.h"
#include "tests/common/source_dir.h"

namespace strata::model {
namespace {

namespace kc = kernels::cpu;

ModelConfig family_config(const std::string& name) {
  return ModelConfig::from_file(test::source_path("tests/reference/data/" + name + "/config.json"));
}

// Chunk values at a checkpoint's scale, the padding zero (as a chunk provider fills them).
std::vector<float> chunk_values(const ChunkLayout& c, std::uint32_t seed) {
  std::vector<float> v(c.padded_numel, 0.0f);
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 0.02f);
  for (const TensorSpec& t : c.tensors)
    for (std::size_t i = 0; i < t.numel; ++i) v[t.offset + i] = n(rng);
  return v;
}

// bitsandbytes' dequantisation of one stored tensor quantised alone, as loaded in bf16.
std::vector<float> dequantised(const float* x, std::size_t n, bool double_quant) {
  std::vector<std::uint8_t> codes(kc::nf4_code_bytes(n));
  std::vector<float> absmax(kc::nf4_blocks(n, kNf4Blocksize)), out(n), w(n);
  std::vector<kc::bf16_t> h(n);
  kc::cast_f32_to_bf16(h.data(), x, n);
  kc::cast_bf16_to_f32(w.data(), h.data(), n);
  kc::quantize_nf4(w.data(), n, kNf4Blocksize, codes.data(), absmax.data());
  if (double_quant) {
    const kc::Nf4DoubleQuant dq = kc::quantize_nf4_absmax(absmax.data(), absmax.size());
    kc::dequantize_nf4_absmax(dq, absmax.size(), absmax.data());
  }
  kc::dequantize_nf4(codes.data(), absmax.data(), n, kNf4Blocksize, out.data());
  return out;
}

struct Case {
  std::string family;
  bool double_quant;
};

class Nf4Chunks : public ::testing::TestWithParam<Case> {};

// The parts cover the chunk in order, without gaps or overlaps; the quantised ones are exactly the
// stored projection weights.
TEST_P(Nf4Chunks, PartsCoverTheChunkAndQuantiseTheProjectionsOnly) {
  const ModelLayout layout(family_config(GetParam().family));
  const ChunkLayout& c = layout.chunk(1);  // block 0
  const Nf4Chunk f = nf4_chunk(c, DType::bf16, GetParam().double_quant);
  std::size_t at = 0, projections = 0;
  for (const TensorSpec& t : c.stored)
    if (t.hf_name.ends_with("_proj.weight")) projections += t.numel;
  for (const Nf4Part& p : f.parts) {
    EXPECT_EQ(p.at, at);
    at += p.numel;
  }
  EXPECT_EQ(at, c.padded_numel);
  EXPECT_EQ(f.quantized, projections);
  EXPECT_GT(projections, 0u);
  EXPECT_FALSE(nf4_quantizes(layout.chunk(0))) << "the embedding stays in its working dtype";
  EXPECT_FALSE(nf4_quantizes(layout.chunk(layout.head_chunk()))) << "lm_head stays in its working dtype";
}

// Every part unpacks to what bitsandbytes computes of its tensor alone; raw parts to the bf16 rounding.
TEST_P(Nf4Chunks, UnpackedPartsAreEachTensorsOwnDequantisation) {
  const ModelLayout layout(family_config(GetParam().family));
  const ChunkLayout& c = layout.chunk(1);
  const Nf4Chunk f = nf4_chunk(c, DType::bf16, GetParam().double_quant);
  const std::vector<float> v = chunk_values(c, 7);
  std::vector<std::byte> packed(f.bytes);
  const std::vector<float> offsets = pack_nf4(f, v.data(), packed.data());
  std::vector<float> out(c.padded_numel, -1.0f);
  unpack_nf4(f, packed.data(), offsets, out.data());
  for (const Nf4Part& p : f.parts) {
    std::vector<float> want(p.numel, 0.0f);
    if (p.kind == Nf4Part::Kind::nf4) {
      want = dequantised(v.data() + p.at, p.numel, GetParam().double_quant);
    } else if (p.kind == Nf4Part::Kind::raw) {
      std::vector<kc::bf16_t> h(p.numel);
      kc::cast_f32_to_bf16(h.data(), v.data() + p.at, p.numel);
      kc::cast_bf16_to_f32(want.data(), h.data(), p.numel);
    }
    EXPECT_EQ(std::memcmp(out.data() + p.at, want.data(), p.numel * sizeof(float)), 0)
        << "part at " << p.at << " (" << p.numel << " elements, kind " << int(p.kind) << ")";
  }
}

// The packed bytes: 4 bits a quantised parameter plus its share of the absmax (1/64 byte double-quantised
// and 4/16384 of absmax2; 4/64 in fp32), the others 2 bytes, and 16-byte alignment per part.
TEST_P(Nf4Chunks, PackedBytesAreFourBitsAndTheAbsmax) {
  const ModelLayout layout(family_config(GetParam().family));
  const ChunkLayout& c = layout.chunk(1);
  const Nf4Chunk f = nf4_chunk(c, DType::bf16, GetParam().double_quant);
  const double per = GetParam().double_quant ? 0.5 + 1.0 / 64 + 4.0 / 16384 : 0.5 + 4.0 / 64;
  const double raw = 2.0 * double(c.numel - f.quantized);
  const double ideal = per * double(f.quantized) + raw;
  EXPECT_GE(double(f.bytes), ideal - 4.0 * double(f.parts.size()));
  EXPECT_LE(double(f.bytes), ideal + 4.0 * 16.0 * double(f.parts.size()));
}

INSTANTIATE_TEST_SUITE_P(Families, Nf4Chunks,
                         ::testing::Values(Case{"mistral", true}, Case{"mistral", false}, Case{"qwen2", true},
                                           Case{"phi3", true}),
                         [](const auto& i) {
                           return i.param.family + (i.param.double_quant ? "_double_quant" : "_fp32_absmax");
                         });

// Phi-3 stores q, k and v as one qkv_proj (and gate and up as gate_up_proj); bitsandbytes quantises that
// stored tensor, so one part covers all three, its double-quantisation offset the mean over all its blocks.
TEST(Nf4Chunks, FusedProjectionsAreOneQuantisedTensor) {
  const ModelLayout layout(family_config("phi3"));
  const ChunkLayout& c = layout.chunk(1);
  const Nf4Chunk f = nf4_chunk(c, DType::bf16, true);
  std::vector<Nf4Part> quantised;
  for (const Nf4Part& p : f.parts)
    if (p.kind == Nf4Part::Kind::nf4) quantised.push_back(p);
  ASSERT_EQ(quantised.size(), 4u) << "qkv_proj, o_proj, gate_up_proj, down_proj";
  EXPECT_EQ(quantised[0].at, c.at(kWq).offset);
  EXPECT_EQ(quantised[0].numel, c.at(kWq).numel + c.at(kWk).numel + c.at(kWv).numel);
  EXPECT_EQ(quantised[2].numel, c.at(kWGate).numel + c.at(kWUp).numel);
}

}  // namespace
}  // namespace strata::model
