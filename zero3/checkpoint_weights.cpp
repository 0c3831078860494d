#include "zero3/checkpoint_weights.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "model/architecture.h"
#include "model/dtype.h"
#include "model/layout.h"
#include "zero3/checkpoint.h"

namespace strata::zero3 {

namespace fs = std::filesystem;
using detail::cat;

std::optional<CheckpointModel> find_checkpoint_model(const std::string& path) {
  std::error_code ec;
  const fs::path p = fs::path(path).lexically_normal();
  if (!fs::is_directory(p, ec)) return std::nullopt;
  CheckpointModel c;
  if (fs::is_regular_file(p / "latest", ec)) {
    c.dir = path;
  } else if (fs::is_regular_file(p / "meta.json", ec)) {
    // A trailing "/" (ckpt/global_step2/) leaves an empty last element: drop it.
    const fs::path tagged = p.filename().empty() ? p.parent_path() : p;
    c.dir = tagged.has_parent_path() ? tagged.parent_path().string() : ".";
    c.tag = tagged.filename().string();
  } else {
    return std::nullopt;
  }
  const CheckpointReader r(c.dir, c.tag, 0);
  c.where = r.path();
  const auto m = r.meta().find("model");
  if (m == r.meta().end())
    throw ConfigError(cat("checkpoint ", r.path(), "/meta.json has no \"model\": it was not written by ",
                          "`strata train --save`, so it names no model to evaluate"));
  c.config = model::ModelConfig::from_json(*m, r.path() + "/meta.json \"model\"");
  c.tag = r.tag();
  const auto cs = r.meta().find("client_state");
  if (cs != r.meta().end() && cs->is_object() && cs->contains("init_from") && (*cs)["init_from"].is_string())
    c.init_from = (*cs)["init_from"].get<std::string>();
  return c;
}

// Note [Working params from a checkpoint]: the engine saves each chunk's working params (bf16, fp16 or
// fp32, as the run trained) as "<chunk>.param" in every rank's shard file, rank q holding elements
// [q·shard, (q+1)·shard) of the chunk padded for the saving world size (zero3/engine_checkpoint.cpp);
// stages 1 and 2, whose ranks hold the whole chunk, save that same slice. The tensors sit at the same
// offsets in every layout of a model (ModelLayout's tensor_align, 16 elements, in the engine and here), so
// the slices laid end to end and cut at this layout's padded size are the chunk. These are the values the
// run computed with (Engine::read_params, what --export writes), not the fp32 master: a checkpoint and the
// export of the same run evaluate to the same loss. The fp32 masters ("<chunk>.master", what `strata
// export --dtype fp32` writes, as DeepSpeed's zero_to_fp32 does) are cut the same way: rank q's shard of
// the chunk at every stage.
std::unique_ptr<model::InMemoryChunks> read_checkpoint_weights(const CheckpointModel& c,
                                                               CheckpointWeights which) {
  const char* suffix = which == CheckpointWeights::master ? ".master" : ".param";
  const CheckpointReader r0(c.dir, c.tag, 0);
  const int world = r0.meta().value("world_size", 1);
  if (world < 1)
    throw IoError(
        cat(c.where, "/meta.json: world_size ", world, " is not a rank count; the checkpoint is damaged"));
  std::vector<std::unique_ptr<CheckpointReader>> ranks;
  for (int q = 1; q < world; ++q) ranks.push_back(std::make_unique<CheckpointReader>(c.dir, c.tag, q));
  auto reader = [&](int q) -> const CheckpointReader& { return q == 0 ? r0 : *ranks[std::size_t(q - 1)]; };

  auto chunks = std::make_unique<model::InMemoryChunks>(model::architecture(c.config).layout(c.config));
  std::vector<unsigned char> raw;
  for (const model::ChunkLayout& ch : chunks->layout().chunks()) {
    const std::string name = ch.name + suffix;
    const TensorRecord* rec = r0.find(name);
    DType dt = DType::fp32;
    if (rec == nullptr || !parse_dtype(rec->dtype, &dt) || !dtype_is_float(dt) ||
        rec->bytes % dtype_bytes(dt) != 0)
      throw IoError(cat("checkpoint ", c.where, ": rank 0's file has ",
                        rec ? cat("tensor ", name, " of dtype ", rec->dtype, " and ", rec->bytes, " bytes")
                            : cat("no tensor ", name),
                        "; expected the ",
                        which == CheckpointWeights::master ? "fp32 master weights" : "working params",
                        " of chunk ", ch.name, " of model '", c.config.name,
                        "'. The checkpoint is damaged or from another version"));
    const std::size_t shard = rec->bytes / dtype_bytes(dt);
    const std::size_t end = ch.tensors.back().offset + ch.tensors.back().numel;
    if (shard * std::size_t(world) < end)
      throw IoError(cat("checkpoint ", c.where, ": ", world, " x ", shard, " elements of ", name,
                        " cannot hold chunk ", ch.name, " (", end, " elements); the checkpoint is damaged"));
    raw.resize(rec->bytes);
    float* dst = chunks->params(ch.id);  // (padded_numel) fp32
    for (int q = 0; q < world; ++q) {
      const std::size_t first = std::size_t(q) * shard;
      if (first >= ch.padded_numel) break;  // the rest is padding
      reader(q).read(name, raw.data(), raw.size());
      model::convert_to_f32(dt, raw.data(), std::min(shard, ch.padded_numel - first), dst + first);
    }
  }
  return chunks;
}

bool has_master_weights(const CheckpointModel& c) {
  const CheckpointReader r0(c.dir, c.tag, 0);
  const model::ModelLayout layout = model::architecture(c.config).layout(c.config);
  for (const model::ChunkLayout& ch : layout.chunks())
    if (r0.find(ch.name + ".master") == nullptr) return false;
  return true;
}

}  // namespace strata::zero3
