#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string_view>

#include "core/error.h"
#include "core/log.h"
#include "model/rope_scaling_json.h"

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
    {"head_dim", "head_dim"},
    {"family", "model_type"},
    {"attention_bias", "attention_bias"},
    {"sliding_window", "sliding_window"},
    {"pad_token_id", "pad_token_id"},
};

// Note [Model families]'s table (model/config.h).
constexpr Family kFamilies[] = {
    // model_type, architecture, hidden_act, act, qkv_bias, bias_key, qk_norm, fused, norm_offset,
    // embed_scale, tied, hidden_act_alias, hidden_activation, window_key, longrope, mlp_bias_key,
    // dropout_keys, computed_by
    {"llama", "LlamaForCausalLM", "silu", MlpActivation::silu, false, true, false, false, 0.0f, false, false,
     nullptr, nullptr, WindowKey::none, false, true, false, "llama-decoder"},
    {"mistral", "MistralForCausalLM", "silu", MlpActivation::silu, false, false, false, false, 0.0f, false,
     false, nullptr, nullptr, WindowKey::sliding_window, false, false, false, "llama-decoder"},
    {"qwen2", "Qwen2ForCausalLM", "silu", MlpActivation::silu, true, false, false, false, 0.0f, false, false,
     nullptr, nullptr, WindowKey::use_sliding_window, false, false, false, "llama-decoder"},
    {"qwen3", "Qwen3ForCausalLM", "silu", MlpActivation::silu, false, true, true, false, 0.0f, false, false,
     nullptr, nullptr, WindowKey::use_sliding_window, false, false, false, "llama-decoder"},
    {"phi3", "Phi3ForCausalLM", "silu", MlpActivation::silu, false, false, false, true, 0.0f, false, false,
     nullptr, nullptr, WindowKey::sliding_window, true, false, true, "llama-decoder"},
    {"gemma", "GemmaForCausalLM", "gelu_pytorch_tanh", MlpActivation::gelu_tanh, false, true, false, false,
     1.0f, true, true, "gelu", "gelu_pytorch_tanh", WindowKey::none, false, false, false, "llama-decoder"},
};

// Hugging Face config.json keys that do not change what the decoder computes (pretraining_tp splits the
// projections into slices whose results are summed: the same products).
constexpr const char* kIgnoredHfKeys[] = {
    "torch_dtype",
    "dtype",
    "transformers_version",
    "bos_token_id",
    "eos_token_id",
    "initializer_range",
    "use_cache",
    "pretraining_tp",
    "_name_or_path",
    "max_sequence_length",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "tie_encoder_decoder",
    "use_return_dict",
    // The length longrope scaling switches at (Phi-3) and yarn's original length when its rope object has
    // none: read by those scalings (finish_longrope, finish_yarn), ignored otherwise.
    "original_max_position_embeddings",
};

