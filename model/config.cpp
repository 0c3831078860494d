#include "model/config.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace strata::model {
namespace {

using json = nlohmann::json;

// Our key and its Hugging Face alias ("" when none).
struct Key {
  const char* ours;
  const char* hf;
};
constexpr Key kKeys[] = {
    {"name", ""},
    {"vocab_size", "vocab_size"},
    {"d_model", "hidden_size"},
    {"n_layers", "num_hidden_layers"},
    {"n_heads", "num_attention_heads"},
    {"n_kv_heads", "num_key_value_heads"},
    {"ffn_dim", "intermediate_size"},
    {"max_seq_len", "max_position_embeddings"},
    {"tie_embeddings", "tie_word_embeddings"},
    {"rope_theta", "rope_theta"},
    {"norm_eps", "rms_norm_eps"},
};

// Hugging Face config.json keys that carry no shape information for this decoder.
constexpr const char* kIgnoredHfKeys[] = {
    "architectures",        "model_type",        "torch_dtype",
    "transformers_version", "bos_token_id",      "eos_token_id",
    "pad_token_id",         "initializer_range", "use_cache",
    "pretraining_tp",       "hidden_act",        "attention_bias",
    "attention_dropout",    "mlp_bias",          "head_dim",
    "rope_scaling",         "_name_or_path",     "max_sequence_length",
};

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string nearest_key(const std::string& key) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const Key& k : kKeys) {
    for (const char* cand : {k.ours, k.hf}) {
      if (*cand == '\0') continue;
      size_t d = edit_distance(key, cand);
      if (d < best_d) best_d = d, best = cand;
    }
  }
  return best;
}

// Finds `k` under our name or its Hugging Face alias; both present is an error.
const json* lookup(const json& j, const Key& k, const std::string& where) {
  const json* ours = j.contains(k.ours) ? &j.at(k.ours) : nullptr;
  const json* hf = (*k.hf && std::string(k.hf) != k.ours && j.contains(k.hf)) ? &j.at(k.hf) : nullptr;
  if (ours && hf)
    throw ConfigError(detail::cat(where, ": both '", k.ours, "' and its Hugging Face alias '", k.hf,
                                  "' are set; keep one"));
  return ours ? ours : hf;
}

int64_t get_int(const json& v, const char* key, const std::string& where) {
  if (!v.is_number_integer())
    throw ConfigError(detail::cat(where, ": '", key, "' is ", v.dump(), "; it must be an integer"));
  return v.get<int64_t>();
}

float get_float(const json& v, const char* key, const std::string& where) {
  if (!v.is_number())
    throw ConfigError(detail::cat(where, ": '", key, "' is ", v.dump(), "; it must be a number"));
  return v.get<float>();
}

ModelConfig make(const char* name, int64_t vocab, int64_t d, int64_t layers, int64_t heads, int64_t kv,
                 int64_t ffn, int64_t seq, bool tied) {
  ModelConfig c;
  c.name = name;
  c.vocab_size = vocab;
  c.d_model = d;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = kv;
  c.ffn_dim = ffn;
  c.max_seq_len = seq;
  c.tie_embeddings = tied;
  return c;
}

// Note [Presets]: tiny runs a training step in well under a millisecond (tests). 10m is a byte-level
// model (vocab 256) of nanoGPT's character-level size. 125m/350m follow GPT-3's widths and depths with
// Llama blocks and the Llama-2 vocabulary, tied. 1b is TinyLlama-1.1B's shape (GQA 32/4), 3b a
// Llama-style 3.0B with GQA 24/8. llama2-7b/13b are Meta's shapes (6,738,415,616 and 13,015,864,320
// parameters, which the tests assert).
std::vector<ModelConfig> presets() {
  return {
      make("tiny", 256, 32, 2, 4, 2, 64, 64, false),
      make("10m", 256, 384, 6, 6, 6, 1024, 256, false),
      make("125m", 32000, 768, 12, 12, 12, 2560, 2048, true),
      make("350m", 32000, 1024, 24, 16, 16, 2816, 2048, true),
      make("1b", 32000, 2048, 22, 32, 4, 5632, 2048, false),
      make("3b", 32000, 3072, 28, 24, 8, 8192, 4096, false),
      make("llama2-7b", 32000, 4096, 32, 32, 32, 11008, 4096, false),
      make("llama2-13b", 32000, 5120, 40, 40, 40, 13824, 4096, false),
  };
}

}  // namespace

void ModelConfig::validate(const std::string& where) const {
  auto positive = [&](const char* key, int64_t v) {
    if (v < 1) throw ConfigError(detail::cat(where, ": ", key, " is ", v, "; it must be at least 1"));
  };
  positive("vocab_size", vocab_size);
  positive("d_model", d_model);
  positive("n_layers", n_layers);
  positive("n_heads", n_heads);
  positive("n_kv_heads", n_kv_heads);
  positive("ffn_dim", ffn_dim);
  positive("max_seq_len", max_seq_len);
  if (d_model % n_heads != 0)
    throw ConfigError(detail::cat(where, ": d_model ", d_model, " is not a multiple of n_heads ", n_heads,
                                  "; change one so that head_dim = d_model / n_heads is whole"));
  if (head_dim() % 2 != 0)
    throw ConfigError(detail::cat(where, ": head_dim = d_model / n_heads = ", head_dim(),
                                  " is odd; rotary embeddings rotate pairs, so it must be even"));
  if (n_heads % n_kv_heads != 0)
    throw ConfigError(detail::cat(where, ": n_kv_heads ", n_kv_heads, " does not divide n_heads ", n_heads,
                                  "; grouped-query attention shares each kv head among a whole group"));
  if (vocab_size > (int64_t{1} << 31) - 1)
    throw ConfigError(detail::cat(where, ": vocab_size ", vocab_size, " does not fit a 32-bit token id"));
  if (!(rope_theta > 0.0f))
    throw ConfigError(detail::cat(where, ": rope_theta is ", rope_theta, "; it must be positive"));
  if (!(norm_eps > 0.0f))
    throw ConfigError(detail::cat(where, ": norm_eps is ", norm_eps, "; it must be positive"));
}

