// strata/model/make_model.h: the trainable model a config describes, for the front-ends (strata train and
// strata.initialize through session/session.h, strata eval), which then never name a model class.
//
// Example:
//   std::unique_ptr<strata::model::TrainableModel> m = strata::model::make_model(cfg,
//   engine.model_options()); engine.train_batch(*m, data);
//
// Every family Strata computes (model/config.h's kFamilies: Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma) is
// the Llama-style decoder with the family's options (model/llama.h), so today this is one class; a family
// with other arithmetic gets its own here, looked up from cfg.family.
#pragma once

#include <memory>

#include "model/config.h"
#include "model/trainable.h"

namespace strata::model {

std::unique_ptr<TrainableModel> make_model(const ModelConfig& cfg, const ModelOptions& opts = {});

}  // namespace strata::model
