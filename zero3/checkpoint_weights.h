// strata/zero3/checkpoint_weights.h: a checkpoint of `strata train --save` read without an engine — its model
// and whole chunks of its weights, fp32 in host memory — for `strata eval` and `strata export`
// (tools/model_source.h). The engine's own format (zero3/checkpoint.h, zero3/engine_checkpoint.cpp) is read
// here and nowhere outside zero3.
//
// Example:
//   if (std::optional<strata::zero3::CheckpointModel> c = strata::zero3::find_checkpoint_model("ckpt")) {
//     auto w = strata::zero3::read_checkpoint_weights(*c, strata::zero3::CheckpointWeights::working);
//   }
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "model/chunk.h"
#include "model/config.h"

namespace strata::zero3 {

// A checkpoint directory of the engine: DIR with `latest`, or DIR/TAG with meta.json.
struct CheckpointModel {
  std::string dir, tag;  // tag "" : the one DIR/latest names
  model::ModelConfig config;
  std::string where;      // DIR/TAG
  std::string init_from;  // the --init-from directory the run started from, when it recorded one
};

// `path` as a checkpoint (DIR holding `latest`, or DIR/TAG holding meta.json) with its model config read;
// nullopt when it is not one. ConfigError when its meta.json names no model, IoError when it is damaged.
std::optional<CheckpointModel> find_checkpoint_model(const std::string& path);

// Which of a checkpoint's copies of the weights to read: the working params the run computed with (bf16,
// fp16 or fp32, as it trained), or the fp32 master weights the optimizer updates.
enum class CheckpointWeights { working, master };

// The weights of every chunk, fp32, laid out as model::ModelLayout(c.config) (Note [Working params from a
// checkpoint]). IoError naming the tensor when one is missing, of another size or damaged.
std::unique_ptr<model::InMemoryChunks> read_checkpoint_weights(const CheckpointModel& c,
                                                               CheckpointWeights which);

// Whether the checkpoint holds fp32 master weights beside its working params (every checkpoint of
// `strata train --save` does).
bool has_master_weights(const CheckpointModel& c);

}  // namespace strata::zero3
