// strata/model/config.h: a decoder's family and sizes, from a model JSON, a Hugging Face config.json or a
// named preset.
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
//   rope_scaling    [rope_scaling]             null / {"rope_type": "default"}, {"rope_type": "linear",
//                                              "factor"}, Llama 3's {"rope_type": "llama3", "factor",
//                                              "low_freq_factor", "high_freq_factor",
//                                              "original_max_position_embeddings"}, YaRN's {"rope_type":
//                                              "yarn", "factor", and optionally
//                                              "original_max_position_embeddings", "beta_fast", "beta_slow",
//                                              "mscale", "mscale_all_dim", "attention_factor", "truncate"},
//                                              or Phi-3's {"rope_type": "longrope", "short_factor",
//                                              "long_factor"} (RopeScaling)
//   family          [model_type]               llama (default), mistral, qwen2, qwen3, phi3, gemma
//                                              (Note [Model families] below)
//   attention_bias  [attention_bias]           bias on the q, k, v and o projections (llama, mistral,
//                                              qwen3, gemma); default false. Qwen2 has q, k, v biases always
//   sliding_window  [sliding_window]           null (default) or the window w >= 1 of the windowed layers:
//                                              there position i sees j only when i - w < j <= i (Note
//                                              [Sliding windows] says which layers; Mistral, Phi-3: all)
//   use_sliding_window [use_sliding_window]    Qwen2, Qwen3: whether any layer is windowed; default false
//   max_window_layers [max_window_layers]      Qwen2, Qwen3: the layers from this index on are windowed
//                                              (when layer_types is not given); default 28
//   layer_types     [layer_types]              Qwen2, Qwen3: one "full_attention" or "sliding_attention" per
//                                              layer; absent: from max_window_layers
//   pad_token_id    [pad_token_id]             null (default) or the token whose embedding row the lookup
//                                              never trains (transformers' padding_idx)
//   name                                       label only; default "custom"
// Hugging Face's newer form, "rope_parameters": {"rope_type", "rope_theta", and the scaling keys}, is read
// as rope_theta + rope_scaling. Unknown keys are errors naming the nearest known key. Hugging Face
// bookkeeping keys that do not change the computation (torch_dtype, bos_token_id, use_cache, ...) are
// ignored; keys that describe something these decoders do not compute are refused by name unless they hold
// the value that means "off": mlp_bias true, a hidden_act other than the family's, a non-zero dropout
// (attention_dropout, resid_pdrop, embd_pdrop), a window a family does not read (sliding_window on Llama and
// Gemma, use_sliding_window true or "sliding_attention" layer_types outside Qwen2 and Qwen3, other layer
// types anywhere), mixture-of-experts keys, a model_type outside the families, rope scaling
// other than "default", "linear", "llama3", "yarn" and "longrope" (a phi3 config: other than "default" and
// "longrope", as transformers' Phi3Config), partial_rotary_factor below 1, logit soft-capping.
//
// Note [Model families]: one decoder computes every family; a family is a row of differences from Llama
// (kFamilies in config.cpp), never a copy of the decoder:
//   family   class               differences from Llama
//   llama    LlamaForCausalLM    -
//   mistral  MistralForCausalLM  sliding_window on every layer (Note [Sliding windows])
//   qwen2    Qwen2ForCausalLM    bias on q, k, v (always); sliding_window on some layers (Note [Sliding
//                                windows])
//   qwen3    Qwen3ForCausalLM    RMSNorm over each head of q and k (q_norm, k_norm) before rope
//   phi3     Phi3ForCausalLM     q, k, v stored fused as qkv_proj, gate and up as gate_up_proj
//   gemma    GemmaForCausalLM    RMSNorm scales by (1 + w); embeddings times sqrt(hidden); GELU-tanh MLP
// (Qwen3 and Phi-3 window their layers as Qwen2 and Mistral do.)
//
// Note [Sliding windows]: which layers attend in a sliding window, and how wide, as transformers 5 decides
// (configuration_<family>.py, masking_utils.py): in a windowed layer query t attends to keys
// t - w < s <= t, the w latest positions itself included (sliding_window_overlay and-ed with the causal
// mask), w = sliding_window; the attention ops take it as their `window` (kernels/ops.h), window_of(layer).
//   mistral, phi3  every layer when sliding_window is set (null: none); layer_types is not read by their
//                  models (MistralConfig only warns of it), so it is accepted only all "full_attention".
//   qwen2, qwen3   only with use_sliding_window true (false: sliding_window is dropped, as their configs set
//                  it to None; true without the key is refused, transformers' default 4096 being a guess).
//                  Then layer_types says which layers are "sliding_attention"; without it, the layers from
//                  max_window_layers on (default 28, as transformers'). A "sliding_attention" layer without a
//                  window is refused (transformers cannot build its mask).
//   llama, gemma   never: sliding_window above 0, use_sliding_window true, sliding layers are refused.
// A window no shorter than the sequence is plain causal attention. Every sequence length up to max_seq_len
// is computed. to_hf_json writes these keys back as read (layer_types only when given); to_json too, but
// Qwen2/3's use_sliding_window, max_window_layers and layer_types only with use_sliding_window true (false:
// they change nothing, and configs saved before, e.g. in checkpoints, still compare equal).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/lora.h"

