#include "model/data_loader.h"

#include <nlohmann/json.hpp>
#include <numeric>

#include "core/error.h"

namespace strata::model {
namespace {

// A splitmix64 stream: the generator behind the epoch permutation (fixed arithmetic, so every rank and
// every platform draws the same numbers).
class Stream {
 public:
  explicit Stream(uint64_t key) : state_(key) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n), unbiased (rejection of the short last bucket).
  uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = next();
    while (x >= limit);
    return x % n;
  }

 private:
  uint64_t state_;
};

}  // namespace

nlohmann::json DataPosition::to_json() const {
  return {{"seed", seed},
          {"epoch", epoch},
          {"sample", sample},
          {"world", world},
          {"seq_len", seq_len},
          {"file_tokens", file_tokens},
          {"file_digest", file_digest},
          {"mask_digest", mask_digest},
          {"docs_digest", docs_digest}};
}

DataPosition DataPosition::from_json(const nlohmann::json& j) {
  DataPosition p;
  auto need = [&](const char* key) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(key) || !j.at(key).is_number_integer())
      throw ConfigError(detail::cat("data position: '", key, "' is missing or not an integer in ", j.dump()));
    return j.at(key);
  };
  p.seed = need("seed").get<uint64_t>();
  p.epoch = need("epoch").get<int64_t>();
  p.sample = need("sample").get<int64_t>();
  p.world = need("world").get<int>();
  p.seq_len = need("seq_len").get<int>();
  if (j.contains("file_tokens")) p.file_tokens = need("file_tokens").get<uint64_t>();  // absent: older files
  if (j.contains("file_digest")) p.file_digest = need("file_digest").get<uint64_t>();
  if (j.contains("mask_digest")) p.mask_digest = need("mask_digest").get<uint64_t>();  // absent: no mask
  if (j.contains("docs_digest")) p.docs_digest = need("docs_digest").get<uint64_t>();  // absent: no docs
  return p;
}

DataLoader::DataLoader(const TokenFile& file, DataOptions opts) : file_(file), opts_(opts) {
  auto bad = [&](const char* what, int64_t v, const char* allowed) {
    throw ConfigError(detail::cat("data loader for ", name(), ": ", what, " is ", v, "; ", allowed));
  };
  if (opts.batch_size < 1) bad("batch_size", opts.batch_size, "it must be at least 1");
  if (opts.seq_len < 1) bad("seq_len", opts.seq_len, "it must be at least 1");
  if (opts.world < 1) bad("world", opts.world, "it must be at least 1");
  if (opts.rank < 0 || opts.rank >= opts.world) bad("rank", opts.rank, "it must be in [0, world)");
  num_samples_ = int64_t(file.size() > 0 ? (file.size() - 1) / size_t(opts.seq_len) : 0);
  per_rank_ = opts.drop_last ? num_samples_ / opts.world : (num_samples_ + opts.world - 1) / opts.world;
  if (per_rank_ < 1)
    throw ConfigError(detail::cat("data loader for ", name(), ": ", file.size(), " tokens make ",
                                  num_samples_, " samples of ", opts.seq_len,
                                  "+1 tokens, fewer than one per rank (", opts.world,
                                  " ranks); use a shorter seq_len or more data"));
  const TokenFile::Scan scan = file.scan(opts.vocab_size > 0 ? uint64_t(opts.vocab_size) : UINT64_MAX);
  if (scan.first_at_or_above < file.size())
    throw ConfigError(detail::cat("token file ", name(), ": token ", scan.first_at_or_above, " is ",
                                  file.at(scan.first_at_or_above), ", outside the model's vocabulary of ",
                                  opts.vocab_size, "; tokenize with a matching vocabulary"));
  digest_ = scan.digest;
  const int64_t targets = num_samples_ * int64_t(opts.seq_len);
  counted_targets_ = file.mask() ? int64_t(file.mask()->count(1, size_t(targets))) : targets;
  if (const PackedDocs* docs = file.docs()) {  // a target that starts a document does not count either
    for (uint64_t s : docs->starts())
      if (s >= 1 && s <= uint64_t(targets) && (!file.mask() || file.mask()->counts(size_t(s))))
        --counted_targets_;
  }
  order_ = epoch_samples(0);
}

