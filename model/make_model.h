// strata/model/make_model.h: the trainable model a config describes, for the front-ends (strata train and
// strata.initialize through session/session.h, strata eval), which then never name a model class.
//
// Example:
//   std::unique_ptr<strata::model::TrainableModel> m = strata::model::make_model(cfg,
//   engine.model_options()); engine.train_batch(*m, data);
//
// A shorthand for architecture(cfg).make_model(cfg, opts): the architecture is looked up from cfg.family
// (model/architecture.h, Note [Architectures]).
#pragma once

#include <memory>

#include "model/config.h"
#include "model/trainable.h"

namespace strata::model {

std::unique_ptr<TrainableModel> make_model(const ModelConfig& cfg, const ModelOptions& opts = {});

}  // namespace strata::model
