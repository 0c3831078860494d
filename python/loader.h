// strata/python/loader.h: the token-file loader the package hands out (engine.token_loader), shared by
// the data and engine bindings (checkpoints save and restore its position).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "model/data_loader.h"
#include "model/token_file.h"
#include "python/binding.h"

namespace strata::python {

// model::DataLoader over a token file it owns; batches come out as windows of seq_len + 1 tokens per row
// (inputs, then the last target), the shape engine(...) takes. Over a file with a loss mask each batch
// carries its labels (Tokens::labels: window column k of sample s is -100 where mask byte s·T + k is 0,
// the DataLoader's targets; column 0 is -100).
class TokenLoader {
 public:
  // ConfigError / IoError from TokenFile::open and DataLoader (bad options, too little data, a token
  // outside vocab_size when it is > 0).
  TokenLoader(const std::string& path, model::DataOptions opts);

  Tokens next();  // (rows, seq_len + 1) int32; the next epoch starts after the last batch
  // Batches next() returns before the current epoch ends; a whole epoch's when it has ended (next() then
  // starts the next one).
  std::int64_t batches_left_in_epoch() const;
  void set_epoch(std::int64_t epoch);
  std::int64_t epoch() const;
  int seq_len() const { return seq_len_; }
  model::DataLoader& loader() { return *loader_; }
  const model::DataLoader& loader() const { return *loader_; }

 private:
  std::unique_ptr<model::TokenFile> file_;  // read by loader_: declared first, destroyed last
  std::unique_ptr<model::DataLoader> loader_;
  int seq_len_ = 0;
  int batch_size_ = 1;
};

// iter(loader): the batches of one epoch, then StopIteration (the loader keeps its position).
struct EpochBatches {
  TokenLoader* loader = nullptr;
  std::int64_t left = 0;
};

}  // namespace strata::python
