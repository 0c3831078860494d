// strata/model/safetensors.h: Hugging Face safetensors files — generic reader/writer and the model's
// weights under Llama tensor names.
//
// Example:
//   strata::model::save_weights("out/model.safetensors", chunks, strata::DType::bf16);
//   strata::model::load_weights("llama-2-7b/model.safetensors", chunks);   // InMemoryChunks
//   // or, for an engine that owns the storage, chunk by chunk:
//   strata::model::load_weights(path, layout, [&](int chunk, const float* data) { engine.set(chunk, data);
//   });
//
// Format: 8-byte little-endian header length N, N bytes of JSON {"name": {"dtype", "shape",
// "data_offsets": [begin, end]}, ..., "__metadata__": {string: string}}, then the data section, offsets
// relative to its start. The writer packs tensors back to back in declaration order, pads the header with
// spaces to a multiple of 8 bytes, and writes {"format": "pt"} into the metadata, as Hugging Face's own
// writer does. Dtypes F32, BF16, F16 are read and written; a file may hold others (they are listed, and
// reading one as fp32 is an error naming it).
//
// Note [Sharded checkpoints]: Hugging Face splits large models over model-0000i-of-0000n.safetensors with
// a model.safetensors.index.json. load_weights accepts that index file as `path` and reads every shard
// it names.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/chunk.h"
#include "model/dtype.h"

namespace strata::model {

struct SafetensorsEntry {
  std::string name;
  std::string dtype_name;     // as written in the file ("F32", "BF16", "I64", ...)
  bool dtype_known = false;   // F32, BF16 or F16 (parse_safetensors_dtype)
  DType dtype = DType::fp32;  // valid when dtype_known
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range inside the data section
  size_t numel() const;
};

// Opens and validates a file through a read-only map: header length within the file, every entry's
// dtype/shape/offsets consistent, offsets inside the data section. Throws IoError / ConfigError naming the
// path and the entry at fault.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* find(std::string_view name) const;  // nullptr when absent
  const void* data(const SafetensorsEntry& e) const { return data_ + e.begin; }

  // Converts tensor `name` to fp32 into dst (numel floats). A missing tensor, a shape other than
  // `expected_shape`, or an unsupported dtype throws ConfigError naming the tensor, the file, both shapes
  // and `context` (what the model wanted it for).
  void read_f32(std::string_view name, std::span<const int64_t> expected_shape, float* dst,
                std::string_view context = {}) const;

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const unsigned char* data_ = nullptr;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Streams a file: the header is written from the declared entries up front, then write() is called
// once per entry in declaration order. Written to path + ".tmp", renamed by finish(); a writer destroyed
// without finish(), or whose create / write / rename fails, removes the temporary file. A failed system
// call on the file (a directory that is read-only or missing, a full disk) throws IoError naming the path,
// the errno text and what to do.
class SafetensorsWriter {
 public:
  struct Decl {
    std::string name;
    DType dtype = DType::fp32;  // fp32, bf16 or fp16
    std::vector<int64_t> shape;
  };
  SafetensorsWriter(const std::string& path, std::vector<Decl> decls,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Converts numel floats to the declared dtype and appends them. Throws strata::Error when `name` is
  // not the next declared entry.
  void write_f32(std::string_view name, const float* src);
  void finish();

 private:
  void put(const void* data, size_t bytes);
  std::string path_, tmp_;
  std::vector<Decl> decls_;
  size_t next_ = 0;
  int fd_ = -1;
};

// Writes every tensor of every chunk (acquire → convert → release, in chunk order) under its Hugging Face
// name. `metadata` is added to {"format": "pt"}; the model config goes in as "strata.model_config".
void save_weights(const std::string& path, ChunkProvider& chunks, DType dtype,
                  const std::map<std::string, std::string>& metadata = {});

// The weights of `layout` in a .safetensors file or the shards a Hugging Face
// model.safetensors.index.json names (memory-mapped: reading a chunk touches only its tensors' bytes).
// Opening checks that every tensor the model needs is there with its shape; read_chunk converts one
// chunk's tensors (F32, BF16 or F16) into a zero-padded fp32 buffer of padded_numel floats, in any order.
// Errors are ConfigErrors naming the tensor, the file and both shapes; shard files the index lists but
// the directory lacks (an interrupted download) are one ConfigError naming them all and the index, before
// any is opened.
class WeightsSource {
 public:
  WeightsSource(const std::string& path, const ModelLayout& layout);
  ~WeightsSource();
  WeightsSource(const WeightsSource&) = delete;
  WeightsSource& operator=(const WeightsSource&) = delete;

  void read_chunk(int chunk_id, float* out /*(padded_numel) fp32*/) const;
  // The same for a chunk of another layout of the same model (another padding or alignment, e.g. the
  // engine's): its tensors at its offsets.
  void read_chunk(const ChunkLayout& chunk, float* out /*(chunk.padded_numel) fp32*/) const;
  // Tensors in the files the model does not use (lm_head.weight under tied embeddings,
  // rotary_emb.inv_freq, ...).
  std::vector<std::string> unused() const;
  // Logs a warning per unused tensor, each naming `who` (the option or call that read the files).
  void warn_unused(std::string_view who) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  ModelLayout layout_;
  std::vector<std::unique_ptr<SafetensorsReader>> readers_;
  std::map<std::string, const SafetensorsReader*> where_;
};

// Reads the weights of `layout` chunk by chunk into a zero-padded fp32 buffer of padded_numel floats
// and hands each to `sink` (chunk order). `path` is a .safetensors file or a Hugging Face
// model.safetensors.index.json. Missing tensors or wrong shapes throw ConfigError naming the tensor, the
// file and both shapes; tensors the model does not use (lm_head.weight under tied embeddings,
// rotary_emb.inv_freq, ...) are skipped with a warning.
void load_weights(const std::string& path, const ModelLayout& layout,
                  const std::function<void(int chunk_id, const float* data)>& sink);
void load_weights(const std::string& path, InMemoryChunks& chunks);

}  // namespace strata::model
