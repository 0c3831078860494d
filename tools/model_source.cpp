#include "tools/model_source.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "model/architecture.h"
#include "model/dtype.h"
#include "model/layout.h"
#include "model/safetensors.h"
#include "zero3/checkpoint_weights.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;
using detail::cat;

}  // namespace

ModelSource open_model_source(const std::string& path, const char* flag) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw ConfigError(cat(flag, " ", path,
                          ": no such file or directory; give a Hugging Face model directory, a .safetensors "
                          "file or a checkpoint directory of `strata train --save`"));
  const std::string file = fs::path(path).filename().string();
  if ((file == "meta.json" || file == "latest") && fs::is_regular_file(path, ec))
    throw ConfigError(
        cat(flag, " ", path, ": give the checkpoint directory that holds ", file, ", not the file itself"));
  const std::optional<zero3::CheckpointModel> ckpt = zero3::find_checkpoint_model(path);
  if (!ckpt && fs::is_directory(path, ec) && !fs::exists(fs::path(path) / "config.json", ec))
    throw ConfigError(
        cat(flag, " ", path,
            " is neither a Hugging Face model directory (config.json with model.safetensors or "
            "model.safetensors.index.json) nor a checkpoint of `strata train --save` (a `latest` "
            "file, or meta.json in DIR/TAG)"));
  ModelSource s;
  s.ckpt = ckpt;
  // Not a checkpoint: a Hugging Face directory or a safetensors file (its errors name what was looked for).
  if (!ckpt) s.hf = model::open_hf_model(path);
  return s;
}

std::unique_ptr<model::InMemoryChunks> load_params(const ModelSource& src, CheckpointWeights which) {
  if (src.ckpt) return zero3::read_checkpoint_weights(*src.ckpt, which);
  auto chunks =
      std::make_unique<model::InMemoryChunks>(model::architecture(src.hf->config).layout(src.hf->config));
  model::load_weights(src.hf->weights, *chunks);
  return chunks;
}

bool has_master_weights(const ModelSource& src) {
  return src.ckpt && zero3::has_master_weights(*src.ckpt);
}

}  // namespace strata::cli