int64_t DataLoader::batches_per_epoch() const {
  return opts_.drop_last_batch ? per_rank_ / opts_.batch_size
                               : (per_rank_ + opts_.batch_size - 1) / opts_.batch_size;
}

std::vector<int64_t> rank_samples(int64_t num_samples, int rank, int world, uint64_t seed, int64_t epoch,
                                  bool shuffle, bool drop_last) {
  if (world < 1) throw ConfigError(detail::cat("sampler: world size ", world, " must be at least 1"));
  if (rank < 0 || rank >= world)
    throw ConfigError(detail::cat("sampler: rank ", rank, " is outside [0, ", world, ")"));
  if (epoch < 0)
    throw ConfigError(detail::cat("sampler: epoch ", epoch, " is negative; epochs count from 0"));
  const int64_t per_rank = drop_last ? num_samples / world : (num_samples + world - 1) / world;
  if (num_samples < 0 || per_rank < 1)
    throw ConfigError(detail::cat("sampler: ", num_samples, " samples leave none for each of ", world,
                                  " ranks", drop_last ? " (drop_last)" : ""));
  std::vector<int64_t> perm(static_cast<size_t>(num_samples));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  if (shuffle) {
    Stream rng(seed * 0x9E3779B97F4A7C15ull ^ (uint64_t(epoch) + 0x632BE59BD9B4E019ull));
    for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[rng.below(i)]);
  }
  const int64_t total = per_rank * world;
  std::vector<int64_t> mine;
  mine.reserve(size_t(per_rank));
  for (int64_t pos = rank; pos < total; pos += world)
    mine.push_back(perm[size_t(pos % num_samples)]);  // wrap-around padding when total > N
  return mine;
}

std::vector<int64_t> DataLoader::epoch_samples(int64_t epoch) const {
  return rank_samples(num_samples_, opts_.rank, opts_.world, opts_.seed, epoch, opts_.shuffle,
                      opts_.drop_last);
}

void DataLoader::set_epoch(int64_t epoch) {
  if (epoch < 0) throw ConfigError(detail::cat("data loader: set_epoch(", epoch, "): epochs count from 0"));
  epoch_ = epoch;
  cursor_ = 0;
  order_ = epoch_samples(epoch_);
}

Batch DataLoader::next() {
  if (cursor_ >= per_rank_ || (opts_.drop_last_batch && per_rank_ - cursor_ < opts_.batch_size)) {
    ++epoch_;
    cursor_ = 0;
    order_ = epoch_samples(epoch_);
  }
  if (batches_per_epoch() == 0)
    throw ConfigError(detail::cat("data loader for ", name(), ": drop_last_batch with batch_size ",
                                  opts_.batch_size, " leaves no batch from ", per_rank_,
                                  " samples per rank"));
  Batch b;
  b.epoch = epoch_;
  b.seq_len = opts_.seq_len;
  b.rows = int(std::min<int64_t>(opts_.batch_size, per_rank_ - cursor_));
  const size_t T = size_t(opts_.seq_len);
  b.inputs.resize(size_t(b.rows) * T);
  b.targets.resize(size_t(b.rows) * T);
  const PackedDocs* docs = file_.docs();
  if (docs) b.positions.resize(size_t(b.rows) * T);
  std::vector<int32_t> window(T + 1);
  for (int r = 0; r < b.rows; ++r) {
    int64_t s = order_[size_t(cursor_ + r)];
    file_.read(size_t(s) * T, T + 1, window.data());
    if (opts_.vocab_size > 0) {
      for (size_t i = 0; i <= T; ++i) {
        if (window[i] < 0 || window[i] >= opts_.vocab_size)
          throw ConfigError(detail::cat("token file ", name(), ": token ", size_t(s) * T + i, " is ",
                                        uint32_t(window[i]), ", outside the model's vocabulary of ",
                                        opts_.vocab_size, "; tokenize with a matching vocabulary"));
      }
    }
    std::copy(window.begin(), window.begin() + long(T), b.inputs.begin() + long(size_t(r) * T));
    int32_t* targets = b.targets.data() + size_t(r) * T;
    std::copy(window.begin() + 1, window.end(), targets);
    if (const LossMask* mask = file_.mask()) {
      const uint8_t* counts = mask->bytes() + size_t(s) * T + 1;  // Note [Loss mask in batches]
      for (size_t j = 0; j < T; ++j)
        if (counts[j] == 0) targets[j] = kIgnoreTarget;
    }
    if (docs) {  // Note [Packed documents]
      docs->positions(size_t(s) * T, T, b.positions.data() + size_t(r) * T);
      for (uint64_t i = size_t(s) * T + 1, e = i + T; i < e; ++i)
        if (docs->starts_at(i)) targets[i - (size_t(s) * T + 1)] = kIgnoreTarget;
    }
    for (size_t j = 0; j < T; ++j) b.counted += targets[j] >= 0 ? 1 : 0;
    b.sample_ids.push_back(s);
  }
  cursor_ += b.rows;
  return b;
}