// Hugging Face keys read for what they say about the computation: accepted with the value that means the
// plain Llama decoder, refused by name otherwise (check_architecture).
constexpr const char* kCheckedHfKeys[] = {
    "architectures",
    "hidden_act",
    "mlp_bias",
    "attention_dropout",
    "use_sliding_window",
    "max_window_layers",
    "layer_types",
    "num_local_experts",
    "num_experts",
    "num_experts_per_tok",
    "n_routed_experts",
    "rope_scaling",
    "rope_parameters",
    "partial_rotary_factor",
    "resid_pdrop",
    "embd_pdrop",
    "hidden_activation",
    "use_bidirectional_attention",
    "attn_logit_softcapping",
    "final_logit_softcapping",
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

bool is_zero(const json& v) {
  return v.is_number() && v == 0;
}

// Refuses, by name, every Hugging Face setting the family's decoder does not compute (Note [Model families]:
// no MLP biases, the family's activation, no dropout, causal attention (sliding windows: read_windows), one
// MLP per block, full rotary embeddings, no soft-capping). `fam` is the family config.json names
// (model_type), already checked.
void check_architecture(const json& j, const Family& fam, const std::string& where) {
  auto refuse = [&](const std::string& key, const std::string& why) {
    throw ConfigError(detail::cat(where, ": '", key, "' is ", j.at(key).dump(), ": ", why,
                                  "; Strata computes the families of docs/model.md (\"Model families\") "
                                  "as transformers does, without this setting"));
  };
  const std::string family = fam.model_type;
  if (j.contains("architectures")) {
    const json& a = j["architectures"];
    if (!a.is_array() || a.size() != 1 || a[0] != fam.architecture)
      refuse("architectures", detail::cat("a ", family, " model's architecture is ", fam.architecture));
  }
  if (j.contains("mlp_bias") && j["mlp_bias"] != false)
    refuse("mlp_bias", "the MLP projections have no biases");
  // An alias (Gemma's older "gelu", which transformers reads as the tanh approximation) is the same MLP.
  if (j.contains("hidden_act") && j["hidden_act"] != fam.hidden_act &&
      !(fam.hidden_act_alias && j["hidden_act"] == fam.hidden_act_alias))
    refuse("hidden_act", detail::cat("a ", family, " MLP is ", fam.hidden_act));
  if (j.contains("hidden_activation") && !j["hidden_activation"].is_null() &&
      !(fam.hidden_activation && j["hidden_activation"] == fam.hidden_activation))
    refuse("hidden_activation", "the MLP activation is hidden_act's");
  for (const char* k : {"attention_dropout", "resid_pdrop", "embd_pdrop"})
    if (j.contains(k) && !is_zero(j[k])) refuse(k, "dropout is not implemented (set it to 0.0)");
  for (const char* k : {"num_local_experts", "num_experts", "num_experts_per_tok", "n_routed_experts"})
    if (j.contains(k) && !j[k].is_null()) refuse(k, "mixture-of-experts MLPs are not implemented");
  if (j.contains("partial_rotary_factor") &&
      !(j["partial_rotary_factor"].is_number() && j["partial_rotary_factor"] == 1))
    refuse("partial_rotary_factor", "the rotary embedding covers the whole head here");
  if (j.contains("use_bidirectional_attention") && !j["use_bidirectional_attention"].is_null() &&
      j["use_bidirectional_attention"] != false)
    refuse("use_bidirectional_attention", "attention is causal here");
  for (const char* k : {"attn_logit_softcapping", "final_logit_softcapping"})
    if (j.contains(k) && !j[k].is_null()) refuse(k, "logit soft-capping is not implemented");
}

// Which layers attend in a sliding window (Note [Sliding windows] in config.h), from the keys transformers
// reads for `fam`; c.sliding_window holds the sliding_window key as read (0: absent or null) and c.n_layers
// the layer count. Refused, by name: a key the family does not read set to something other than "off", a
// window the family has no layers for, layer_types that disagree with the layer count or name a window
// that is not set.
void read_windows(const json& j, const Family& fam, ModelConfig& c, const std::string& where) {
  auto refuse = [&](const char* key, const std::string& why) {
    throw ConfigError(detail::cat(where, ": '", key, "' is ", j.at(key).dump(), ": ", why));
  };
  const std::string family = fam.model_type;
  const bool per_layer = fam.window_key == WindowKey::use_sliding_window;  // Qwen2, Qwen3
  if (j.contains("use_sliding_window") && !j["use_sliding_window"].is_null()) {
    const json& u = j["use_sliding_window"];
    if (!u.is_boolean()) refuse("use_sliding_window", "it must be true or false");
    if (per_layer)
      c.use_sliding_window = u.get<bool>();
    else if (u.get<bool>())
      refuse("use_sliding_window", detail::cat("a ", family, " model does not read it",
                                               fam.window_key == WindowKey::sliding_window
                                                   ? " (its sliding_window, when set, windows every layer)"
                                                   : " (its attention is never windowed)",
                                               "; remove it"));
  }
  if (per_layer && j.contains("max_window_layers") && !j["max_window_layers"].is_null()) {
    const json& m = j["max_window_layers"];
    if (!m.is_number_integer() || m.get<int64_t>() < 0)
      refuse("max_window_layers", "it must be a whole number of layers >= 0");
    c.max_window_layers = m.get<int64_t>();
  }
  if (per_layer && c.use_sliding_window && !j.contains("sliding_window"))
    throw ConfigError(detail::cat(where,
                                  ": use_sliding_window is true but 'sliding_window' is not given "
                                  "(transformers would take its default, 4096); write the window, or null "
                                  "for none"));
  // Qwen2Config: sliding_window if use_sliding_window else None.
  if (per_layer && !c.use_sliding_window) c.sliding_window = 0;
  if (fam.window_key == WindowKey::none && c.sliding_window > 0)
    throw ConfigError(detail::cat(where, ": 'sliding_window' is ", c.sliding_window, ": a ", family,
                                  " model attends over the whole causal window; remove the key"));
  if (!j.contains("layer_types") || j["layer_types"].is_null()) return;
  const json& lt = j["layer_types"];
  const auto is = [&](const char* type) {
    return std::all_of(lt.begin(), lt.end(),
                       [&](const json& t) { return t == "full_attention" || t == type; });
  };
  if (!per_layer) {
    // Mistral and Phi-3 window every layer or none (MistralConfig only warns of layer_types): a list that
    // says otherwise is refused, one that says "full_attention" throughout is read as the models read it.
    if (!lt.is_array() || !is("full_attention"))
      refuse("layer_types", detail::cat("a ", family, " model's layers all attend alike",
                                        fam.window_key == WindowKey::sliding_window
                                            ? " (sliding_window, when set, windows every layer)"
                                            : "",
                                        "; every entry must be \"full_attention\""));
    return;
  }
  if (!lt.is_array() || !is("sliding_attention"))
    refuse("layer_types", "each layer's attention must be \"full_attention\" or \"sliding_attention\"");
  if (int64_t(lt.size()) != c.n_layers)
    refuse("layer_types", detail::cat("it lists ", lt.size(), " layers; num_hidden_layers is ", c.n_layers));
  c.sliding_layers.clear();
  for (const json& t : lt) c.sliding_layers.push_back(t == "sliding_attention");
  if (c.sliding_window == 0 && std::count(c.sliding_layers.begin(), c.sliding_layers.end(), true) > 0)
    refuse("layer_types",
           "it names \"sliding_attention\" layers but no window is set (transformers cannot build their mask "
           "either): set use_sliding_window true and sliding_window, or make every layer \"full_attention\"");
}

// config.json's layer_types for per-layer windows (true: windowed).
json layer_type_names(const std::vector<bool>& sliding) {
  json names = json::array();
  for (bool s : sliding) names.push_back(s ? "sliding_attention" : "full_attention");
  return names;
}

// The shortest decimal that reads back as `f` (1e-05, not 9.999999747378752e-06).
double shortest(float f) {
  char buf[32];
  for (int p = 6; p <= 9; ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, double(f));
    if (std::strtof(buf, nullptr) == f) break;
  }
  return std::strtod(buf, nullptr);
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
// parameters, which the tests assert). tiny-<family> is tiny's shape in each other family (Qwen2 and Gemma
// tied, as their small checkpoints are).
// tiny's shape in another family (Note [Model families]): what tests and the fine-tuning journey run.
ModelConfig tiny_of(const char* name, const char* family, bool tied) {
  ModelConfig c = make(name, 256, 32, 2, 4, 2, 64, 64, tied);
  c.family = family;
  return c;
}

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
      tiny_of("tiny-mistral", "mistral", false),
      tiny_of("tiny-qwen2", "qwen2", true),
      tiny_of("tiny-qwen3", "qwen3", false),
      tiny_of("tiny-phi3", "phi3", false),
      tiny_of("tiny-gemma", "gemma", true),
  };
}

}  // namespace

