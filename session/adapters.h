// strata/session/adapters.h: LoRA adapters in a run (model/lora.h) — what `strata train`, `strata eval` and
// `strata.initialize` do with a config's strata.lora block and a PEFT adapter directory (--adapter DIR):
// the adapters' shape on the model, their initial weights, and the two exports.
//
// Example (strata train's order):
//   session::ModelSource src = session::open_model(spec, session::Weights::allowed);
//   Config cfg = session::resolve_config(...);
//   session::resolve_adapters(src, cfg.strata.lora, adapter_dir, "--adapter");   // src.config.lora
//   session::Trainer t = session::build(cfg, src, T, ri, opts);   // base frozen, adapters from the directory
//   ... train ...
//   session::export_adapter(*t.engine, "out/adapter", src);       // PEFT's adapter_config + safetensors
//   session::export_merged(*t.engine, "out/merged", src);         // the full model, adapters merged (bf16)
//
// Note [Adapter directories]: Strata reads and writes PEFT's format. adapter_config.json carries the
// settings (config/lora_peft.h); adapter_model.safetensors every adapted module's lora_A.weight and
// lora_B.weight and every saved module's weight, under the module's name prefixed "base_model.model."
// (PEFT's get_peft_model_state_dict keys: "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
// "base_model.model.lm_head.weight"). Reading one checks every tensor the adapters need is there with the
// shape this base gives it, and that the file holds nothing else, so an adapter made for another base is
// refused by name before any step. Strata writes the adapters' fp32 masters (PEFT keeps adapters in fp32)
// and target_modules as the adapted modules' full paths, which PEFT reads back to the same modules.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "config/config.h"
#include "model/chunk.h"
#include "model/layout.h"
#include "model/safetensors.h"
#include "session/session.h"
#include "zero3/engine.h"

namespace strata::session {

// Reads DIR/adapter_config.json (config/lora_peft.h); ConfigError naming `flag` and the file when the
// directory or the file is missing, or a setting is refused.
StrataConfig::Lora read_adapter_config(const std::string& dir, const std::string& flag);

// Sets src.config.lora to the adapters the run trains or evaluates: those of `adapter_dir` (its
// adapter_config.json) when given, else the strata.lora block's when it is present; none otherwise. Every
// refusal is a ConfigError before any weight is read: a target the family does not have (model/lora.h),
// settings the block and the directory both give and disagree on, an adapter directory that names another
// base (base_model_name_or_path, by its last path component), settings Strata does not compute
// (init_lora_weights false without a directory). (An NF4 base without files is refused by build().)
void resolve_adapters(ModelSource& src, const StrataConfig::Lora& block, const std::string& adapter_dir,
                      const std::string& flag);

// The tensors of a PEFT adapter directory (Note [Adapter directories]) for a model with adapters.
class AdapterWeights {
 public:
  // Checks DIR/adapter_model.safetensors against `layout` (ConfigError naming `flag`, the file and the
  // tensor: a missing tensor, another shape, a tensor the adapters have no place for).
  AdapterWeights(const std::string& dir, const model::ModelLayout& layout, const std::string& flag);
  // Whether chunk `c` is read from the adapter file (an adapter chunk, or a saved module the file holds).
  bool holds(const model::ChunkLayout& c) const;
  // Its tensors into `out` (c.padded_numel fp32, zero-filled first).
  void read_chunk(const model::ChunkLayout& c, float* out) const;

 private:
  model::SafetensorsReader file_;
  std::string flag_;
};

// The PEFT key of a tensor of the adapted model (Note [Adapter directories]).
std::string peft_key(const model::TensorSpec& t);

// A running digest of the base's weights as they load (CRC-32C of their fp32 values, chunk by chunk in
// chunk order): what checkpoints name the base by (zero3::Engine::set_base).
struct BaseDigest {
  std::uint32_t crc = 0;
  std::uint64_t values = 0;
  void add(const float* data, std::size_t n);
  std::string str() const;  // "crc32c:0123abcd/1234567"
};

// Writes the engine's adapters (and saved modules) as a PEFT adapter directory `dir`: adapter_config.json
// naming the base `src` came from, adapter_model.safetensors with their fp32 masters, and the base's
// tokenizer files. Collective (Engine::read_masters): every rank calls it; rank 0 writes.
void export_adapter(zero3::Engine& engine, const std::string& dir, const ModelSource& src);
// Writes the model with the adapters merged, W + s B A (the base's working copy plus the product of the
// adapters' masters, in fp32, then bf16), as a model directory transformers loads — or NAME.safetensors,
// one file. With B = 0 it is exactly the base's working copy. Collective; rank 0 writes.
void export_merged(zero3::Engine& engine, const std::string& path, const ModelSource& src);

// An adapted model's parameters in host memory for evaluation: the base's weights (`src`, a Hugging Face
// directory or .safetensors file) and the adapters of `adapter_dir`; src.config.lora must be set.
std::unique_ptr<model::InMemoryChunks> load_adapted(const ModelSource& src, const std::string& adapter_dir,
                                                    const std::string& flag);

}  // namespace strata::session
