// Saving and loading the engine's state (DESIGN.md §6, format in zero3/checkpoint.h).
//
// Every chunk contributes its working params, fp32 master and optimizer states under "<chunk>.<tensor>"
// ("block.3.exp_avg"), read from wherever they live: addressable copies directly, NVMe-only ones through
// pinned memory one tensor at a time. Gradients are not saved: checkpoints are taken between steps, when
// the gradient shards are empty. Loading writes each tensor into the tiers of the loading engine's config,
// so a run saved with offload cpu can resume with offload nvme and the reverse.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

#include "core/files.h"
#include "core/log.h"
#include "model/architecture.h"
#include "model/hf_dir.h"
#include "model/safetensors.h"
#include "zero3/checkpoint.h"
#include "zero3/engine_impl.h"

namespace strata::zero3 {
namespace {

using detail::cat;

// The update the optimizer states belong to: Adam with adam_w_mode (DeepSpeed's default) is AdamW's, so
// a checkpoint of one resumes under the other.
std::string update_rule(const std::string& type, bool adam_w_mode) {
  return type == "Adam" && adam_w_mode ? "AdamW" : type;
}

}  // namespace

std::uint64_t Engine::Impl::checkpoint_bytes() const {
  auto aligned = [](std::uint64_t b) { return (b + 4095) / 4096 * 4096; };
  std::uint64_t b = 4096 + (std::uint64_t(64) << 10);  // the header, and room for the table
  for (const ChunkSlot& s : slots) {
    if (!keeps_params(s)) continue;  // a frozen base named by its identity: nothing of it is written
    b += aligned(s.shard.numel * working_dtype_bytes());
    b += optimizer_tensors(s).size() * aligned(s.shard.numel * 4);  // none for a frozen chunk
  }
  return b;
}

std::string Engine::Impl::save(const std::string& dir, const nlohmann::json& client_state,
                               const model::DataLoader* data, const std::string& tag) {
  STRATA_CHECK(!cache.in_pass() && micro_steps == 0,
               "zero3: save_checkpoint is called between optimizer steps (after step(), before the next "
               "forward_backward)");
  grads.sync();
  gather_stream->synchronize();  // replicated params: the step's all-gather has landed
  STRATA_CHECK(!base_identity.is_null() ||
                   std::none_of(slots.begin(), slots.end(), [](const ChunkSlot& s) { return bool(s.nf4); }),
               "zero3: a checkpoint over an NF4 base names the base (Engine::set_base) and holds none of it");
  CheckpointWriter w(dir, tag.empty() ? step_tag(global_step) : tag, comm->rank(), world, comm);
  // Enough room for this rank's file, checked before writing (a full disk part-way loses nothing either:
  // the previous checkpoint stays until this one is complete).
  if (const std::optional<std::uint64_t> room = free_disk_bytes(w.tmp_dir())) {
    const std::uint64_t free = *room, need = checkpoint_bytes();
    if (free < need)
      throw IoError(cat("checkpoint ", dir, ": this rank's part needs ", format_bytes(need),
                        " and the file system has ", format_bytes(free),
                        " free; free space or save elsewhere (--save)"));
  }
  for (ChunkSlot& s : slots) {
    const std::uint64_t n = s.shard.numel;
    if (!keeps_params(s)) continue;  // Note [The adapters' base in checkpoints]
    with_host_copy(s.tensors.param,
                   [&](const void* p) {  // this rank's slice (of the whole chunk if replicated)
                     w.add({.name = s.name + ".param",
                            .dtype = dtype_name(working_dtype),
                            .bytes = n * working_dtype_bytes()},
                           static_cast<const char*>(p) + s.param_offset * working_dtype_bytes());
                   });
    for (tiering::TensorId id : optimizer_tensors(s)) {
      const std::string suffix = id == s.tensors.master    ? "master"
                                 : id == s.tensors.exp_avg ? "exp_avg"
                                                           : "exp_avg_sq";
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
      {"working_dtype", dtype_name(working_dtype)},
      {"optimizer", rule.name()},
      {"config", cfg.to_json()},
      {"loss_scaler", scaler.state()},
      {"scheduler", sched.state()},
      {"data", data ? data->position().to_json() : nlohmann::json(nullptr)},
      // Initialisation and data order are counter-based functions of the seed (model/chunk.h,
      // model/data_loader.h); there is no other generator state to carry.
      {"rng", {{"seed", cfg.strata.seed}}},
      {"client_state", client_state.is_null() ? nlohmann::json::object() : client_state},
      // The layout the shards cut (rank r of world_size holds [r, r + 1) x padded_numel / world_size of
      // every chunk): what a load at another world size reshards from.
      {"chunks", chunk_table()},
  };
  if (!base_identity.is_null()) meta["base"] = base_identity;
  const std::string path = w.commit(std::move(meta));
  STRATA_LOG_INFO("zero3: saved checkpoint ", path, " (", format_bytes(w.bytes_written()),
                  world > 1 ? " on this rank)" : ")");
  // Note [Checkpoint rotation] in zero3/checkpoint.h: rank 0 alone, once every rank has committed.
  if (comm->rank() == 0 && cfg.checkpoint.keep_last > 0)
    if (const std::vector<std::string> gone = rotate_checkpoints(dir, cfg.checkpoint.keep_last);
        !gone.empty())
      STRATA_LOG_INFO("zero3: removed checkpoint", gone.size() > 1 ? "s " : " ", detail::join(gone, ", "),
                      " of ", dir, " (checkpoint.keep_last ", cfg.checkpoint.keep_last, ")");
  return path;
}

nlohmann::json Engine::Impl::chunk_table() const {
  nlohmann::json t = nlohmann::json::array();
  for (const model::ChunkLayout& c : layout.chunks())
    t.push_back({{"name", c.name}, {"numel", c.numel}, {"padded_numel", c.padded_numel}});
  return t;
}

// Note [Resuming with other settings]: a checkpoint resumes under another config when the model, the
// working dtype and the update rule match (refused otherwise, above), but two changes alter the run without
// failing it: another global batch (micro x accumulation x ranks: the data position and the schedule's
// step count mean other samples than the saved run's), and another learning-rate schedule (the scheduler's
// state is the saved step; a new total or warmup reshapes the rest of the curve). Each is said once, with
// both figures, before the first step.
void Engine::Impl::warn_changed_settings(const std::string& path, const nlohmann::json& meta) const {
  const auto saved = meta.find("config");
  if (saved == meta.end() || !saved->is_object()) return;
  const std::int64_t saved_batch = saved->value("train_batch_size", std::int64_t(0));
  if (saved_batch > 0 && saved_batch != cfg.train_batch_size)
    STRATA_LOG_WARN(
        "zero3: checkpoint ", path, " was trained with a global batch of ", saved_batch,
        " samples (train_micro_batch_size_per_gpu ",
        saved->value("train_micro_batch_size_per_gpu", std::int64_t(0)), " x gradient_accumulation_steps ",
        saved->value("gradient_accumulation_steps", std::int64_t(0)), " x ", meta.value("world_size", 1),
        " ranks); this run's is ", cfg.train_batch_size, " (", cfg.train_micro_batch_size_per_gpu, " x ",
        cfg.gradient_accumulation_steps, " x ", world,
        "): a step now takes other samples than the saved run's, and the schedule counts its steps");
  const nlohmann::json now = cfg.to_json().value("scheduler", nlohmann::json());
  const nlohmann::json before = saved->value("scheduler", nlohmann::json());
  std::vector<std::string> changes;  // "scheduler.params.total_num_steps 60 -> 99"
  for (const nlohmann::json& op : nlohmann::json::diff(before, now)) {
    const nlohmann::json::json_pointer at(op.at("path").get<std::string>());
    std::string key = "scheduler" + at.to_string();
    std::replace(key.begin(), key.end(), '/', '.');
    changes.push_back(cat(key, " ", before.contains(at) ? before.at(at).dump() : std::string("(none)"),
                          " -> ", now.contains(at) ? now.at(at).dump() : std::string("(none)")));
  }
  if (!changes.empty())
    STRATA_LOG_WARN("zero3: checkpoint ", path, " was trained with another schedule (",
                    detail::join(changes, ", "),
                    "): the learning rate goes on from the saved step along this run's");
}

nlohmann::json Engine::Impl::load(const std::string& dir, const std::string& tag, model::DataLoader* data) {
  STRATA_CHECK(!cache.in_pass() && micro_steps == 0,
               "zero3: load_checkpoint is called between optimizer steps (before the next forward_backward)");
  // Rank 0's file and the metadata first: which ranks' files this rank needs depends on the saved world
  // size.
  CheckpointReader r(dir, tag, 0);
  const nlohmann::json& meta = r.meta();
  const model::ModelConfig saved = model::ModelConfig::from_json(meta.at("model"), r.path() + "/meta.json");
  if (!(saved == mcfg) && saved.lora.active() != mcfg.lora.active()) {
    model::ModelConfig a = saved, b = mcfg;
    a.lora = b.lora = {};
    if (a == b)  // the same base: the adapters differ
      throw ConfigError(
          cat("checkpoint ", r.path(),
              saved.lora.active() ? " trained LoRA adapters over this base, and this run has none"
                                  : " trained the whole model, and this run trains LoRA adapters",
              "; resume with the saved run's adapters (the same strata.lora block or --adapter "
              "DIR)",
              saved.lora.active() ? cat(": ", model::lora_to_json(saved).dump()) : std::string()));
  }
  if (!(saved == mcfg))
    throw ConfigError(cat("checkpoint ", r.path(), " holds model '", saved.name, "' (",
                          saved.to_json().dump(), "); this run trains '", mcfg.name, "' (",
                          mcfg.to_json().dump(), "). Load it with the same --model"));
  const std::string saved_working_dtype = meta.at("working_dtype").get<std::string>();
  if (saved_working_dtype != dtype_name(working_dtype))
    throw ConfigError(cat("checkpoint ", r.path(), " holds ", saved_working_dtype,
                          " working params; this config trains in ", dtype_name(working_dtype),
                          " (bf16.enabled / fp16.enabled must match the saved run)"));
  const std::string saved_opt = meta.at("optimizer").get<std::string>();
  bool saved_w_mode = true;  // DeepSpeed's default, and what a checkpoint without its config means
  if (const auto c = meta.find("config"); c != meta.end() && c->is_object())
    saved_w_mode = c->value("/optimizer/params/adam_w_mode"_json_pointer, true);
  const std::string ours = rule.name();
  if (update_rule(saved_opt, saved_w_mode) != update_rule(ours, cfg.optimizer.adam_w_mode))
    throw ConfigError(cat(
        "checkpoint ", r.path(), " holds ", saved_opt,
        saved_opt == "Adam" ? (saved_w_mode ? " (adam_w_mode true)" : " (adam_w_mode false)") : "",
        " optimizer states; this config's optimizer.type is ", ours,
        ours == "Adam" ? (cfg.optimizer.adam_w_mode ? " (adam_w_mode true)" : " (adam_w_mode false)") : "",
        ", a different update: use the saved run's optimizer"));
  warn_changed_settings(r.path(), meta);
  const int saved_world = meta.value("world_size", 1);
  if (saved_world < 1)
    throw IoError(cat(r.path(), "/meta.json: world_size ", saved_world,
                      " is not a rank count; the checkpoint is damaged"));

  // Note [The adapters' base in checkpoints]: a checkpoint of adapters over a named base holds the adapters
  // alone; it resumes over that same base only.
  const bool base_named = meta.contains("base") && !meta["base"].is_null();
  if (base_named) {
    const nlohmann::json& saved = meta["base"];
    const auto path = [](const nlohmann::json& b) { return b.value("path", std::string("?")); };
    if (base_identity.is_null())
      throw ConfigError(cat("checkpoint ", r.path(), " holds LoRA adapters over the base ", path(saved),
                            " (digest ", saved.value("digest", std::string("?")),
                            ") but not the base's weights; start the run from that base (--init-from ",
                            path(saved), ", or model= in Python) to resume it"));
    if (saved.value("digest", std::string()) != base_identity.value("digest", std::string()))
      throw ConfigError(cat("checkpoint ", r.path(), " trained its adapters over the base ", path(saved),
                            " (digest ", saved.value("digest", std::string("?")), "); this run's base ",
                            path(base_identity), " has digest ",
                            base_identity.value("digest", std::string("?")),
                            ": other weights. Resume over the base the checkpoint names"));
  }

  grads.sync();
  cache.drop_all_gathered();
  tm->synchronize();
  const std::int64_t applied = meta.at("applied_steps").get<std::int64_t>();
  // The saved layout: its chunks padded for `saved_world` ranks, rank q's shard of chunk c the elements
  // [q, q + 1) x padded / saved_world. This rank's shard of the current layout is put together from the
  // saved shards it overlaps (the same rank's alone when the world size is unchanged); elements beyond the
  // saved chunk's end are padding, zero.
  const model::ModelLayout saved_layout = model::architecture(mcfg).layout(mcfg, layout_options(saved_world));
  std::vector<std::unique_ptr<CheckpointReader>> readers;
  readers.resize(std::size_t(saved_world));
  auto reader = [&](int q) -> CheckpointReader& {
    if (q == 0) return r;
    auto& p = readers[std::size_t(q)];
    if (!p) p = std::make_unique<CheckpointReader>(dir, r.tag(), q);
    return *p;
  };
  std::vector<char> staged, piece;
  for (ChunkSlot& s : slots) {
    const std::uint64_t n = s.shard.numel;
    const std::uint64_t saved_shard = saved_layout.chunk(s.id).padded_numel / std::uint64_t(saved_world);
    std::vector<tiering::Move> writes;
    // Elements [first, first + count) of the chunk, from the saved shards that hold them.
    auto read_into = [&](tiering::TensorId id, const std::string& name, std::size_t elt, std::uint64_t first,
                         std::uint64_t count) {
      staged.assign(count * elt, 0);
      for (int q = 0; q < saved_world; ++q) {
        const std::uint64_t lo = std::max<std::uint64_t>(first, std::uint64_t(q) * saved_shard);
        const std::uint64_t hi = std::min<std::uint64_t>(first + count, std::uint64_t(q + 1) * saved_shard);
        if (lo >= hi) continue;
        piece.resize(saved_shard * elt);
        reader(q).read(name, piece.data(), piece.size());
        std::memcpy(staged.data() + (lo - first) * elt,
                    piece.data() + (lo - std::uint64_t(q) * saved_shard) * elt, (hi - lo) * elt);
      }
      const Tier home = tm->info(id).desc.home;
      if (home == Tier::device && by_ops) {
        to_device(tm->data(id, home), staged.data(), staged.size());
        return;
      }
      if (home != Tier::nvme) {
        std::memcpy(tm->data(id, home), staged.data(), staged.size());
        return;
      }
      writes.push_back(put(id, Tier::nvme, staged.data(), staged.size()));
    };
    // The working params: this rank's shard or — replicated — the whole chunk; a named base's are the ones
    // this run read from it.
    if (!s.nf4 && !(base_named && !s.route.trains))
      read_into(s.tensors.param, s.name + ".param", working_dtype_bytes(), replicated ? 0 : s.shard.offset,
                s.param_numel);
    for (tiering::TensorId id : optimizer_tensors(s)) {
      const std::string suffix = id == s.tensors.master    ? "master"
                                 : id == s.tensors.exp_avg ? "exp_avg"
                                                           : "exp_avg_sq";
      read_into(id, s.name + "." + suffix, 4, s.shard.offset, n);
    }
    for (const tiering::Move& m : writes) m.wait();
    updater.set_shard_step(s.id, {.step = applied, .finite = true});
  }
  grads.new_step();
  cache.forget_param_copies();
  scaler.load_state(meta.at("loss_scaler"));
  sched.load_state(meta.at("scheduler"));
  global_step = meta.at("step").get<std::int64_t>();
  applied_steps = applied;
  skipped = meta.value("skipped_steps", std::int64_t(0));
  if (data && !meta.at("data").is_null()) {
    model::DataPosition pos = model::DataPosition::from_json(meta.at("data"));
    const int now = data->position().world;
    if (pos.world != now) {
      // DistributedSampler order: after k samples on each of W ranks, positions [0, k x W) of the epoch's
      // list are consumed on every rank count; M ranks go on from there with k x W / M each.
      const std::int64_t consumed = pos.sample * pos.world;
      if (consumed % now != 0)
        throw ConfigError(cat("checkpoint ", r.path(), ": ", pos.world, " ranks had consumed ", consumed,
                              " samples of epoch ", pos.epoch, ", which ", now,
                              " ranks cannot split evenly; resume with a rank count that divides it (the "
                              "global batch micro x accumulation x ranks should stay the same)"));
      pos.sample = consumed / now;
      pos.world = now;
    }
    data->set_position(pos);
  }
  STRATA_LOG_INFO("zero3: loaded checkpoint ", r.path(), " at step ", global_step,
                  saved_world != world ? cat(" (saved by ", saved_world, " ranks, resharded for ", world, ")")
                                       : std::string());
  return meta.value("client_state", nlohmann::json::object());
}

bool export_model(Engine& engine, const std::string& path, const std::string& source_dir) {
  const bool one_file = path.ends_with(".safetensors");
  if (engine.communicator().rank() == 0) {
    if (one_file)
      model::save_weights(path, engine, DType::bf16);
    else
      model::save_pretrained(path, engine, DType::bf16, {.source_dir = source_dir});
    return one_file;
  }
  std::vector<float> buf;  // the same collective reads, chunk by chunk, as rank 0's writer makes
  for (const model::ChunkLayout& c : engine.layout().chunks()) {
    buf.resize(c.padded_numel);
    engine.read_params(c.id, buf.data());
  }
  return one_file;
}

}  // namespace strata::zero3
