#include "session/adapters.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "config/lora_peft.h"
#include "core/error.h"
#include "core/log.h"
#include "model/architecture.h"
#include "model/hf_dir.h"
#include "model/lora.h"
#include "zero3/checksum.h"

namespace strata::session {

using detail::cat;
namespace fs = std::filesystem;

namespace {

std::string last_component(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return fs::path(p).filename().string();
}

model::LoraTargets targets_of(const StrataConfig::Lora& l) {
  return {.modules = l.target_modules, .regex = l.target_modules_regex, .modules_to_save = l.modules_to_save};
}

model::LoraShape shape_of(const StrataConfig::Lora& l) {
  return {.r = l.r,
          .alpha = l.lora_alpha,
          .rslora = l.use_rslora,
          .dropout = l.lora_dropout,
          .nf4_base = l.base_dtype == "nf4",
          .double_quant = l.double_quant};
}

// The config's block as the settings PEFT's file would carry for the same adapters.
StrataConfig::Lora block_of(const model::ModelConfig& m) {
  StrataConfig::Lora l;
  l.enabled = true;
  l.r = m.lora.r;
  l.lora_alpha = m.lora.alpha;
  l.lora_dropout = m.lora.dropout;
  l.use_rslora = m.lora.rslora;
  l.target_modules = model::lora_target_paths(m);
  l.modules_to_save = model::lora_saved_modules(m.lora);
  return l;
}

model::ModelConfig without_adapters(model::ModelConfig m) {
  m.lora = {};
  return m;
}

}  // namespace

std::string peft_key(const model::TensorSpec& t) {
  return "base_model.model." + t.hf_name;
}

StrataConfig::Lora read_adapter_config(const std::string& dir, const std::string& flag) {
  if (!fs::is_directory(dir))
    throw ConfigError(cat(flag, " ", dir,
                          ": not a directory; give a PEFT adapter directory (adapter_config.json "
                          "and adapter_model.safetensors, as PeftModel.save_pretrained writes)"));
  const std::string path = (fs::path(dir) / "adapter_config.json").string();
  std::ifstream in(path);
  if (!in)
    throw ConfigError(cat(flag, " ", dir,
                          ": no adapter_config.json; give the directory PEFT's save_pretrained "
                          "(or strata train --export with adapters) wrote"));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(cat(flag, " ", path, ": not valid JSON: ", e.what()));
  }
  StrataConfig::Lora l = lora_from_peft(j, cat(flag, " ", path));
  l.adapter_dir = dir;
  return l;
}

void resolve_adapters(ModelSource& src, const StrataConfig::Lora& block, const std::string& adapter_dir,
                      const std::string& flag) {
  StrataConfig::Lora use = block;
  std::string where = "strata.lora";
  if (!adapter_dir.empty()) {
    const StrataConfig::Lora dir = read_adapter_config(adapter_dir, flag);
    where = cat(flag, " ", adapter_dir, "/adapter_config.json");
    if (block.enabled) {
      // The directory's adapters were trained with its settings; the block may restate them, not change them.
      auto differs = [&](const char* key, const std::string& a, const std::string& b) {
        if (a != b)
          throw ConfigError(cat("strata.lora.", key, " is ", a, " but the adapters of ", flag, " ",
                                adapter_dir, " have ", b,
                                "; drop the key from strata.lora (the directory's settings are the "
                                "adapters') or train new adapters without ",
                                flag));
      };
      differs("r", std::to_string(block.r), std::to_string(dir.r));
      differs("lora_alpha", nlohmann::json(block.lora_alpha).dump(), nlohmann::json(dir.lora_alpha).dump());
      differs("use_rslora", block.use_rslora ? "true" : "false", dir.use_rslora ? "true" : "false");
      use = dir;
      use.base_dtype = block.base_dtype, use.double_quant = block.double_quant;
      use.lora_dropout = block.lora_dropout;  // a training setting, not the adapters'
    } else {
      use = dir;
    }
    // base_model_name_or_path: PEFT's name of the base (a hub id or a path; PEFT writes null when it has
    // none). Its last component must be the base's directory name.
    if (std::ifstream in(fs::path(adapter_dir) / "adapter_config.json"); in) {
      const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
      const nlohmann::json* named =
          j.is_object() && j.contains("base_model_name_or_path") ? &j["base_model_name_or_path"] : nullptr;
      if (named && named->is_string() && !named->get<std::string>().empty() && src.hf &&
          !src.hf->dir.empty() && last_component(named->get<std::string>()) != last_component(src.hf->dir))
        throw ConfigError(cat(flag, " ", adapter_dir, ": the adapters were made for the base \"",
                              named->get<std::string>(), "\", not ", src.hf->dir,
                              "; give the base they were trained over (or train new adapters)"));
    }
  }
  if (!use.enabled) return;
  if (!use.init_lora_weights && use.adapter_dir.empty())
    throw ConfigError(cat(where,
                          ": init_lora_weights false (B drawn at random, PEFT's debugging choice) is not "
                          "computed; use true, which starts the adapted model as its base"));
  src.config.lora = model::resolve_lora(src.config, targets_of(use), shape_of(use), where);
}

