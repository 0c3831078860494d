// strata/model/config.h: the sizes of a Llama-style decoder, from a model JSON or a named preset.
//
// Example:
//   auto cfg = strata::model::ModelConfig::preset("llama2-7b");
//   auto own = strata::model::ModelConfig::from_file("configs/models/tiny.json");
//   std::printf("%s: %lld parameters\n", cfg.name.c_str(), (long long)cfg.num_parameters());
//
// Keys (our names; the Hugging Face config.json names in brackets are accepted too, so a checkpoint's own
// config.json loads unchanged):
//   vocab_size      [vocab_size]               tokens in the vocabulary, >= 1
//   d_model         [hidden_size]              width of the residual stream, a multiple of n_heads
//   n_layers        [num_hidden_layers]        transformer blocks, >= 1
//   n_heads         [num_attention_heads]      query heads; head_dim = d_model / n_heads, even (rotary)
//   n_kv_heads      [num_key_value_heads]      key/value heads (grouped-query attention); divides n_heads;
//                                              default n_heads
//   ffn_dim         [intermediate_size]        SwiGLU hidden width, >= 1
//   max_seq_len     [max_position_embeddings]  longest sequence the model is run on, >= 1
//   tie_embeddings  [tie_word_embeddings]      the LM head reuses the token embedding; default false
//   rope_theta      [rope_theta]               rotary base, > 0; default 10000
//   norm_eps        [rms_norm_eps]             RMSNorm epsilon, > 0; default 1e-5
//   head_dim        [head_dim]                 width of a head, even; default d_model / n_heads
//   rope_scaling    [rope_scaling]             null / {"rope_type": "default"} or Llama 3's
//                                              {"rope_type": "llama3", "factor", "low_freq_factor",
//                                              "high_freq_factor", "original_max_position_embeddings"}
//   name                                       label only; default "custom"
// Hugging Face's newer form, "rope_parameters": {"rope_type", "rope_theta", and the scaling keys}, is read
// as rope_theta + rope_scaling. Unknown keys are errors naming the nearest known key. Hugging Face
// bookkeeping keys that do not change the computation (torch_dtype, bos_token_id, use_cache, ...) are
// ignored; keys that describe something this decoder does not compute are refused by name unless they hold
// the value that means "off": attention_bias / mlp_bias true, hidden_act other than "silu", a non-zero
// attention_dropout, a sliding_window, mixture-of-experts keys, a model_type other than "llama", rope
// scaling other than "default" and "llama3", partial_rotary_factor below 1.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace strata::model {

// Rotary embedding frequency scaling (Hugging Face's rope_scaling). "default": none; "llama3": Llama 3.1's
// (model/rope.h has the formula).
struct RopeScaling {
  std::string type = "default";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  bool is_default() const { return type == "default"; }
};

struct ModelConfig {
  std::string name = "custom";
  int64_t vocab_size = 0;
  int64_t d_model = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t ffn_dim = 0;
  int64_t max_seq_len = 0;
  bool tie_embeddings = false;
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  int64_t explicit_head_dim = 0;  // 0: d_model / n_heads (Hugging Face's head_dim when a config sets it)
  RopeScaling rope_scaling;

  int64_t head_dim() const { return explicit_head_dim > 0 ? explicit_head_dim : d_model / n_heads; }
  int64_t q_dim() const { return n_heads * head_dim(); }      // width of the query projection
  int64_t kv_dim() const { return n_kv_heads * head_dim(); }  // width of each of the k, v projections

  // Throws ConfigError naming the field, its value and what is allowed. `where` prefixes the message
  // (a file name or "preset tiny").
  void validate(const std::string& where = "model config") const;

  // Exact parameter count (embedding, blocks, final norm, and the head unless tied); no padding.
  int64_t num_parameters() const;
  int64_t block_parameters() const;  // one transformer block

  // Parses and validates. `where` names the source in error messages.
  static ModelConfig from_json(const nlohmann::json& j, const std::string& where = "model config");
  static ModelConfig from_file(const std::string& path);
  // Our key names (not Hugging Face's); from_json(to_json()) round-trips.
  nlohmann::json to_json() const;
  // A Hugging Face LlamaForCausalLM config.json for these sizes (what `transformers` loads); from_json reads
  // it back to the same config.
  nlohmann::json to_hf_json() const;

  // Named shapes: tiny (tests), 10m, 125m, 350m, 1b, 3b, llama2-7b, llama2-13b. Unknown names throw
  // ConfigError listing the known ones.
  static ModelConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();
};

bool operator==(const ModelConfig& a, const ModelConfig& b);

}  // namespace strata::model
