// strata/model/nf4_chunk.h: a frozen chunk's working copy in NF4 — QLoRA's base as the engine keeps it in
// its tier (strata.lora.base_dtype "nf4"): which tensors are quantised, how the packed bytes are laid out,
// packing from the values as loaded, and the CPU reference of what a gather makes of them.
//
// Example:
//   model::Nf4Chunk f = model::nf4_chunk(layout.chunk(id), DType::bf16, /*double_quant=*/true);
//   std::vector<std::byte> packed(f.bytes);
//   std::vector<float> offsets = model::pack_nf4(f, values /*(padded_numel) fp32*/, packed.data());
//   model::unpack_nf4(f, packed.data(), offsets, out /*(padded_numel) fp32*/);   // what a gather holds
//
// Note [NF4 base]: with base_dtype "nf4" every frozen block chunk keeps its projection weights as
// bitsandbytes' Linear4bit keeps them after `load_in_4bit` (BitsAndBytesConfig, quant_type "nf4"): each
// stored projection weight (q, k, v, o, gate, up, down; Phi-3's fused qkv_proj and gate_up_proj as the one
// tensor its checkpoint stores) quantised on its own, flattened in row-major order, in blocks of 64
// (kernels/cpu/nf4.h: Note [NF4 as bitsandbytes stores it]), its absmax kept in fp32 or double-quantised
// (Note [NF4 double quantisation as bitsandbytes computes it]) — from the weight as the run loads it: the
// checkpoint's values rounded to the working dtype (bf16 with bf16 training), as QLoRA loads its base
// (from_pretrained with torch_dtype bfloat16, then quantised); a bf16 checkpoint's values are those exactly.
// bitsandbytes quantises a bf16 weight as its fp32 values, which kernels/cpu/nf4.h computes.
// Norm weights and biases stay in the working dtype, as Linear4bit keeps biases and the norms are no
// Linear; the embedding and the head chunk are not quantised (bitsandbytes skips lm_head).
//
// The packed bytes of a chunk are its parts in chunk order, each starting 16-byte aligned:
//   nf4   codes (nf4_code_bytes(n)), then the absmax (nblocks fp32, or nblocks u8 codes), then with double
//         quantisation absmax2 (ceil(nblocks / 256) fp32); the absmax offset is a value kept beside
//         (pack_nf4's result), as bitsandbytes' QuantState keeps it;
//   raw   the tensor's values in the working dtype (norms, biases);
//   zero  no bytes: the chunk's alignment and padding, zero when gathered.
// A projection costs 0.5 + 1/64 + 4/16384 bytes a parameter double-quantised (0.5 + 4/64 without), the
// rest its working dtype. A gather dequantises the parts into the chunk in the activation dtype (Ops::
// dequantize_nf4, Ops::cast, Ops::zero) from wherever the bytes live, so a crossing from pinned memory to
// the device carries the 4-bit bytes. The chunk is replicated over ranks (each packs the whole chunk: the
// blocks do not follow shard boundaries), never all-gathered, and never changes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/dtype.h"
#include "model/layout.h"

namespace strata::model {

inline constexpr std::size_t kNf4Blocksize = 64;  // QLoRA's and bitsandbytes' default

// Whether stored tensor `t` of chunk `c` is kept in NF4 under an NF4 base: a block's projection weight.
bool nf4_quantized(const ChunkLayout& c, const TensorSpec& t);
// Whether chunk `c` has any (a block chunk).
bool nf4_quantizes(const ChunkLayout& c);

struct Nf4Part {
  enum class Kind : std::uint8_t { nf4, raw, zero };
  Kind kind = Kind::zero;
  std::size_t at = 0, numel = 0;  // elements of the gathered chunk
  // Byte offsets in the packed bytes: nf4 its codes, absmax and (double-quantised) absmax2; raw its values.
  std::size_t data = 0, absmax = 0, absmax2 = 0;
};

// The packed layout of one chunk (Note [NF4 base]).
struct Nf4Chunk {
  std::vector<Nf4Part> parts;  // in chunk order, covering [0, numel)
  std::size_t numel = 0;       // the chunk's padded_numel
  std::size_t bytes = 0;       // packed
  std::size_t quantized = 0;   // parameters in NF4
  DType raw = DType::bf16;     // the other tensors' dtype (the working dtype)
  bool double_quant = true;
  std::size_t blocksize = kNf4Blocksize;
};

Nf4Chunk nf4_chunk(const ChunkLayout& c, DType raw, bool double_quant);

// Packs chunk values (f.numel fp32) into `packed` (f.bytes). Returns one absmax offset per part (0 but for a
// double-quantised nf4 part), which the gathers need beside the bytes.
std::vector<float> pack_nf4(const Nf4Chunk& f, const float* values, void* packed);
// What a gather makes of the packed bytes, in fp32 (f.numel): the CPU reference, and the values an export
// or an evaluation of the base reads.
void unpack_nf4(const Nf4Chunk& f, const void* packed, std::span<const float> offsets, float* out);
// Chunk values (c.padded_numel fp32) replaced by what a gather of them packed would hold (pack, then
// unpack): the base an evaluation of an NF4-trained pair reads (strata eval --base-dtype nf4). A chunk
// without projections is left as it is.
void nf4_round_trip(const ChunkLayout& c, DType raw, bool double_quant, float* values);

}  // namespace strata::model