namespace strata::model {

// Rotary embedding frequency scaling (Hugging Face's rope_scaling). "default": none; "linear": every
// frequency divided by factor; "llama3": Llama 3.1's; "yarn": YaRN's; "longrope": Phi-3's (the older "su"
// reads as it); model/rope.h has the formulas.
struct RopeScaling {
  std::string type = "default";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  // longrope: one factor per frequency (head_dim / 2), the short ones for sequences up to
  // original_max_position_embeddings, the long ones past it; cos and sin are multiplied by
  // attention_factor (given, or transformers' default from factor, itself max_position_embeddings /
  // original_max_position_embeddings unless given). `given` keeps which of factor / attention_factor the
  // config set, so that it is written back as read.
  std::vector<double> short_factor, long_factor;
  double attention_factor = 1.0;
  bool factor_given = false, attention_factor_given = false;
  // yarn (transformers' _compute_yarn_parameters): factor is required, null meaning max_position_embeddings
  // / original_max_position_embeddings (factor_given false); original_max_position_embeddings is the
  // object's, else the top-level key's, else max_position_embeddings; cos and sin are multiplied by
  // attention_factor (given, or 0.1 · ln(factor) + 1, or with mscale and mscale_all_dim both non-zero
  // (0.1 · mscale · ln(factor) + 1) / (0.1 · mscale_all_dim · ln(factor) + 1); 1 when factor <= 1). The
  // optional keys are kept as read (std::nullopt: absent or null, and not written back):
  //   beta_fast, beta_slow  rotations in the original context that bound the ramp between unscaled and
  //                         scaled frequencies, >= 0; absent or 0: 32 and 1 (transformers' `or`)
  //   mscale, mscale_all_dim  the default attention factor's scales (above)
  //   truncate              round the ramp's ends to whole dimensions (floor, ceil); absent: true
  std::optional<double> beta_fast, beta_slow, mscale, mscale_all_dim;
  std::optional<bool> truncate;
  bool is_default() const { return type == "default"; }
};

enum class MlpActivation { silu, gelu_tanh };

// Which config.json keys window a family's attention (Note [Sliding windows]).
enum class WindowKey {
  none,               // no window: a sliding_window above 0 is refused (Llama, Gemma)
  sliding_window,     // sliding_window on every layer, null for none (Mistral, Phi-3)
  use_sliding_window  // sliding_window only with use_sliding_window true, on the layers layer_types or
                      // max_window_layers names (Qwen2/3)
};

// One family's row (Note [Model families]).
struct Family {
  const char* model_type;    // config.json's model_type: "qwen2"
  const char* architecture;  // its class: "Qwen2ForCausalLM"
  const char* hidden_act;    // config.json's hidden_act for its MLP
  MlpActivation act;
  bool qkv_bias;           // q, k, v projections have a bias whatever attention_bias says (Qwen2)
  bool bias_key;           // config.json's attention_bias adds a bias to q, k, v and o
  bool qk_norm;            // RMSNorm over each head of q and k before rope (q_norm, k_norm)
  bool fused_projections;  // checkpoints store qkv_proj and gate_up_proj (Phi-3)
  float norm_offset;       // RMSNorm multiplies by (w + norm_offset): 1 for Gemma, else 0
  bool embed_scale;        // embeddings times sqrt(hidden), rounded to the activation dtype (Gemma)
  bool tied_default;       // tie_word_embeddings when config.json does not say
  // config.json's other spellings of the activation that mean `act`: an older hidden_act (Gemma's "gelu",
  // which transformers reads as the tanh approximation) and a hidden_activation key; nullptr: none.
  const char* hidden_act_alias;
  const char* hidden_activation;
  WindowKey window_key;
  bool longrope;      // rope_scaling may be Phi-3's longrope (or "su")
  bool mlp_bias_key;  // config.json has mlp_bias (written false)
  bool dropout_keys;  // config.json has resid_pdrop and embd_pdrop (written 0)
  // The architecture that computes it (model/architecture.h, Architecture::name): "llama-decoder" for every
  // family today, each being the Llama-style decoder with the options above.
  const char* computed_by;
};

// The family named `model_type`; ConfigError listing the families for another.
const Family& family_of(const std::string& model_type, const std::string& where = "model config");
std::vector<std::string> family_names();

struct ModelConfig {
  static constexpr int64_t kDefaultMaxWindowLayers = 28;  // transformers' Qwen2Config / Qwen3Config
  std::string name = "custom";
  std::string family = "llama";  // a Family's model_type
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
  bool attention_bias = false;  // q, k, v and o biases (families with Family::bias_key)
  // Note [Sliding windows]: the window of the windowed layers (0: none), and for Qwen2/3 which layers are:
  // use_sliding_window, max_window_layers and layer_types (sliding_layers, true for "sliding_attention";
  // empty when config.json has none), kept as read so that they are written back. window_of() is the
  // answer.
  int64_t sliding_window = 0;
  bool use_sliding_window = false;
  int64_t max_window_layers = kDefaultMaxWindowLayers;
  std::vector<bool> sliding_layers;
  // The embedding row transformers builds as nn.Embedding's padding_idx, whose gradient from the embedding
  // lookup is zero (-1: none). config.json's negative ids count from the vocabulary's end, as PyTorch's.
  int64_t pad_token_id = -1;
  // LoRA adapters on this base (model/lora.h); none unless a session asks for them. Part of the model's
  // shape: it adds chunks to the layout and a "lora" key to to_json (never to to_hf_json).
  LoraSpec lora;

