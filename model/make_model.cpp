#include "model/make_model.h"

#include "model/llama.h"

namespace strata::model {

std::unique_ptr<TrainableModel> make_model(const ModelConfig& cfg, const ModelOptions& opts) {
  return std::make_unique<LlamaModel>(cfg, opts);
}

}  // namespace strata::model