int64_t ModelConfig::block_parameters() const {
  int64_t attn = d_model * q_dim() + 2 * d_model * kv_dim() + q_dim() * d_model;
  int64_t mlp = 3 * d_model * ffn_dim;
  return attn + mlp + 2 * d_model;
}

int64_t ModelConfig::num_parameters() const {
  int64_t embed = vocab_size * d_model;
  return embed + n_layers * block_parameters() + d_model + (tie_embeddings ? 0 : embed);
}

ModelConfig ModelConfig::from_json(const json& j, const std::string& where) {
  if (!j.is_object()) throw ConfigError(detail::cat(where, ": expected a JSON object, got ", j.dump()));
  for (const auto& item : j.items()) {
    const std::string& key = item.key();  // not a structured binding: clang < 16 cannot capture those
    bool known = std::any_of(std::begin(kKeys), std::end(kKeys),
                             [&](const Key& k) { return key == k.ours || key == k.hf; });
    bool ignored = std::any_of(std::begin(kIgnoredHfKeys), std::end(kIgnoredHfKeys),
                               [&](const char* k) { return key == k; });
    if (!known && !ignored)
      throw ConfigError(
          detail::cat(where, ": unknown key '", key, "'; did you mean '", nearest_key(key), "'?"));
  }
  ModelConfig c;
  c.n_kv_heads = -1;
  for (const Key& k : kKeys) {
    const json* v = lookup(j, k, where);
    std::string key = k.ours;
    if (!v) {
      bool optional = key == "name" || key == "n_kv_heads" || key == "tie_embeddings" ||
                      key == "rope_theta" || key == "norm_eps";
      if (!optional)
        throw ConfigError(detail::cat(where, ": missing required key '", key, "'",
                                      *k.hf ? detail::cat(" (or '", k.hf, "')") : std::string()));
      continue;
    }
    if (key == "name") {
      if (!v->is_string()) throw ConfigError(detail::cat(where, ": 'name' must be a string"));
      c.name = v->get<std::string>();
    } else if (key == "vocab_size") {
      c.vocab_size = get_int(*v, k.ours, where);
    } else if (key == "d_model") {
      c.d_model = get_int(*v, k.ours, where);
    } else if (key == "n_layers") {
      c.n_layers = get_int(*v, k.ours, where);
    } else if (key == "n_heads") {
      c.n_heads = get_int(*v, k.ours, where);
    } else if (key == "n_kv_heads") {
      c.n_kv_heads = get_int(*v, k.ours, where);
    } else if (key == "ffn_dim") {
      c.ffn_dim = get_int(*v, k.ours, where);
    } else if (key == "max_seq_len") {
      c.max_seq_len = get_int(*v, k.ours, where);
    } else if (key == "tie_embeddings") {
      if (!v->is_boolean())
        throw ConfigError(
            detail::cat(where, ": 'tie_embeddings' is ", v->dump(), "; it must be true or false"));
      c.tie_embeddings = v->get<bool>();
    } else if (key == "rope_theta") {
      c.rope_theta = get_float(*v, k.ours, where);
    } else if (key == "norm_eps") {
      c.norm_eps = get_float(*v, k.ours, where);
    }
  }
  if (c.n_kv_heads == -1) c.n_kv_heads = c.n_heads;
  c.validate(where);
  return c;
}

ModelConfig ModelConfig::from_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(detail::cat("model config ", path, ": cannot open the file"));
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for 1e999
    throw ConfigError(detail::cat("model config ", path, ": not valid JSON: ", e.what()));
  }
  return from_json(j, path);
}

json ModelConfig::to_json() const {
  return json{{"name", name},
              {"vocab_size", vocab_size},
              {"d_model", d_model},
              {"n_layers", n_layers},
              {"n_heads", n_heads},
              {"n_kv_heads", n_kv_heads},
              {"ffn_dim", ffn_dim},
              {"max_seq_len", max_seq_len},
              {"tie_embeddings", tie_embeddings},
              {"rope_theta", rope_theta},
              {"norm_eps", norm_eps}};
}

ModelConfig ModelConfig::preset(const std::string& name) {
  for (const ModelConfig& c : presets())
    if (c.name == name) return c;
  std::string known;
  for (const std::string& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw ConfigError(detail::cat("model preset '", name, "' is not known; the presets are ", known,
                                " (or give a model JSON file)"));
}

std::vector<std::string> ModelConfig::preset_names() {
  std::vector<std::string> names;
  for (const ModelConfig& c : presets()) names.push_back(c.name);
  return names;
}

bool operator==(const ModelConfig& a, const ModelConfig& b) {
  return a.to_json() == b.to_json();
}

}  // namespace strata::model
