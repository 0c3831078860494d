// A frozen chunk in NF4 (model/nf4_chunk.h, Note [NF4 base]).
#include "model/nf4_chunk.h"

#include <cstring>

#include "core/error.h"
#include "kernels/cpu/nf4.h"
#include "kernels/cpu/ops.h"
#include "model/dtype.h"

namespace strata::model {

namespace kc = kernels::cpu;

namespace {

constexpr std::size_t kPartAlign = 16;  // bytes

std::size_t align_up(std::size_t x) {
  return (x + kPartAlign - 1) / kPartAlign * kPartAlign;
}

bool ends_with(const std::string& s, const char* tail) {
  const std::size_t n = std::strlen(tail);
  return s.size() >= n && s.compare(s.size() - n, n, tail) == 0;
}

}  // namespace

bool nf4_quantized(const ChunkLayout& c, const TensorSpec& t) {
  return c.kind == ChunkKind::block && t.shape.size() == 2 && ends_with(t.hf_name, "_proj.weight");
}

bool nf4_quantizes(const ChunkLayout& c) {
  for (const TensorSpec& t : c.stored)
    if (nf4_quantized(c, t)) return true;
  return false;
}

Nf4Chunk nf4_chunk(const ChunkLayout& c, DType raw, bool double_quant) {
  Nf4Chunk f;
  f.numel = c.padded_numel;
  f.raw = raw;
  f.double_quant = double_quant;
  std::size_t at = 0, bytes = 0;
  auto gap = [&](std::size_t to) {
    STRATA_CHECK(to >= at, "nf4_chunk: ", c.name, "'s stored tensors overlap or are out of order");
    if (to > at) f.parts.push_back({.kind = Nf4Part::Kind::zero, .at = at, .numel = to - at});
    at = to;
  };
  for (const TensorSpec& t : c.stored) {
    gap(t.offset);
    Nf4Part p{.at = t.offset, .numel = t.numel, .data = bytes};
    if (nf4_quantized(c, t)) {
      const std::size_t nblocks = kc::nf4_blocks(t.numel, f.blocksize);
      p.kind = Nf4Part::Kind::nf4;
      p.absmax = align_up(p.data + kc::nf4_code_bytes(t.numel));
      bytes = p.absmax + nblocks * (double_quant ? 1 : sizeof(float));
      if (double_quant) {
        p.absmax2 = align_up(bytes);
        bytes = p.absmax2 + kc::nf4_blocks(nblocks, kc::kNf4AbsmaxBlocksize) * sizeof(float);
      }
      f.quantized += t.numel;
    } else {
      p.kind = Nf4Part::Kind::raw;
      bytes = p.data + t.numel * std::size_t(dtype_bytes(raw));
    }
    bytes = align_up(bytes);
    f.parts.push_back(p);
    at = t.offset + t.numel;
  }
  gap(f.numel);
  f.bytes = bytes;
  return f;
}

std::vector<float> pack_nf4(const Nf4Chunk& f, const float* values, void* packed) {
  auto* base = static_cast<unsigned char*>(packed);
  std::memset(base, 0, f.bytes);  // the alignment gaps: written, so the bytes are a function of the values
  std::vector<float> offsets(f.parts.size(), 0.0f);
  for (std::size_t i = 0; i < f.parts.size(); ++i) {
    const Nf4Part& p = f.parts[i];
    const float* x = values + p.at;
    switch (p.kind) {
      case Nf4Part::Kind::zero:
        break;
      case Nf4Part::Kind::raw:
        if (f.raw == DType::fp32)
          std::memcpy(base + p.data, x, p.numel * sizeof(float));
        else if (f.raw == DType::bf16)
          kc::cast_f32_to_bf16(reinterpret_cast<kc::bf16_t*>(base + p.data), x, p.numel);
        else
          kc::cast_f32_to_f16(reinterpret_cast<kc::fp16_t*>(base + p.data), x, p.numel);
        break;
      case Nf4Part::Kind::nf4: {
        const std::size_t nblocks = kc::nf4_blocks(p.numel, f.blocksize);
        std::vector<float> absmax(nblocks), w(x, x + p.numel);
        // The weight as the run loads it: rounded to the working dtype first (Note [NF4 base]).
        if (f.raw != DType::fp32) {
          std::vector<std::uint16_t> h(p.numel);
          if (f.raw == DType::bf16) {
            kc::cast_f32_to_bf16(reinterpret_cast<kc::bf16_t*>(h.data()), x, p.numel);
            kc::cast_bf16_to_f32(w.data(), reinterpret_cast<const kc::bf16_t*>(h.data()), p.numel);
          } else {
            kc::cast_f32_to_f16(reinterpret_cast<kc::fp16_t*>(h.data()), x, p.numel);
            kc::cast_f16_to_f32(w.data(), reinterpret_cast<const kc::fp16_t*>(h.data()), p.numel);
          }
        }
        kc::quantize_nf4(w.data(), p.numel, f.blocksize, base + p.data, absmax.data());
        if (!f.double_quant) {
          std::memcpy(base + p.absmax, absmax.data(), nblocks * sizeof(float));
          break;
        }
        const kc::Nf4DoubleQuant dq = kc::quantize_nf4_absmax(absmax.data(), nblocks);
        std::memcpy(base + p.absmax, dq.codes.data(), nblocks);
        std::memcpy(base + p.absmax2, dq.absmax2.data(), dq.absmax2.size() * sizeof(float));
        offsets[i] = dq.offset;
        break;
      }
    }
  }
  return offsets;
}

void unpack_nf4(const Nf4Chunk& f, const void* packed, std::span<const float> offsets, float* out) {
  STRATA_CHECK(offsets.size() == f.parts.size(), "unpack_nf4: ", offsets.size(), " offsets for ",
               f.parts.size(), " parts");
  const auto* base = static_cast<const unsigned char*>(packed);
  for (std::size_t i = 0; i < f.parts.size(); ++i) {
    const Nf4Part& p = f.parts[i];
    float* y = out + p.at;
    switch (p.kind) {
      case Nf4Part::Kind::zero:
        std::memset(y, 0, p.numel * sizeof(float));
        break;
      case Nf4Part::Kind::raw:
        convert_to_f32(f.raw, base + p.data, p.numel, y);
        break;
      case Nf4Part::Kind::nf4: {
        const std::size_t nblocks = kc::nf4_blocks(p.numel, f.blocksize);
        std::vector<float> absmax(nblocks);
        if (f.double_quant) {
          kc::Nf4DoubleQuant dq;
          dq.codes.assign(base + p.absmax, base + p.absmax + nblocks);
          dq.absmax2.resize(kc::nf4_blocks(nblocks, kc::kNf4AbsmaxBlocksize));
          std::memcpy(dq.absmax2.data(), base + p.absmax2, dq.absmax2.size() * sizeof(float));
          dq.offset = offsets[i];
          kc::dequantize_nf4_absmax(dq, nblocks, absmax.data());
        } else {
          std::memcpy(absmax.data(), base + p.absmax, nblocks * sizeof(float));
        }
        kc::dequantize_nf4(base + p.data, absmax.data(), p.numel, f.blocksize, y);
        break;
      }
    }
  }
}

void nf4_round_trip(const ChunkLayout& c, DType raw, bool double_quant, float* values) {
  if (!nf4_quantizes(c)) return;
  const Nf4Chunk f = nf4_chunk(c, raw, double_quant);
  std::vector<unsigned char> packed(f.bytes);
  const std::vector<float> offsets = pack_nf4(f, values, packed.data());
  unpack_nf4(f, packed.data(), offsets, values);
}

}  // namespace strata::model