int64_t ModelConfig::window_of(int64_t layer) const {
  if (sliding_window <= 0) return 0;
  switch (traits().window_key) {
    case WindowKey::sliding_window:
      return sliding_window;  // every layer
    case WindowKey::use_sliding_window:
      if (!use_sliding_window) return 0;
      if (!sliding_layers.empty())
        return layer >= 0 && layer < int64_t(sliding_layers.size()) && sliding_layers[size_t(layer)]
                   ? sliding_window
                   : 0;
      return layer >= max_window_layers ? sliding_window : 0;
    case WindowKey::none:
      break;
  }
  return 0;
}

void ModelConfig::validate(const std::string& where) const {
  const Family& fam = family_of(family, where);
  if (sliding_window < 0)
    throw ConfigError(
        detail::cat(where, ": sliding_window is ", sliding_window, "; it must be 0 (none) or more"));
  // What read_windows refuses in a JSON, for a config built in code.
  const bool per_layer = fam.window_key == WindowKey::use_sliding_window;
  if (sliding_window > 0 && (fam.window_key == WindowKey::none || (per_layer && !use_sliding_window)))
    throw ConfigError(detail::cat(where, ": sliding_window is ", sliding_window, ", which a ", family,
                                  per_layer ? " model reads only with use_sliding_window true"
                                            : " model does not read (its attention is never windowed)"));
  if ((use_sliding_window || !sliding_layers.empty()) && !per_layer)
    throw ConfigError(detail::cat(where, ": use_sliding_window and layer_types are Qwen2 and Qwen3 keys; a ",
                                  family, " model does not read them"));
  if (max_window_layers < 0)
    throw ConfigError(
        detail::cat(where, ": max_window_layers is ", max_window_layers, "; it must be 0 or more"));
  if (!sliding_layers.empty() && int64_t(sliding_layers.size()) != n_layers)
    throw ConfigError(
        detail::cat(where, ": layer_types lists ", sliding_layers.size(), " layers; n_layers is ", n_layers));
  if (sliding_window == 0 && std::count(sliding_layers.begin(), sliding_layers.end(), true) > 0)
    throw ConfigError(detail::cat(where,
                                  ": layer_types names sliding_attention layers but sliding_window is "
                                  "not set"));
  if (attention_bias && !traits().bias_key)
    throw ConfigError(
        detail::cat(where, ": attention_bias is true, which a ", family, " model does not read; remove it"));
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
  if (explicit_head_dim < 0)
    throw ConfigError(detail::cat(where, ": head_dim is ", explicit_head_dim, "; it must be at least 2"));
  if (explicit_head_dim == 0 && d_model % n_heads != 0)
    throw ConfigError(
        detail::cat(where, ": d_model ", d_model, " is not a multiple of n_heads ", n_heads,
                    "; change one so that head_dim = d_model / n_heads is whole, or set head_dim"));
  if (head_dim() % 2 != 0 || head_dim() < 2)
    throw ConfigError(detail::cat(where, ": head_dim ", head_dim(),
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
  int64_t extra = (qkv_bias() ? q_dim() + 2 * kv_dim() : 0) + (o_bias() ? d_model : 0) +
                  (traits().qk_norm ? 2 * head_dim() : 0);
  return attn + mlp + 2 * d_model + extra;
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
    auto in = [&](const auto& list) {
      return std::any_of(std::begin(list), std::end(list), [&](const char* k) { return key == k; });
    };
    bool ignored = in(kIgnoredHfKeys) || in(kCheckedHfKeys) || key == "lora";
    if (!known && !ignored)
      throw ConfigError(
          detail::cat(where, ": unknown key '", key, "'; did you mean '", nearest_key(key), "'?"));
  }
  ModelConfig c;
  c.n_kv_heads = -1;
  // The family first: it decides the defaults and what the other keys mean.
  static_assert(std::string_view(kKeys[12].ours) == "family");
  if (const json* f = lookup(j, kKeys[12], where)) {
    if (!f->is_string())
      throw ConfigError(detail::cat(where, ": '", j.contains("family") ? "family" : "model_type", "' is ",
                                    f->dump(), "; it must be a string naming the family"));
    c.family = f->get<std::string>();
  }
  const Family& fam = family_of(c.family, where);
  c.tie_embeddings = fam.tied_default;
  for (const Key& k : kKeys) {
    const json* v = lookup(j, k, where);
    std::string key = k.ours;
    if (!v) {
      bool optional = key == "name" || key == "n_kv_heads" || key == "tie_embeddings" ||
                      key == "rope_theta" || key == "norm_eps" || key == "head_dim" || key == "family" ||
                      key == "attention_bias" || key == "sliding_window" || key == "pad_token_id";
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
    } else if (key == "head_dim") {
      c.explicit_head_dim = v->is_null() ? 0 : get_int(*v, k.ours, where);
    } else if (key == "attention_bias") {
      if (!v->is_boolean())
        throw ConfigError(
            detail::cat(where, ": 'attention_bias' is ", v->dump(), "; it must be true or false"));
      // Families without the key (Qwen2's q, k, v biases are fixed) compute what transformers does: no
      // change.
      c.attention_bias = fam.bias_key && v->get<bool>();
    } else if (key == "sliding_window") {
      if (!v->is_null() && !(v->is_number_integer() && v->get<int64_t>() >= 1))
        throw ConfigError(detail::cat(where, ": 'sliding_window' is ", v->dump(),
                                      "; it must be null or a whole number of tokens >= 1"));
      c.sliding_window = v->is_null() ? 0 : v->get<int64_t>();
    } else if (key == "pad_token_id") {
      if (!v->is_null() && !v->is_number_integer())
        throw ConfigError(
            detail::cat(where, ": 'pad_token_id' is ", v->dump(), "; it must be null or a token id"));
      c.pad_token_id = v->is_null() ? -1 : v->get<int64_t>();
      // nn.Embedding's padding_idx: a negative one counts from the end of the vocabulary.
      if (c.pad_token_id < -1 || (c.pad_token_id == -1 && !v->is_null())) c.pad_token_id += c.vocab_size;
      if (c.pad_token_id < -1 || c.pad_token_id >= c.vocab_size)
        throw ConfigError(detail::cat(where, ": pad_token_id ", v->dump(), " is outside the vocabulary of ",
                                      c.vocab_size, " tokens; transformers cannot build this model either"));
    }
  }
  // Which layers are windowed (Note [Sliding windows]).
  const std::string family = c.family;
  read_windows(j, fam, c, where);
  if (fam.fused_projections && c.explicit_head_dim > 0 && c.n_heads > 0 &&
      !(c.d_model % c.n_heads == 0 && c.explicit_head_dim == c.d_model / c.n_heads))
    throw ConfigError(detail::cat(where, ": head_dim ", c.explicit_head_dim,
                                  " is not hidden_size / "
                                  "num_attention_heads, which a ",
                                  family, " model's head width always is"));
  if (c.n_kv_heads == -1) c.n_kv_heads = c.n_heads;
  // A head_dim that says what d_model / n_heads says is not an override (one spelling per shape).
  if (c.explicit_head_dim > 0 && c.n_heads > 0 && c.d_model % c.n_heads == 0 &&
      c.explicit_head_dim == c.d_model / c.n_heads)
    c.explicit_head_dim = 0;
  check_architecture(j, fam, where);
  if (j.contains("rope_scaling"))
    c.rope_scaling = parse_rope_scaling(j["rope_scaling"], where + ": rope_scaling", fam.longrope);
  if (j.contains("rope_parameters")) {
    // Newer transformers: {"rope_type", "rope_theta", scaling keys}; the same as the older top-level keys.
    const json& rp = j["rope_parameters"];
    const std::string at = where + ": rope_parameters";
    if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
      throw ConfigError(detail::cat(where, ": both 'rope_scaling' and 'rope_parameters' are set; keep one"));
    c.rope_scaling = parse_rope_scaling(rp, at, fam.longrope);
    if (rp.is_object() && rp.contains("rope_theta")) {
      const float theta = get_float(rp["rope_theta"], "rope_theta", at);
      if (j.contains("rope_theta") && get_float(j["rope_theta"], "rope_theta", where) != theta)
        throw ConfigError(detail::cat(where, ": rope_theta ", j["rope_theta"].dump(),
                                      " differs from rope_parameters.rope_theta ", rp["rope_theta"].dump()));
      c.rope_theta = theta;
    }
  }
  if (c.rope_scaling.type == "longrope" && c.n_heads > 0)
    finish_longrope(c.rope_scaling, j, c.max_seq_len, c.head_dim(), where + ": rope_scaling");
  if (c.rope_scaling.type == "yarn" && c.max_seq_len > 0)
    finish_yarn(c.rope_scaling, j, c.max_seq_len,
                where + (j.contains("rope_parameters") ? ": rope_parameters" : ": rope_scaling"));
  // The config says what it was trained at; Llama 3's scaled frequencies assume at least the original.
  if (c.rope_scaling.type == "llama3" && c.rope_scaling.original_max_position_embeddings > c.max_seq_len &&
      c.max_seq_len > 0)
    STRATA_LOG_WARN(where, ": max_position_embeddings ", c.max_seq_len,
                    " is below rope_scaling.original_max_position_embeddings ",
                    c.rope_scaling.original_max_position_embeddings);
  c.validate(where);
  if (j.contains("lora") && !j["lora"].is_null()) c.lora = lora_from_json(j["lora"], c, where);
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
  json j{{"name", name},
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
  if (explicit_head_dim > 0) j["head_dim"] = explicit_head_dim;
  if (!rope_scaling.is_default()) j["rope_scaling"] = rope_scaling_json(rope_scaling);
  // Llama's JSON stays as it was (configs saved before families compare equal).
  if (family != "llama") j["family"] = family;
  if (attention_bias) j["attention_bias"] = true;
  if (sliding_window > 0) j["sliding_window"] = sliding_window;
  // Qwen2/3's per-layer keys only where they window something: with use_sliding_window false they change
  // nothing, and a config saved before windows were computed compares equal (checkpoints' model config).
  if (use_sliding_window) {
    j["use_sliding_window"] = true;
    if (sliding_window == 0) j["sliding_window"] = nullptr;  // given as null (read_windows wants the key)
    j["max_window_layers"] = max_window_layers;
    if (!sliding_layers.empty()) j["layer_types"] = layer_type_names(sliding_layers);
  }
  if (pad_token_id >= 0) j["pad_token_id"] = pad_token_id;
  if (lora.active()) j["lora"] = lora_to_json(*this);
  return j;
}

json ModelConfig::to_hf_json() const {
  const Family& fam = traits();
  json j{{"architectures", {fam.architecture}},
         {"model_type", fam.model_type},
         {"vocab_size", vocab_size},
         {"hidden_size", d_model},
         {"intermediate_size", ffn_dim},
         {"num_hidden_layers", n_layers},
         {"num_attention_heads", n_heads},
         {"num_key_value_heads", n_kv_heads},
         {"max_position_embeddings", max_seq_len},
         {"rms_norm_eps", shortest(norm_eps)},
         {"rope_theta", shortest(rope_theta)},
         {"rope_scaling", rope_scaling_json(rope_scaling)},
         {"tie_word_embeddings", tie_embeddings},
         {"hidden_act", fam.hidden_act},
         {"attention_dropout", 0.0},
         {"initializer_range", 0.02},
         {"use_cache", true}};
  // Phi-3's head width is always hidden_size / heads (validated); the others read head_dim.
  if (!fam.fused_projections) j["head_dim"] = head_dim();
  if (fam.bias_key) j["attention_bias"] = attention_bias;
  if (fam.mlp_bias_key) j["mlp_bias"] = false;
  if (fam.window_key == WindowKey::sliding_window)
    j["sliding_window"] = sliding_window > 0 ? json(sliding_window) : json(nullptr);
  if (fam.window_key == WindowKey::use_sliding_window) {
    j["use_sliding_window"] = use_sliding_window;
    j["sliding_window"] = sliding_window > 0 ? json(sliding_window) : json(nullptr);
    j["max_window_layers"] = max_window_layers;
    if (!sliding_layers.empty()) j["layer_types"] = layer_type_names(sliding_layers);
  }
  if (fam.dropout_keys) j["resid_pdrop"] = 0.0, j["embd_pdrop"] = 0.0;
  if (rope_scaling.type == "longrope")
    j["original_max_position_embeddings"] = rope_scaling.original_max_position_embeddings;
  j["pad_token_id"] = pad_token_id >= 0 ? json(pad_token_id) : json(nullptr);
  return j;
}

const Family& family_of(const std::string& model_type, const std::string& where) {
  for (const Family& f : kFamilies)
    if (model_type == f.model_type) return f;
  std::string known;
  for (const std::string& n : family_names()) known += (known.empty() ? "" : ", ") + n;
  throw ConfigError(detail::cat(where, ": 'model_type' (family) is \"", model_type,
                                "\", not one Strata computes; the families are ", known,
                                " (docs/model.md, \"Model families\")"));
}

std::vector<std::string> family_names() {
  std::vector<std::string> names;
  for (const Family& f : kFamilies) names.push_back(f.model_type);
  return names;
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
