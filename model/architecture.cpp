#include "model/architecture.h"

#include "core/error.h"
#include "model/chunk.h"
#include "model/llama.h"

namespace strata::model {
namespace {

// The Llama-style decoder of model/llama.h, every family's arithmetic (Note [Model families]).
class LlamaDecoder final : public Architecture {
 public:
  const char* name() const override { return "llama-decoder"; }
  ModelLayout layout(const ModelConfig& cfg, LayoutOptions opts) const override {
    return ModelLayout(cfg, opts);
  }
  void init_chunk(const ModelLayout& layout, int id, std::uint64_t seed, float* data) const override {
    model::init_chunk(layout, id, seed, data);
  }
  kernels::OpShapes op_shapes(const ModelConfig& cfg, int B, int T) const override {
    return LlamaModel::op_shapes(cfg, B, T);
  }
  std::size_t activation_bytes(const ModelConfig& cfg, int B, int T, bool checkpoint_activations,
                               const kernels::Ops& ops, bool checkpoints_stored,
                               bool documents) const override {
    return LlamaModel::activation_bytes(cfg, B, T, checkpoint_activations, ops, checkpoints_stored,
                                        documents);
  }
  Checkpoints checkpoints(const ModelConfig& cfg, int B, int T, const kernels::Ops& ops) const override {
    return {int(cfg.n_layers), LlamaModel::checkpoint_bytes(cfg, B, T, ops)};
  }
  std::unique_ptr<TrainableModel> make_model(const ModelConfig& cfg,
                                             const ModelOptions& opts) const override {
    return std::make_unique<LlamaModel>(cfg, opts);
  }
};

const LlamaDecoder kLlamaDecoder{};

// Every architecture, by name (Note [Architectures]).
const Architecture* const kArchitectures[] = {&kLlamaDecoder};

}  // namespace

const Architecture& architecture_named(std::string_view name) {
  for (const Architecture* a : kArchitectures)
    if (name == a->name()) return *a;
  std::string known;
  for (const std::string& n : architecture_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error(detail::cat("model architecture \"", name, "\" is not one Strata has; the architectures are ",
                          known, " (model/architecture.h, Note [Architectures])"));
}

std::vector<std::string> architecture_names() {
  std::vector<std::string> names;
  for (const Architecture* a : kArchitectures) names.emplace_back(a->name());
  return names;
}

const Architecture& architecture(const ModelConfig& cfg, const std::string& where) {
  return architecture_named(family_of(cfg.family, where).computed_by);
}

}  // namespace strata::model