AdapterWeights::AdapterWeights(const std::string& dir, const model::ModelLayout& layout,
                               const std::string& flag)
    : file_([&] {
        const fs::path st = fs::path(dir) / "adapter_model.safetensors";
        if (!fs::exists(st)) {
          const bool bin = fs::exists(fs::path(dir) / "adapter_model.bin");
          throw ConfigError(cat(flag, " ", dir, ": no adapter_model.safetensors",
                                bin ? " (adapter_model.bin is PyTorch's pickle, which Strata does not read: "
                                      "save the adapter again with safe_serialization=True)"
                                    : "; give the directory PEFT's save_pretrained wrote"));
        }
        return st.string();
      }()),
      flag_(flag) {
  std::set<std::string> wanted;
  for (const model::ChunkLayout& c : layout.chunks()) {
    const bool adapter = c.kind == model::ChunkKind::adapter;
    for (const model::TensorSpec& t : c.stored) {
      const std::string key = peft_key(t);
      const model::SafetensorsEntry* e = file_.find(key);
      if (!e) {
        if (adapter)
          throw ConfigError(cat(flag, " ", file_.path(), " has no tensor ", key, ", which the adapters of ",
                                layout.config().name, " need (", t.name, " of ", c.name,
                                "); the directory was made for other target_modules"));
        continue;  // a saved module the file does not carry: from the base
      }
      if (e->shape != t.shape)
        throw ConfigError(cat(flag, " ", file_.path(), ": tensor ", key, " has shape ",
                              nlohmann::json(e->shape).dump(), "; this base gives it ",
                              nlohmann::json(t.shape).dump(),
                              ": the adapters were made for another base (or another r)"));
      wanted.insert(key);
    }
  }
  for (const model::SafetensorsEntry& e : file_.entries())
    if (!wanted.count(e.name))
      throw ConfigError(
          cat(flag, " ", file_.path(), " holds ", e.name,
              ", which no adapter or saved module of this model is (adapter_config.json's "
              "target_modules and modules_to_save name the modules); the directory was made for "
              "another base or its files disagree"));
}

bool AdapterWeights::holds(const model::ChunkLayout& c) const {
  if (c.kind == model::ChunkKind::adapter) return true;
  if (c.kind == model::ChunkKind::block || c.kind == model::ChunkKind::head) return false;
  return std::all_of(c.stored.begin(), c.stored.end(),
                     [&](const model::TensorSpec& t) { return file_.find(peft_key(t)) != nullptr; });
}

void AdapterWeights::read_chunk(const model::ChunkLayout& c, float* out) const {
  std::fill(out, out + c.padded_numel, 0.0f);
  for (const model::TensorSpec& t : c.stored)
    file_.read_f32(peft_key(t), t.shape, out + t.offset, cat(flag_, ": ", c.name, " ", t.name));
}

void BaseDigest::add(const float* data, std::size_t n) {
  crc = zero3::crc32c(data, n * sizeof(float), crc);
  values += n;
}

std::string BaseDigest::str() const {
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", crc);
  return cat("crc32c:", hex, "/", values);
}

