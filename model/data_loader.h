// strata/model/data_loader.h: B×T batches from a token file, shuffled by (seed, epoch) and sharded by rank
// the way PyTorch's DistributedSampler shards.
//
// Example:
//   auto file = strata::model::TokenFile::open("train.bin");
//   strata::model::DataLoader loader(file, {.batch_size = 8, .seq_len = 256, .rank = r, .world = w,
//                                           .seed = 1234, .vocab_size = cfg.vocab_size});
//   strata::model::Batch b = loader.next();         // b.inputs, b.targets: (b.rows, T) int32
//   // b.counted: the targets that count (all of them unless train.bin.mask says otherwise)
//   // b.positions: (b.rows, T) position_ids when train.bin.docs keeps documents apart, else empty
//   nlohmann::json pos = loader.position().to_json(); // into a checkpoint's meta.json
//   loader.set_position(strata::model::DataPosition::from_json(pos));  // resume exactly there
//
// Note [Samples and sharding]: sample s is the window of T + 1 tokens starting at token s*T (inputs are
// its first T tokens, targets its last T), so the file holds N = (tokens - 1) / T samples. Each epoch
// the sample ids are permuted by a Fisher–Yates shuffle driven by a counter-based generator keyed on
// (seed, epoch) — identical on every rank and every platform. As DistributedSampler with its default
// drop_last=False, the permuted list is padded by wrapping around to total = ceil(N / world) * world and
// rank r takes positions r, r + world, r + 2*world, ...; so every sample is seen at least once per epoch
// across ranks and exactly once when world divides N. drop_last=true instead truncates to
// floor(N / world) * world. A rank's list is cut into batches of batch_size rows; the last batch of an
// epoch has fewer rows unless drop_last_batch. After the last batch, next() starts the next epoch.
//
// Note [Loss mask in batches]: with a loss mask beside the token file (model/loss_mask.h), target j of
// the row of sample s is token i = s*T + 1 + j; it is kIgnoreTarget (-100) when mask byte i is 0, so the
// model leaves it out of its mean. The inputs are the tokens as they are, and the samples, their order
// and the sharding do not depend on the mask. Batch::counted is the number of targets that count.
// With document boundaries beside the token file (model/packed_docs.h) a batch also carries each row's
// positions, and a target that starts a document is kIgnoreTarget too (Note [Packed documents]).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/token_file.h"

namespace strata::model {

struct DataOptions {
  int batch_size = 1;            // rows per batch (B), >= 1
  int seq_len = 1;               // tokens per row (T), >= 1
  int rank = 0;                  // this rank, in [0, world)
  int world = 1;                 // number of ranks, >= 1
  uint64_t seed = 0;             // with the epoch, decides the permutation
  bool shuffle = true;           // false: samples in file order
  bool drop_last = false;        // DistributedSampler's: truncate instead of padding to a multiple of world
  bool drop_last_batch = false;  // skip a final batch with fewer than batch_size rows
  int64_t vocab_size = 0;        // > 0: every token read is checked to be below it
  std::string source = {};       // how messages name the data ("--text book.txt"); empty: the file's path
};

struct Batch {
  int rows = 0;  // <= batch_size; fewer only for the last batch of an epoch
  int seq_len = 0;
  std::vector<int32_t> inputs;      // (rows, seq_len)
  std::vector<int32_t> targets;     // (rows, seq_len): inputs shifted left by one token; kIgnoreTarget
                                    // where the loss mask leaves the target out, or it starts a document
  std::vector<int32_t> positions;   // (rows, seq_len) with document boundaries, restarting at 0 at each
                                    // document and row start (Note [Packed documents]); else empty
  int64_t counted = 0;              // targets that count: rows * seq_len without a mask or documents
  std::vector<int64_t> sample_ids;  // (rows)
  int64_t epoch = 0;
};

// Where a loader stands: the next batch it returns is the one at `sample` in this rank's list of `epoch`.
struct DataPosition {
  uint64_t seed = 0;
  int64_t epoch = 0;
  int64_t sample = 0;  // samples of this rank's epoch list already returned
  int world = 1;
  int seq_len = 1;
  // The token file it walks: its token count and TokenFile::scan's digest (0: not recorded).
  uint64_t file_tokens = 0, file_digest = 0;
  // Its loss mask's digest (LossMask::digest), 0 without a mask; a position saved before masks existed
  // reads as 0.
  uint64_t mask_digest = 0;
  // Its document boundaries' digest (PackedDocs::digest), 0 without them (and in older positions).
  uint64_t docs_digest = 0;

  nlohmann::json to_json() const;
  static DataPosition from_json(const nlohmann::json& j);  // ConfigError naming a missing/bad key
};

// Note [Samples and sharding]'s order for any data set of `num_samples` samples: rank `rank`'s sample ids
// of `epoch`, in the order they are returned (DistributedSampler's indices; per rank ceil(N / world), or
// floor(N / world) with drop_last). The DataLoader walks a token file in this order; the Python binding's
// DistributedSampler hands it to a user's own data set. ConfigError for a rank outside [0, world), a
// world below 1, a negative epoch, or no sample for a rank.
std::vector<int64_t> rank_samples(int64_t num_samples, int rank, int world, uint64_t seed, int64_t epoch,
                                  bool shuffle, bool drop_last);

class DataLoader {
 public:
  // Throws ConfigError when an option is out of range, the file holds fewer than one sample per rank, or
  // (vocab_size > 0) any token of the file is outside the vocabulary: the whole file is scanned once here,
  // so a bad token is found before training rather than at the batch that holds it.
  // `file` is read on every next() and must outlive the loader.
  DataLoader(const TokenFile& file, DataOptions opts);

  int64_t num_samples() const { return num_samples_; }    // N, in the whole file
  int64_t samples_per_rank() const { return per_rank_; }  // per epoch
  int64_t batches_per_epoch() const;
  // The targets of the file's N samples (N * seq_len) and those of them the loss mask lets count (all
  // without a mask): what `strata train` reports at its start.
  int64_t sample_targets() const { return num_samples_ * int64_t(opts_.seq_len); }
  int64_t counted_targets() const { return counted_targets_; }
  // This rank's sample ids for `epoch`, in the order they are returned.
  std::vector<int64_t> epoch_samples(int64_t epoch) const;

  Batch next();
  // DistributedSampler.set_epoch: the next batch is the first of `epoch` (>= 0), whose permutation is the
  // same on every rank. Loops that count epochs themselves call it at each epoch's start; next() also
  // moves on by itself after an epoch's last batch.
  void set_epoch(int64_t epoch);

  DataPosition position() const;
  // Throws ConfigError when the position was saved with another seed, world or seq_len, over another
  // token file (a different token count or contents), loss mask or document boundaries (another one, or
  // one and none), or is past the end of its epoch.
  void set_position(const DataPosition& pos);

 private:
  const std::string& name() const { return opts_.source.empty() ? file_.path() : opts_.source; }

  const TokenFile& file_;
  DataOptions opts_;
  int64_t num_samples_ = 0, per_rank_ = 0;
  int64_t epoch_ = 0, cursor_ = 0;
  std::vector<int64_t> order_;  // epoch_samples(epoch_)
  uint64_t digest_ = 0;         // of the file's tokens (TokenFile::scan)
  int64_t counted_targets_ = 0;
};

}  // namespace strata::model
