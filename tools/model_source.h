// strata/tools/model_source.h: the model a command reads — a Hugging Face model directory or a
// .safetensors file (model::open_hf_model), or a checkpoint directory of `strata train --save`
// (zero3/checkpoint_weights.h reads those: the engine's format is read in zero3 only). Used by `strata
// eval` and `strata export`.
//
// Example:
//   strata::cli::ModelSource src = strata::cli::open_model_source(path, "--model");   // config only
//   std::unique_ptr<strata::model::InMemoryChunks> w = strata::cli::load_params(src);  // then the weights
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "model/chunk.h"
#include "model/config.h"
#include "model/hf_dir.h"
#include "zero3/checkpoint_weights.h"

namespace strata::cli {

struct ModelSource {
  std::optional<zero3::CheckpointModel> ckpt;  // exactly one of the two
  std::optional<model::HfModel> hf;
  const model::ModelConfig& config() const { return ckpt ? ckpt->config : hf->config; }
  std::string where() const { return ckpt ? ckpt->where : hf->weights; }
};

// Resolves `path` and reads the model's config, no weights yet. ConfigError naming `flag` and what was
// looked for when the path is none of the three.
ModelSource open_model_source(const std::string& path, const char* flag);

using zero3::CheckpointWeights;

// The weights, fp32 in host memory. A checkpoint's are its working params, or with `which` master its
// fp32 masters (Note [Working params from a checkpoint]); a model directory or
// safetensors file has one copy, read whatever `which` says.
std::unique_ptr<model::InMemoryChunks> load_params(const ModelSource& src,
                                                   CheckpointWeights which = CheckpointWeights::working);

// Whether the checkpoint `src` names holds fp32 master weights beside its working params (every checkpoint
// of `strata train --save` does); false for a model directory or safetensors file.
bool has_master_weights(const ModelSource& src);

}  // namespace strata::cli
