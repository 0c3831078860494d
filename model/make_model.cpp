#include "model/make_model.h"

#include "model/architecture.h"

namespace strata::model {

std::unique_ptr<TrainableModel> make_model(const ModelConfig& cfg, const ModelOptions& opts) {
  return architecture(cfg).make_model(cfg, opts);
}

}  // namespace strata::model
