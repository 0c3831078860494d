#include "model/hf_dir.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/files.h"
#include "model/layout.h"
#include "model/safetensors.h"

namespace strata::model {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using detail::cat;

// model-NNNNN-of-MMMMM.safetensors: the name transformers gives a weight shard.
bool is_shard_file_name(std::string_view name) {
  constexpr std::string_view form = "model-#####-of-#####.safetensors";
  return name.size() == form.size() && std::equal(form.begin(), form.end(), name.begin(), [](char f, char c) {
           return f == '#' ? c >= '0' && c <= '9' : f == c;
         });
}

json read_json(const fs::path& p, const char* what) {
  std::ifstream in(p);
  if (!in) {
    const int err = errno;
    throw IoError(cat("cannot open ", what, " ", p.string(), ": ", detail::errno_text(err)));
  }
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw ConfigError(cat(what, " ", p.string(), " is not valid JSON: ", e.what()));
  }
}

// Writes `text` to `path` through a temporary file and a rename.
void write_file(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      const int err = errno;
      throw IoError(cat("cannot create ", tmp.string(), " (written, then renamed to ", path.string(),
                        "): ", detail::errno_text(err)));
    }
    out << text;
    out.flush();
    if (!out) throw IoError(cat("writing ", tmp.string(), " failed (disk full?)"));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw IoError(cat("rename ", tmp.string(), " to ", path.string(), ": ", ec.message()));
}

void copy_through_tmp(const fs::path& from, const fs::path& to) {
  const fs::path tmp = to.string() + ".tmp";
  std::error_code ec;
  fs::copy_file(from, tmp, fs::copy_options::overwrite_existing, ec);
  if (!ec) fs::rename(tmp, to, ec);
  if (ec) throw IoError(cat("copy ", from.string(), " to ", to.string(), ": ", ec.message()));
}

const char* torch_dtype(DType t) {
  return t == DType::bf16 ? "bfloat16" : t == DType::fp16 ? "float16" : "float32";
}

}  // namespace

HfModel open_hf_model(const std::string& path) {
  HfModel m;
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec)) {
    m.dir = path;
    const fs::path cfg = p / "config.json";
    if (!fs::exists(cfg))
      throw ConfigError(cat(path,
                            ": no config.json; a Hugging Face model directory holds config.json and "
                            "model.safetensors (or model.safetensors.index.json with its shards)"));
    if (fs::exists(p / "model.safetensors.index.json"))
      m.weights = (p / "model.safetensors.index.json").string();
    else if (fs::exists(p / "model.safetensors"))
      m.weights = (p / "model.safetensors").string();
    else if (fs::exists(p / "pytorch_model.bin") || fs::exists(p / "pytorch_model.bin.index.json"))
      throw ConfigError(cat(path,
                            ": holds PyTorch .bin weights, which Strata does not read; convert them with "
                            "transformers (model.save_pretrained(dir, safe_serialization=True))"));
    else
      throw ConfigError(cat(path, ": no model.safetensors or model.safetensors.index.json"));
    m.config = ModelConfig::from_json(read_json(cfg, "model config"), cfg.string());
    if (m.config.name == "custom")
      m.config.name = p.filename().empty() ? p.parent_path().filename().string() : p.filename().string();
    return m;
  }
  if (!fs::exists(p, ec)) throw ConfigError(cat(path, ": no such file or directory"));
  if (p.extension() != ".safetensors" && !p.string().ends_with(".index.json"))
    throw ConfigError(cat(path, ": expected a Hugging Face model directory or a .safetensors file"));
  m.weights = path;
  const fs::path beside = p.parent_path().empty() ? fs::path("config.json") : p.parent_path() / "config.json";
  // A lone file: its own metadata (Strata's exports), else the config.json beside it.
  if (p.extension() == ".safetensors") {
    SafetensorsReader r(path);
    auto it = r.metadata().find("strata.model_config");
    if (it != r.metadata().end()) {
      json j;
      try {
        j = json::parse(it->second);
      } catch (const json::exception& e) {
        throw ConfigError(cat(path, ": its strata.model_config metadata is not valid JSON: ", e.what()));
      }
      m.config = ModelConfig::from_json(j, path + " (strata.model_config)");
      return m;
    }
  }
  if (!fs::exists(beside))
    throw ConfigError(cat(path,
                          ": carries no model config (no strata.model_config metadata) and there is no ",
                          beside.string(), "; give the model directory instead"));
  m.dir = beside.parent_path().string();
  m.config = ModelConfig::from_json(read_json(beside, "model config"), beside.string());
  return m;
}

