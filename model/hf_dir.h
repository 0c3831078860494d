// strata/model/hf_dir.h: Hugging Face model directories in and out — what `strata train --init-from`
// reads and what `--export DIR` / `strata export` write.
//
// Example:
//   strata::model::HfModel src = strata::model::open_hf_model("Llama-3.2-1B/");   // or a .safetensors file
//   strata::model::WeightsSource w(src.weights, strata::model::ModelLayout(src.config));
//   ...   // train, with w.read_chunk as the engine's initial parameters
//   strata::model::save_pretrained("out/", engine, strata::DType::bf16, {.source_dir = src.dir});
//
// In: a directory holding config.json and model.safetensors, or model.safetensors.index.json and its
// shards (transformers' save_pretrained layout); or one .safetensors file, whose model config is its
// "strata.model_config" metadata (Strata's own exports) or the config.json beside it. The config must be a
// Llama architecture (model/config.h says what is refused, by name).
//
// Out (save_pretrained): DIR/config.json (LlamaForCausalLM, torch_dtype the written dtype, the source's
// token ids), DIR/generation_config.json (the source's, else one naming the token ids), the weights as
// DIR/model.safetensors or, past max_shard_bytes, DIR/model-0000i-of-0000n.safetensors with
// DIR/model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map"}), as transformers shards
// them; and the source directory's tokenizer and chat template files copied along (tokenizer_files, below).
// Every file is written as NAME.tmp and renamed, so an interrupted export leaves no half-written file under
// its final name.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "model/chunk.h"
#include "model/config.h"

namespace strata::model {

struct HfModel {
  std::string dir;      // the directory holding it ("" for a lone file without a config.json beside it)
  std::string weights;  // a .safetensors file or a model.safetensors.index.json
  ModelConfig config;
};

// Resolves `path` (a model directory or a .safetensors file) and reads its config. ConfigError naming what
// was looked for when it is neither, and the key when the config is not one Strata trains.
HfModel open_hf_model(const std::string& path);

struct SavePretrainedOptions {
  // transformers' default max_shard_size, "5GB" (decimal). 0: one file whatever the size.
  std::uint64_t max_shard_bytes = 5'000'000'000ull;
  // A Hugging Face model directory whose tokenizer files, generation_config.json and token ids
  // (bos/eos/pad_token_id in its config.json) go along; "" for none.
  std::string source_dir;
};

// Writes `chunks`' parameters (ChunkProvider::read_params, chunk by chunk: one chunk in host memory at a
// time) as a model directory transformers' from_pretrained loads. Creates `dir` if needed.
void save_pretrained(const std::string& dir, ChunkProvider& chunks, DType dtype,
                     const SavePretrainedOptions& opts = {});

// The files of a source directory that an export copies along (save_pretrained with source_dir, so
// `strata train --export`, `strata export --tokenizer-from` and Python's engine.export alike): every file
// the tokenizer and its chat templates are read from, whichever exist, as paths relative to `source_dir`,
// sorted. That is every regular file (a symbolic link to one counts, as in a Hugging Face cache snapshot)
//   - whose name starts with "tokenizer" (tokenizer.json, tokenizer_config.json, tokenizer.model, ...),
//   - whose name ends with ".jinja" (transformers 5 saves a chat template as chat_template.jinja), and
//     additional_chat_templates/NAME.jinja (transformers 5's further named templates),
//   - named in kTokenizerFileNames (the older files transformers still reads).
// A name ending in ".tmp" (a file being written) never is. generation_config.json goes along too, but by
// save_pretrained's own rule (copied when the source has one, else written from the token ids).
inline constexpr const char* kTokenizerFileNames[] = {
    "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "chat_template.json"};
inline constexpr const char* kChatTemplateDir = "additional_chat_templates";
std::vector<std::string> tokenizer_files(const std::string& source_dir);

}  // namespace strata::model