namespace {

// The merged model's chunks, read through the engine (Note [Adapter directories] and export_merged): the
// base layout's chunks, each tensor from the engine chunk that holds it, every adapted projection plus
// s B A of its adapters' masters.
class MergedChunks final : public model::ChunkProvider {
 public:
  explicit MergedChunks(zero3::Engine& e)
      : e_(e),
        layout_(model::architecture(e.layout().config())
                    .layout(without_adapters(e.layout().config()), e.layout().options())) {}
  const model::ModelLayout& layout() const override { return layout_; }
  model::ChunkView acquire(int) override {
    STRATA_CHECK(false, "MergedChunks is read with read_params only");
    return {};
  }
  void release(int) override {}
  float* acquire_grads(int) override {
    STRATA_CHECK(false, "MergedChunks has no gradients");
    return nullptr;
  }
  void release_grads(int) override {}

  void read_params(int id, float* out) override {
    const model::ChunkLayout& c = layout_.chunk(id);
    const model::ModelLayout& el = e_.layout();
    std::fill(out, out + c.padded_numel, 0.0f);
    for (const model::TensorSpec& t : c.stored) {
      int src = -1;
      const model::TensorSpec* from = el.find_hf(t.hf_name, &src);
      STRATA_CHECK(from && from->numel == t.numel, "merged export: ", t.hf_name,
                   " not in the engine's layout");
      std::memcpy(out + t.offset, engine_chunk(src) + from->offset, t.numel * sizeof(float));
    }
    if (c.kind != model::ChunkKind::block) return;
    const int ad = el.adapter_chunk(c.layer);
    if (ad < 0) return;
    const model::ModelConfig& mc = el.config();
    std::vector<float> masters(el.chunk(ad).padded_numel);
    e_.read_masters(ad, masters.data());
    const model::ChunkLayout& ac = el.chunk(ad);
    const double s = mc.lora.scale();
    const std::int64_t R = mc.lora.r;
    for (int proj :
         {model::kWq, model::kWk, model::kWv, model::kWo, model::kWGate, model::kWUp, model::kWDown}) {
      std::int64_t row = 0;
      const int site = model::lora_site_of_projection(mc, proj, &row);
      if (!ac.has(model::lora_a_index(site))) continue;
      const model::TensorSpec& w = c.at(proj);
      const std::int64_t OC = w.shape[0], IC = w.shape[1];
      const float* A = masters.data() + ac.at(model::lora_a_index(site)).offset;
      const float* B = masters.data() + ac.at(model::lora_b_index(site)).offset + row * R;
      float* W = out + w.offset;
      tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, OC),
                        [&](const tbb::blocked_range<std::int64_t>& r) {
                          std::vector<double> acc(static_cast<std::size_t>(IC));
                          for (std::int64_t o = r.begin(); o < r.end(); ++o) {
                            std::fill(acc.begin(), acc.end(), 0.0);
                            for (std::int64_t k = 0; k < R; ++k) {
                              const double b = B[o * R + k];
                              const float* a = A + k * IC;
                              for (std::int64_t i = 0; i < IC; ++i) acc[std::size_t(i)] += b * double(a[i]);
                            }
                            for (std::int64_t i = 0; i < IC; ++i)
                              W[o * IC + i] = float(double(W[o * IC + i]) + s * acc[std::size_t(i)]);
                          }
                        });
    }
  }

 private:
  // The engine's chunk `id` as its working params (one kept: a base chunk is read once per merged chunk).
  const float* engine_chunk(int id) {
    if (id != cached_) {
      buf_.resize(e_.layout().chunk(id).padded_numel);
      e_.read_params(id, buf_.data());
      cached_ = id;
    }
    return buf_.data();
  }

  zero3::Engine& e_;
  model::ModelLayout layout_;
  std::vector<float> buf_;
  int cached_ = -1;
};

std::string base_name(const ModelSource& src) {
  if (!src.hf) return "";
  return src.hf->dir.empty() ? src.hf->weights : fs::absolute(src.hf->dir).string();
}

}  // namespace

