#include "model/eval.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace strata::model {

using detail::cat;

std::int64_t eval_sequences(std::size_t tokens, int seq_len) {
  STRATA_CHECK(seq_len >= 1, "seq_len ", seq_len, " is below 1");
  return tokens == 0 ? 0 : std::int64_t((tokens - 1) / std::size_t(seq_len));
}

void check_eval_inputs(const ModelConfig& cfg, const TokenFile& data, int seq_len, int batch_size,
                       std::int64_t max_batches) {
  if (seq_len < 1 || seq_len > cfg.max_seq_len)
    throw ConfigError(cat("eval: sequence length ", seq_len, " is outside [1, ", cfg.max_seq_len,
                          "] (model '", cfg.name,
                          "''s max_seq_len); choose a length the model was built for"));
  if (batch_size < 1) throw ConfigError(cat("eval: batch size ", batch_size, " is below 1"));
  if (max_batches < 0)
    throw ConfigError(cat("eval: max_batches ", max_batches, " is negative (0 evaluates every sequence)"));
  if (eval_sequences(data.size(), seq_len) == 0)
    throw ConfigError(cat("eval data ", data.path(), " holds ", data.size(), " tokens; one sequence of ",
                          seq_len, " tokens needs ", std::int64_t(seq_len) + 1,
                          " (the inputs and the targets shifted by one). Give a longer file or a shorter "
                          "sequence length"));
  const TokenFile::Scan scan = data.scan(std::uint64_t(cfg.vocab_size));
  if (scan.first_at_or_above < data.size())
    throw ConfigError(cat("eval data ", data.path(), ": token ", scan.first_at_or_above, " is ",
                          data.at(scan.first_at_or_above), ", outside model '", cfg.name,
                          "''s vocabulary of ", cfg.vocab_size,
                          " tokens; the file was tokenized for another model"));
  if (const LossMask* mask = data.mask()) {
    const std::int64_t all = eval_sequences(data.size(), seq_len);
    const std::int64_t S =
        max_batches > 0 ? std::min<std::int64_t>(all, max_batches * std::int64_t(batch_size)) : all;
    const std::size_t targets = std::size_t(S) * std::size_t(seq_len);
    if (mask->count(1, targets) == 0)
      throw ConfigError(cat("eval data ", data.path(), ": its loss mask ", mask->path(),
                            " counts none of the ", targets, " targets of the ", S,
                            " sequences evaluated, so there is no loss to take; evaluate more of the file "
                            "(--max-batches) or with another mask"));
  }
}

EvalResult evaluate(TrainableModel& m, ChunkProvider& chunks, const TokenFile& data, int seq_len,
                    int batch_size, std::int64_t max_batches) {
  check_eval_inputs(m.config(), data, seq_len, batch_size, max_batches);
  const std::int64_t total = eval_sequences(data.size(), seq_len);
  const std::int64_t S =
      max_batches > 0 ? std::min<std::int64_t>(total, max_batches * std::int64_t(batch_size)) : total;
  const std::size_t T = std::size_t(seq_len);
  // (B·T + 1) tokens: sequence r of the batch has its inputs at r·T, its targets one token later.
  std::vector<std::int32_t> window(std::size_t(batch_size) * T + 1);
  const LossMask* mask = data.mask();
  const PackedDocs* docs = data.docs();
  // (B, T): the targets left out by the mask or a document start; the positions with documents.
  std::vector<std::int32_t> targets(mask || docs ? std::size_t(batch_size) * T : 0);
  std::vector<std::int32_t> positions(docs ? std::size_t(batch_size) * T : 0);
  double sum = 0;  // Σ batch mean × batch counted targets
  std::int64_t tokens = 0, counted = 0;
  for (std::int64_t s = 0; s < S; s += batch_size) {
    const int B = int(std::min<std::int64_t>(batch_size, S - s));
    const std::size_t n = std::size_t(B) * T;
    data.read(std::size_t(s) * T, n + 1, window.data());
    const std::int32_t* tgt = window.data() + 1;
    std::size_t c = n;
    if (mask) {
      // Target k of the batch is token s·T + 1 + k.
      const std::uint8_t* counts = mask->bytes() + std::size_t(s) * T + 1;
      c = 0;
      for (std::size_t k = 0; k < n; ++k) {
        targets[k] = counts[k] != 0 ? tgt[k] : kIgnoreTarget;
        c += counts[k];
      }
      tgt = targets.data();
    }
    if (docs) {  // Note [Packed documents]: each sequence a row of its own
      if (!mask) std::copy(tgt, tgt + n, targets.begin());
      tgt = targets.data();
      for (int r = 0; r < B; ++r) {
        const std::size_t begin = (std::size_t(s) + std::size_t(r)) * T;
        docs->positions(begin, T, positions.data() + std::size_t(r) * T);
        for (std::size_t j = 0; j < T; ++j)
          if (targets[std::size_t(r) * T + j] >= 0 && docs->starts_at(begin + 1 + j)) {
            targets[std::size_t(r) * T + j] = kIgnoreTarget;
            --c;
          }
      }
    }
    const float mean = m.forward(chunks, window.data(), tgt, B, seq_len, docs ? positions.data() : nullptr);
    sum += double(mean) * double(c);
    tokens += std::int64_t(n);
    counted += std::int64_t(c);
  }
  EvalResult r;
  r.tokens = tokens;
  r.counted = counted;
  r.sequences = S;
  r.loss = sum / double(counted);
  r.ppl = std::exp(r.loss);
  return r;
}

}  // namespace strata::model
