// strata/model/trainable.h: what a trainer needs of a model — the seam between the model module and the
// engine (zero3/), which includes this header and model/architecture.h, never a model's own.
//
// Note [The model seam]: the engine knows a model by three things. (1) Its description, the ModelConfig:
// its name and size for messages, and its JSON for the checkpoint's identity check. (2) Its Architecture
// (model/architecture.h), looked up from the config's family, which answers for that description before
// the model exists: the layout of its parameters as chunks (model/layout.h), their seeded initialisation,
// the largest shapes its ops run (the compute interface's scratch) and the device bytes of its activations
// for a micro-batch (the memory plan). (3) A TrainableModel, made by the architecture on the engine's
// device and ops (Engine::model_options()), whose forward and backward reach the parameters only through
// the engine's ChunkProvider. A model family with other arithmetic adds its description to ModelConfig,
// names its Architecture in its kFamilies row and implements it; zero3/ and the front-ends do not change.
//
//   const strata::model::Architecture& arch = strata::model::architecture(mcfg);
//   std::unique_ptr<strata::model::TrainableModel> model = arch.make_model(mcfg, engine.model_options());
//   float loss = engine.forward(*model, inputs, targets, B, T);   // the engine calls model->forward
#pragma once

#include <cstdint>
#include <vector>

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
  // returns 0. With positions (B, T) — transformers' position_ids of packed documents (Note [Packed
  // documents] in model/packed_docs.h) — each document attends to itself only and its rotary positions
  // start at 0; without, every row is one sequence.
  virtual float forward(ChunkProvider& chunks, const int32_t* inputs, const int32_t* targets, int B, int T,
                        const int32_t* positions = nullptr) = 0;
  // Adds the gradients of grad_scale × loss (the last forward's) into the chunks' gradient buffers, handing
  // each back as it finishes.
  virtual void backward(ChunkProvider& chunks, float grad_scale) = 0;
  // The last forward's logits, (B, T, V) fp32 on the host (copied from the device); backward overwrites
  // them.
  virtual std::vector<float> logits() const = 0;
  // Note [Dropout keys]: makes the next forward — that one only — a training forward whose random draws
  // (LoRA's dropout masks, Note [LoRA as PEFT computes it] in model/lora.h) are a pure function of `key`; its
  // backward (and a checkpointed block's recomputation) draws the same ones again. A forward not armed
  // draws nothing: dropout is off, as in PyTorch's eval mode — evaluation (model::evaluate, `strata eval`,
  // the in-training eval, the Python binding's eval_loss) runs the model's forward without arming it, and
  // so does a forward without targets. The engine arms every training forward (Engine::forward) with a key
  // of the run's position — seed, step, micro-step, rank — so the masks are the same whatever the
  // placement or overlap, and a resumed run draws those of the uninterrupted one. Default: ignored (a
  // model with no random draws).
  virtual void arm_dropout(std::uint64_t key) { (void)key; }
};

}  // namespace strata::model