void save_pretrained(const std::string& dir, ChunkProvider& chunks, DType dtype,
                     const SavePretrainedOptions& opts) {
  STRATA_CHECK(dtype == DType::bf16 || dtype == DType::fp16 || dtype == DType::fp32,
               "save_pretrained: dtype ", dtype_name(dtype));
  // The caller has checked `dir` up front, naming what its user typed (check_output_dir); this names
  // none, for callers that did not.
  check_output_dir(dir, "model directory");
  const fs::path out(dir);
  const ModelLayout& layout = chunks.layout();
  const ModelConfig& cfg = layout.config();
  json src_cfg = json::object();
  if (!opts.source_dir.empty() && fs::exists(fs::path(opts.source_dir) / "config.json"))
    src_cfg = read_json(fs::path(opts.source_dir) / "config.json", "model config");

  // Shards in tensor order (transformers' greedy split): a new file when the next tensor would pass the
  // limit and the current file holds something.
  struct Shard {
    std::vector<SafetensorsWriter::Decl> decls;
    std::uint64_t bytes = 0;
  };
  std::vector<Shard> shards(1);
  std::uint64_t total = 0;
  for (const ChunkLayout& c : layout.chunks())
    for (const TensorSpec& t : c.stored) {
      std::uint64_t b = dtype_bytes(dtype);
      for (std::int64_t d : t.shape) b *= std::uint64_t(d);
      if (opts.max_shard_bytes > 0 && !shards.back().decls.empty() &&
          shards.back().bytes + b > opts.max_shard_bytes)
        shards.emplace_back();
      shards.back().decls.push_back({t.hf_name, dtype, t.shape});
      shards.back().bytes += b;
      total += b;
    }
  const std::size_t n = shards.size();
  auto shard_name = [&](std::size_t i) {
    if (n == 1) return std::string("model.safetensors");
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, n);
    return std::string(name);
  };
  json weight_map = json::object();
  for (std::size_t i = 0; i < n; ++i)
    for (const auto& d : shards[i].decls) weight_map[d.name] = shard_name(i);

  // One pass over the chunks; the writer of the shard that holds the next tensor is open.
  const std::map<std::string, std::string> meta = {{"strata.model_config", cfg.to_json().dump()}};
  std::size_t si = 0, next_decl = 0;
  auto writer = std::make_unique<SafetensorsWriter>((out / shard_name(0)).string(), shards[0].decls, meta);
  std::vector<float> buf;
  for (const ChunkLayout& c : layout.chunks()) {
    buf.resize(c.padded_numel);
    chunks.read_params(c.id, buf.data());
    for (const TensorSpec& t : c.stored) {
      if (next_decl == shards[si].decls.size()) {
        writer->finish();
        ++si, next_decl = 0;
        writer = std::make_unique<SafetensorsWriter>((out / shard_name(si)).string(), shards[si].decls, meta);
      }
      writer->write_f32(t.hf_name, buf.data() + t.offset);
      ++next_decl;
    }
  }
  writer->finish();
  std::error_code ignored;
  if (n > 1) {
    write_file(out / "model.safetensors.index.json",
               json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) + "\n");
    fs::remove(out / "model.safetensors", ignored);  // an earlier single-file export to the same place
  } else {
    fs::remove(out / "model.safetensors.index.json", ignored);
  }
  // Shards of an earlier export to the same place that this one did not write (it had another count),
  // removed once the new index is in place, as transformers' save_pretrained does: only names of the
  // form model-NNNNN-of-MMMMM.safetensors.
  std::set<std::string> written;
  for (std::size_t i = 0; i < n; ++i) written.insert(shard_name(i));
  std::vector<fs::path> stale;
  for (const fs::directory_entry& e : fs::directory_iterator(out, ignored)) {
    const std::string name = e.path().filename().string();
    if (is_shard_file_name(name) && !written.count(name) && e.is_regular_file(ignored))
      stale.push_back(e.path());
  }
  for (const fs::path& p : stale) fs::remove(p, ignored);

  json hf = cfg.to_hf_json();
  hf["torch_dtype"] = torch_dtype(dtype);
  for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
    if (src_cfg.contains(k)) hf[k] = src_cfg[k];
  write_file(out / "config.json", hf.dump(2) + "\n");
  const fs::path src_gen = fs::path(opts.source_dir) / "generation_config.json";
  if (!opts.source_dir.empty() && fs::exists(src_gen)) {
    copy_through_tmp(src_gen, out / "generation_config.json");
  } else {
    json gen = {{"_from_model_config", true}};
    for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
      if (src_cfg.contains(k)) gen[k] = src_cfg[k];
    write_file(out / "generation_config.json", gen.dump(2) + "\n");
  }
  if (!opts.source_dir.empty())
    for (const std::string& f : tokenizer_files(opts.source_dir)) {
      const fs::path to = out / f;
      std::error_code ec;
      fs::create_directories(to.parent_path(), ec);  // additional_chat_templates/
      if (ec) throw IoError(cat("cannot create ", to.parent_path().string(), ": ", ec.message()));
      copy_through_tmp(fs::path(opts.source_dir) / f, to);
    }
}

std::vector<std::string> tokenizer_files(const std::string& source_dir) {
  std::vector<std::string> files;
  auto take = [&](const fs::path& dir, const std::string& prefix, bool templates_only) {
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      std::error_code ignored;
      if (name.ends_with(".tmp") || !e.is_regular_file(ignored)) continue;  // follows symbolic links
      const bool named = std::any_of(std::begin(kTokenizerFileNames), std::end(kTokenizerFileNames),
                                     [&](const char* n) { return name == n; });
      if (name.ends_with(".jinja") || (!templates_only && (name.starts_with("tokenizer") || named)))
        files.push_back(prefix + name);
    }
  };
  const fs::path src(source_dir);
  take(src, "", false);
  take(src / kChatTemplateDir, std::string(kChatTemplateDir) + "/", true);
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace strata::model
