// Saving and loading the engine's state (DESIGN.md §6, format in zero3/checkpoint.h).
//
// Every chunk contributes its working params, fp32 master and optimizer states under "<chunk>.<tensor>"
// ("block.3.exp_avg"), read from wherever they live: addressable copies directly, NVMe-only ones through
// pinned memory one tensor at a time. Gradients are not saved: checkpoints are taken between steps, when
// the gradient shards are empty. Loading writes each tensor into the tiers of the loading engine's config,
// so a run saved with offload cpu can resume with offload nvme and the reverse.
#include <cstddef>
#include <cstring>
#include <vector>

#include "core/log.h"
#include "zero3/checkpoint.h"
#include "zero3/engine_impl.h"

namespace strata::zero3 {
namespace {

using detail::cat;

const char* optimizer_name(OptimizerType t) {
  switch (t) {
    case OptimizerType::Adam:
      return "Adam";
    case OptimizerType::AdamW:
      return "AdamW";
    case OptimizerType::Adagrad:
      return "Adagrad";
    case OptimizerType::Lion:
      return "Lion";
  }
  return "?";
}

}  // namespace

std::string Engine::Impl::save(const std::string& dir, const nlohmann::json& client_state,
                               const model::DataLoader* data, const std::string& tag) {
  STRATA_CHECK(!in_pass && micro_steps == 0,
               "zero3: save_checkpoint is called between optimizer steps (after step(), before the next "
               "forward_backward)");
  if (world > 1)
    throw ConfigError(cat("save_checkpoint with ", world,
                          " ranks: checkpoints are written by single-rank runs only in this version (the "
                          "multi-rank commit and N -> M resharding are not built yet); train with one rank "
                          "to checkpoint, or run without --save"));
  sync_grads();
  CheckpointWriter w(dir, tag.empty() ? step_tag(global_step) : tag, comm->rank(), comm->world_size());
  for (ChunkSlot& s : slots) {
    const std::uint64_t n = s.shard.numel;
    with_host_copy(s.t.param, [&](const void* p) {
      w.add({.name = s.name + ".param", .dtype = dtype_name(wd), .bytes = n * wd_bytes()}, p);
    });
    for (tiering::TensorId id : optimizer_tensors(s)) {
      const std::string suffix = id == s.t.master ? "master" : id == s.t.exp_avg ? "exp_avg" : "exp_avg_sq";
      with_host_copy(id, [&](const void* p) {
        w.add({.name = s.name + "." + suffix, .dtype = "fp32", .bytes = n * 4}, p);
      });
    }
  }
  nlohmann::json meta = {
      {"step", global_step},
      {"applied_steps", applied_steps},
      {"skipped_steps", skipped},
      {"model", mcfg.to_json()},
      {"working_dtype", dtype_name(wd)},
      {"optimizer", optimizer_name(cfg.optimizer.type)},
      {"config", cfg.to_json()},
      {"loss_scaler", scaler.state()},
      {"scheduler", sched.state()},
      {"data", data ? data->position().to_json() : nlohmann::json(nullptr)},
      // Initialisation and data order are counter-based functions of the seed (model/chunk.h,
      // model/data_loader.h); there is no other generator state to carry.
      {"rng", {{"seed", cfg.strata.seed}}},
      {"client_state", client_state.is_null() ? nlohmann::json::object() : client_state},
  };
  const std::string path = w.commit(std::move(meta));
  STRATA_LOG_INFO("zero3: saved checkpoint ", path, " (", format_bytes(w.bytes_written()), ")");
  return path;
}

nlohmann::json Engine::Impl::load(const std::string& dir, const std::string& tag, model::DataLoader* data) {
  STRATA_CHECK(!in_pass && micro_steps == 0,
               "zero3: load_checkpoint is called between optimizer steps (before the next forward_backward)");
  if (world > 1)
    throw ConfigError(cat("load_checkpoint with ", world,
                          " ranks: checkpoints load into single-rank runs only in this version (N -> M "
                          "resharding is not built yet); resume with one rank"));
  CheckpointReader r(dir, tag, comm->rank());
  const nlohmann::json& meta = r.meta();
  const model::ModelConfig saved = model::ModelConfig::from_json(meta.at("model"), r.path() + "/meta.json");
  if (!(saved == mcfg))
    throw ConfigError(cat("checkpoint ", r.path(), " holds model '", saved.name, "' (",
                          saved.to_json().dump(), "); this run trains '", mcfg.name, "' (",
                          mcfg.to_json().dump(), "). Load it with the same --model"));
  const std::string saved_wd = meta.at("working_dtype").get<std::string>();
  if (saved_wd != dtype_name(wd))
    throw ConfigError(cat("checkpoint ", r.path(), " holds ", saved_wd,
                          " working params; this config trains in ", dtype_name(wd),
                          " (bf16.enabled / fp16.enabled must match the saved run)"));
  const std::string saved_opt = meta.at("optimizer").get<std::string>();
  if (saved_opt != optimizer_name(cfg.optimizer.type))
    throw ConfigError(cat("checkpoint ", r.path(), " holds ", saved_opt,
                          " optimizer states; this config's "
                          "optimizer.type is ",
                          optimizer_name(cfg.optimizer.type)));
  if (meta.value("world_size", 1) != comm->world_size())
    throw ConfigError(cat("checkpoint ", r.path(), " was saved by ", meta.value("world_size", 1),
                          " ranks; this run has ", comm->world_size()));

  sync_grads();
  drop_all_gathered();
  tm->synchronize();
  const std::int64_t applied = meta.at("applied_steps").get<std::int64_t>();
  for (ChunkSlot& s : slots) {
    const std::uint64_t n = s.shard.numel;
    std::vector<tiering::Move> writes;
    auto read_into = [&](tiering::TensorId id, const std::string& name, std::uint64_t bytes) {
      const Tier home = tm->info(id).desc.home;
      if (home == Tier::device && by_ops) {  // through host memory, then onto the device
        std::vector<std::byte> host(bytes);
        r.read(name, host.data(), bytes);
        to_device(tm->data(id, home), host.data(), bytes);
        return;
      }
      if (home != Tier::nvme) {
        r.read(name, tm->data(id, home), bytes);
        return;
      }
      tm->pin(id);
      void* p = tm->allocate(id, Tier::pinned);
      try {
        r.read(name, p, bytes);
      } catch (...) {
        tm->unpin(id);
        throw;
      }
      tm->mark_written(id, Tier::pinned);
      tm->unpin(id);
      writes.push_back(tm->evict(id, Tier::pinned, Tier::nvme));
    };
    read_into(s.t.param, s.name + ".param", n * wd_bytes());
    for (tiering::TensorId id : optimizer_tensors(s)) {
      const std::string suffix = id == s.t.master ? "master" : id == s.t.exp_avg ? "exp_avg" : "exp_avg_sq";
      read_into(id, s.name + "." + suffix, n * 4);
    }
    for (const tiering::Move& m : writes) m.wait();
    s.opt = {.step = applied, .finite = true};
    s.grads_fresh = true;
  }
  param_cache.clear();
  param_cache_numel = 0;
  scaler.load_state(meta.at("loss_scaler"));
  sched.load_state(meta.at("scheduler"));
  global_step = meta.at("step").get<std::int64_t>();
  applied_steps = applied;
  skipped = meta.value("skipped_steps", std::int64_t(0));
  if (data && !meta.at("data").is_null()) data->set_position(model::DataPosition::from_json(meta.at("data")));
  STRATA_LOG_INFO("zero3: loaded checkpoint ", r.path(), " at step ", global_step);
  return meta.value("client_state", nlohmann::json::object());
}

}  // namespace strata::zero3
