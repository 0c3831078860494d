// strata/model/eval.h: held-out evaluation — the mean next-token cross-entropy of a model over a token
// file.
//
// Example:
//   strata::model::HfModel src = strata::model::open_hf_model("out/model.safetensors");  // hf_dir.h
//   auto data = strata::model::TokenFile::open("val.bin");
//   strata::model::check_eval_inputs(src.config, data, /*seq_len=*/256, /*batch_size=*/4, /*max_batches=*/0);
//   strata::model::InMemoryChunks chunks{strata::model::ModelLayout(src.config)};
//   strata::model::load_weights(src.weights, chunks);                                     // safetensors.h
//   strata::model::LlamaModel model(src.config, {.checkpoint_activations = true});
//   strata::model::EvalResult r = strata::model::evaluate(model, chunks, data, 256, 4, 0);
//   std::printf("eval loss %.7g ppl %.7g tokens %lld\n", r.loss, r.ppl, (long long)r.tokens);
//
// The sequences: consecutive, non-overlapping windows from the start of the file. With T = seq_len and
// n = data.size() tokens, sequence s has inputs tokens[s·T, (s+1)·T) and targets tokens[s·T+1, (s+1)·T+1)
// (the inputs shifted by one), for every s from 0 while (s+1)·T + 1 <= n: S = (n - 1) / T whole sequences.
// The tail that does not fill a sequence is not evaluated. Sequences go batch_size at a time, in file order
// (the last batch may hold fewer).
//
// With a loss mask beside the file (model/loss_mask.h), target token i is left out (given to the model as
// kIgnoreTarget) where mask byte i is 0; the sequences are the same. With document boundaries beside it
// (model/packed_docs.h), each sequence's documents are kept apart as in training (Note [Packed documents]):
// positions per document, and a target that starts a document left out.
//
// The loss is the mean over every target that counts (all of them without a mask): the batches' mean
// losses (LlamaModel::forward, each over its counted targets) weighted by their counted targets, summed in
// double and divided by the counted targets of the whole evaluation — per token, not a mean of per-batch
// means. Without a mask every sequence has T counted targets. ppl = exp(loss). A batch's mean
// comes back from the model as fp32 (the CPU ops sum its rows in double, then round once), so the result
// depends on batch_size only through that rounding: different batch sizes agree to about 1e-7 relative.
//
// Where the model comes from is the caller's: open_hf_model (model/hf_dir.h) finds a Hugging Face directory
// or a safetensors file; `strata eval` (tools/cmd_eval.cpp) also reads the engine's checkpoints, whose
// format the model module, above zero3, does not know.
#pragma once

#include <cstdint>

#include "model/chunk.h"
#include "model/config.h"
#include "model/token_file.h"
#include "model/trainable.h"

namespace strata::model {

struct EvalResult {
  double loss = 0;             // mean next-token cross-entropy (nats per token)
  double ppl = 0;              // exp(loss)
  std::int64_t tokens = 0;     // targets evaluated: sequences × seq_len
  std::int64_t counted = 0;    // of those, the targets that count (the loss mask's ones; = tokens without)
  std::int64_t sequences = 0;  // sequences evaluated
};

// Whole sequences of `seq_len` tokens in a file of `tokens` tokens: (tokens - 1) / seq_len, 0 for an empty
// file. seq_len >= 1.
std::int64_t eval_sequences(std::size_t tokens, int seq_len);

// The checks evaluate() makes before its first forward, each a ConfigError naming what is wrong and what to
// change: 1 <= seq_len <= cfg.max_seq_len; batch_size >= 1; max_batches >= 0 (0: every sequence); the file
// holds at least one whole sequence (seq_len + 1 tokens); every token of the file is below cfg.vocab_size;
// with a loss mask, at least one target of the sequences evaluated counts.
// A caller with weights still to load calls it first, so that bad input fails before the slow part.
void check_eval_inputs(const ModelConfig& cfg, const TokenFile& data, int seq_len, int batch_size,
                       std::int64_t max_batches);

// Runs `m` forward (no backward, no gradients) over the sequences above; max_batches > 0 stops after that
// many batches. check_eval_inputs(m.config(), ...) first. A model built without checkpoint_activations
// keeps every block's activations: build it with {.checkpoint_activations = true} to hold only each
// block's input.
EvalResult evaluate(TrainableModel& m, ChunkProvider& chunks, const TokenFile& data, int seq_len,
                    int batch_size, std::int64_t max_batches);

}  // namespace strata::model