void export_adapter(zero3::Engine& engine, const std::string& dir, const ModelSource& src) {
  const model::ModelLayout& layout = engine.layout();
  const model::ModelConfig& m = layout.config();
  STRATA_CHECK(m.lora.active(), "export_adapter: the engine's model has no adapters");
  // What the file holds: every chunk that trains (adapters, saved modules), whole, from its masters.
  std::vector<model::SafetensorsWriter::Decl> decls;
  std::vector<int> chunks;
  for (const model::ChunkLayout& c : layout.chunks()) {
    if (!engine.trains(c.id)) continue;
    chunks.push_back(c.id);
    for (const model::TensorSpec& t : c.stored) decls.push_back({peft_key(t), DType::fp32, t.shape});
  }
  const bool writer = engine.communicator().rank() == 0;
  std::unique_ptr<model::SafetensorsWriter> w;
  if (writer) {
    fs::create_directories(dir);
    w = std::make_unique<model::SafetensorsWriter>((fs::path(dir) / "adapter_model.safetensors").string(),
                                                   decls);
  }
  std::vector<float> buf;
  for (int id : chunks) {
    const model::ChunkLayout& c = layout.chunk(id);
    buf.resize(c.padded_numel);
    engine.read_masters(id, buf.data());
    if (w)
      for (const model::TensorSpec& t : c.stored) w->write_f32(peft_key(t), buf.data() + t.offset);
  }
  if (!writer) return;
  w->finish();
  const nlohmann::json cfg = peft_adapter_config(block_of(m), base_name(src), model::lora_target_paths(m));
  {
    const std::string path = (fs::path(dir) / "adapter_config.json").string();
    std::ofstream out(path + ".tmp");
    out << cfg.dump(2) << "\n";
    out.close();
    if (!out) throw IoError(cat("cannot write ", path, ".tmp"));
    fs::rename(path + ".tmp", path);
  }
  // The tokenizer and its chat templates go along, as TRL's and PEFT's trainers save them beside adapters.
  if (src.hf && !src.hf->dir.empty())
    for (const std::string& f : model::tokenizer_files(src.hf->dir)) {
      const fs::path to = fs::path(dir) / f;
      fs::create_directories(to.parent_path());
      fs::copy_file(fs::path(src.hf->dir) / f, to, fs::copy_options::overwrite_existing);
    }
}

void export_merged(zero3::Engine& engine, const std::string& path, const ModelSource& src) {
  MergedChunks merged(engine);
  if (engine.communicator().rank() == 0) {
    if (path.ends_with(".safetensors"))
      model::save_weights(path, merged, DType::bf16);
    else
      model::save_pretrained(path, merged, DType::bf16,
                             {.source_dir = src.hf && !src.hf->dir.empty() ? src.hf->dir : std::string()});
    return;
  }
  std::vector<float> buf;  // the same collective reads, chunk by chunk, as rank 0's writer makes
  for (const model::ChunkLayout& c : merged.layout().chunks()) {
    buf.resize(c.padded_numel);
    merged.read_params(c.id, buf.data());
  }
}

std::unique_ptr<model::InMemoryChunks> load_adapted(const ModelSource& src, const std::string& adapter_dir,
                                                    const std::string& flag) {
  STRATA_CHECK(src.config.lora.active(), "load_adapted: the model has no adapters");
  if (!src.hf)
    throw ConfigError(cat(flag,
                          " needs the base's weights: give --model a Hugging Face model directory or "
                          "a .safetensors file"));
  const model::Architecture& arch = model::architecture(src.config);
  auto chunks = std::make_unique<model::InMemoryChunks>(arch.layout(src.config));
  const model::ModelLayout& layout = chunks->layout();
  const model::WeightsSource base(src.hf->weights, arch.layout(without_adapters(src.config)));
  const AdapterWeights adapters(adapter_dir, layout, flag);
  for (const model::ChunkLayout& c : layout.chunks()) {
    if (adapters.holds(c))
      adapters.read_chunk(c, chunks->params(c.id));
    else
      base.read_chunk(c, chunks->params(c.id));
  }
  return chunks;
}

}  // namespace strata::session