  const Family& traits() const { return family_of(family); }
  bool qkv_bias() const { return traits().qkv_bias || attention_bias; }
  bool o_bias() const { return attention_bias; }
  // The sliding window layer `layer` attends in (kernels/ops.h's `window`; 0: plain causal attention).
  int64_t window_of(int64_t layer) const;

  int64_t head_dim() const { return explicit_head_dim > 0 ? explicit_head_dim : d_model / n_heads; }
  int64_t q_dim() const { return n_heads * head_dim(); }      // width of the query projection
  int64_t kv_dim() const { return n_kv_heads * head_dim(); }  // width of each of the k, v projections

  // Throws ConfigError naming the field, its value and what is allowed. `where` prefixes the message
  // (a file name or "preset tiny").
  void validate(const std::string& where = "model config") const;

  // Exact parameter count (embedding, blocks, final norm, and the head unless tied); no padding. The base's:
  // adapters are counted by lora_parameters (model/lora.h).
  int64_t num_parameters() const;
  int64_t block_parameters() const;  // one transformer block

  // Parses and validates. `where` names the source in error messages.
  static ModelConfig from_json(const nlohmann::json& j, const std::string& where = "model config");
  static ModelConfig from_file(const std::string& path);
  // Our key names (not Hugging Face's); from_json(to_json()) round-trips.
  nlohmann::json to_json() const;
  // A Hugging Face config.json for this family and these sizes (what `transformers` loads as the family's
  // class); from_json reads it back to the same config.
  nlohmann::json to_hf_json() const;

  // Named shapes: tiny (tests), 10m, 125m, 350m, 1b, 3b, llama2-7b, llama2-13b. Unknown names throw
  // ConfigError listing the known ones.
  static ModelConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();
};

bool operator==(const ModelConfig& a, const ModelConfig& b);

}  // namespace strata::model