DataPosition DataLoader::position() const {
  DataPosition p;
  p.seed = opts_.seed;
  p.epoch = epoch_;
  p.sample = cursor_;
  p.world = opts_.world;
  p.seq_len = opts_.seq_len;
  p.file_tokens = file_.size();
  p.file_digest = digest_;
  p.mask_digest = file_.mask() ? file_.mask()->digest() : 0;
  p.docs_digest = file_.docs() ? file_.docs()->digest() : 0;
  return p;
}

void DataLoader::set_position(const DataPosition& pos) {
  if (pos.seed != opts_.seed || pos.world != opts_.world || pos.seq_len != opts_.seq_len)
    throw ConfigError(detail::cat("data position (seed ", pos.seed, ", world ", pos.world, ", seq_len ",
                                  pos.seq_len, ") was saved by a loader with other settings (seed ",
                                  opts_.seed, ", world ", opts_.world, ", seq_len ", opts_.seq_len,
                                  "); resume with the same seed, world size and sequence length"));
  if ((pos.file_tokens != 0 && pos.file_tokens != file_.size()) ||
      (pos.file_digest != 0 && pos.file_digest != digest_))
    throw ConfigError(detail::cat("data position was saved over another token file (", pos.file_tokens,
                                  " tokens, digest ", pos.file_digest, "); ", name(), " has ", file_.size(),
                                  " tokens, digest ", digest_,
                                  ": resume on the data the checkpoint trained on (the same --data file, or "
                                  "the same --text), or start a "
                                  "new run"));
  const LossMask* mask = file_.mask();
  const uint64_t mask_digest = mask ? mask->digest() : 0;
  if (pos.mask_digest != mask_digest)
    throw ConfigError(detail::cat(
        "data position was saved over ",
        pos.mask_digest == 0 ? std::string("no loss mask")
                             : detail::cat("a loss mask (digest ", pos.mask_digest, ")"),
        "; ", name(), " has ",
        mask ? detail::cat("the loss mask ", mask->path(), " (digest ", mask_digest, ")")
             : std::string("no loss mask"),
        ": resume with the mask the checkpoint trained with (scripts/tokenize_text.py writes it beside the "
        "token file as TOKENFILE.mask), or start a new run"));
  const PackedDocs* docs = file_.docs();
  const uint64_t docs_digest = docs ? docs->digest() : 0;
  if (pos.docs_digest != docs_digest)
    throw ConfigError(detail::cat(
        "data position was saved over ",
        pos.docs_digest == 0 ? std::string("no document boundaries")
                             : detail::cat("document boundaries (digest ", pos.docs_digest, ")"),
        "; ", name(), " has ",
        docs ? detail::cat("the document boundaries ", docs->path(), " (digest ", docs_digest, ")")
             : std::string("no document boundaries"),
        ": resume with the boundaries the checkpoint trained with (scripts/tokenize_text.py writes them "
        "beside "
        "the token file as TOKENFILE.docs), or start a new run"));
  if (pos.epoch < 0 || pos.sample < 0 || pos.sample > per_rank_)
    throw ConfigError(detail::cat("data position epoch ", pos.epoch, " sample ", pos.sample,
                                  " is outside an epoch of ", per_rank_, " samples per rank"));
  epoch_ = pos.epoch;
  cursor_ = pos.sample;
  order_ = epoch_samples(epoch_);
}

}  // namespace strata::model
