// strata/model/trainable.h: what a trainer needs of a model — the seam between the model module and the
// engine (zero3/), which includes this header and never a model's own.
//
// Note [The model seam]: the engine knows a model by three things. (1) Its description, the ModelConfig:
// the layout of its parameters as chunks (model/layout.h), its name and size for messages, and its JSON for
// the checkpoint's identity check. (2) Two planning functions over that description, called before the
// model exists: the largest shapes its ops run (the compute interface's scratch) and the device bytes of
// its activations for a micro-batch (the memory plan). (3) A TrainableModel, made by the caller on the
// engine's device and ops (Engine::model_options()), whose forward and backward reach the parameters
// only through the engine's ChunkProvider. A model family other than today's decoder adds its
// description to ModelConfig and its arithmetic behind these functions; zero3/ does not change.
//
//   strata::model::LlamaModel model(mcfg, engine.model_options());   // a TrainableModel
//   float loss = engine.forward(model, inputs, targets, B, T);        // the engine calls model.forward
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/device.h"
#include "kernels/ops.h"
#include "model/chunk.h"
#include "model/config.h"

namespace strata::model {

// Where a model computes, and how.
struct ModelOptions {
  bool checkpoint_activations = false;  // keep each block's input only, recompute in backward
  Device* device = nullptr;             // where activations live (both null: a host device of its own)
  kernels::Ops* ops = nullptr;          // the ops, on a stream of `device`
};

class TrainableModel {
 public:
  virtual ~TrainableModel() = default;
  // The model's shape and family.
  virtual const ModelConfig& config() const = 0;
  // Runs the model over inputs (B, T). With targets (B, T) — a target < 0 is ignored — returns the mean
  // cross-entropy and keeps what backward needs; with targets == nullptr computes the logits only and
  // returns 0.
  virtual float forward(ChunkProvider& chunks, const int32_t* inputs, const int32_t* targets, int B,
                        int T) = 0;
  // Adds the gradients of grad_scale × loss (the last forward's) into the chunks' gradient buffers, handing
  // each back as it finishes.
  virtual void backward(ChunkProvider& chunks, float grad_scale) = 0;
};

// The planning functions of the model `cfg` describes (Note [The model seam]).
// Device bytes of activations and scratch a forward and backward over (B, T) allocate with `ops`.
std::size_t activation_bytes(const ModelConfig& cfg, int B, int T, bool checkpoint_activations,
                             const kernels::Ops& ops);
// The largest shapes its ops run for a micro-batch of B x T tokens, for the compute interface's scratch
// (kernels::Ops::scratch_bytes; reduce_numel is the caller's to set).
kernels::OpShapes op_shapes(const ModelConfig& cfg, int B, int T);

}  // namespace strata::model
