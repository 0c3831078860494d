// strata/model/architecture.h: one object per kind of model Strata computes, looked up from a config's
// family — everything the engine and the front-ends need of a model before and while it exists, so that
// none of them names a model class (Note [The model seam] in model/trainable.h).
//
// Example (what zero3's engine and `strata train` / `strata eval` do):
//   const strata::model::Architecture& arch = strata::model::architecture(mcfg);  // from mcfg.family
//   strata::model::ModelLayout layout = arch.layout(mcfg, {.chunk_multiple = world * 16});
//   arch.init_chunk(layout, id, seed, full);                       // (padded_numel) fp32, chunk `id`
//   kernels::OpShapes shapes = arch.op_shapes(mcfg, B, T);         // the ops' scratch: ops.scratch_bytes
//   std::size_t acts = arch.activation_bytes(mcfg, B, T, /*checkpoint_activations=*/true, ops);
//   std::unique_ptr<strata::model::TrainableModel> m = arch.make_model(mcfg, engine.model_options());
//
// Note [Architectures]: an architecture is the arithmetic of a model; a family is a row of options to it
// (Note [Model families] in model/config.h). Each kFamilies row names its architecture in `computed_by`,
// and architecture(cfg) looks that name up in architecture.cpp's table — a column of data, never a branch
// on the family. Today there is one, "llama-decoder" (model/llama.h), which every family maps to. A model
// with other arithmetic implements Architecture, adds one line to that table and names it in its families'
// rows; zero3/, tools/, session/ and python/ do not change.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/ops.h"
#include "model/config.h"
#include "model/layout.h"
#include "model/trainable.h"

namespace strata::model {

// Stateless and immutable: one static object per architecture, shared by every thread.
class Architecture {
 public:
  virtual ~Architecture() = default;

  // What kFamilies' computed_by calls it: "llama-decoder".
  virtual const char* name() const = 0;
  // Where each parameter tensor of `cfg` lives inside its chunk.
  virtual ModelLayout layout(const ModelConfig& cfg, LayoutOptions opts = {}) const = 0;
  // Fills chunk `id` of `layout` (padded_numel fp32 at `data`) with the seeded initial parameters, padding
  // zero. Each value depends only on (seed, chunk id, tensor, element), so every provider, sharded or not,
  // initialises bit-identically.
  virtual void init_chunk(const ModelLayout& layout, int id, std::uint64_t seed, float* data) const = 0;
  // The largest shapes its ops run for a micro-batch of B x T tokens, for the compute interface's scratch
  // (kernels::Ops::scratch_bytes; reduce_numel is the caller's to set).
  virtual kernels::OpShapes op_shapes(const ModelConfig& cfg, int B, int T) const = 0;
  // Device bytes of activations and scratch a forward and backward over (B, T) allocate with `ops`: the
  // engine reserves them in its device plan. `checkpoints_stored`: a checkpointing forward's block inputs
  // are kept by the provider's CheckpointStore (Note [Checkpoints off the device] in model/chunk.h).
  // `documents`: the rows pack documents kept apart (positions given), which may take another attention
  // path with other buffers (kernels::Ops::attention_sizes).
  virtual std::size_t activation_bytes(const ModelConfig& cfg, int B, int T, bool checkpoint_activations,
                                       const kernels::Ops& ops, bool checkpoints_stored = false,
                                       bool documents = false) const = 0;
  // What a checkpointing forward over (B, T) gives its CheckpointStore: `count` tensors of `bytes`.
  struct Checkpoints {
    int count = 0;
    std::size_t bytes = 0;
  };
  virtual Checkpoints checkpoints(const ModelConfig& cfg, int B, int T, const kernels::Ops& ops) const = 0;
  // The trainable model `cfg` describes, computing where `opts` says.
  virtual std::unique_ptr<TrainableModel> make_model(const ModelConfig& cfg,
                                                     const ModelOptions& opts = {}) const = 0;
};

// The architecture that computes cfg.family (its kFamilies row's computed_by). ConfigError naming the
// families for a family Strata does not compute; `where` prefixes it.
const Architecture& architecture(const ModelConfig& cfg, const std::string& where = "model config");
// The architecture called `name`; strata::Error listing architecture_names() for another.
const Architecture& architecture_named(std::string_view name);
std::vector<std::string> architecture_names();

}  // namespace strata::model
