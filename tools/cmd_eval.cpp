// `strata eval`: the mean next-token cross-entropy (and perplexity) of a model over a token file.
//
//   strata eval --model out/model.safetensors --data val.bin --seq-len 256
//   strata eval --model llama-2-7b/ --data val.bin --seq-len 1024 --batch-size 4 --max-batches 50
//   strata eval --model ckpt --data val.bin --seq-len 256              (DIR/latest, or --model ckpt/TAG)
//
// Prints one line on stdout, `eval loss X ppl Y tokens Z` (what it evaluated goes to stderr first); over a
// token file with a loss mask (FILE.mask), `eval loss X ppl Y tokens Z counted C`: the loss is the mean
// over the C targets the mask lets count. The sequences are consecutive windows from the start of the file
// (model/eval.h has the exact definition).
// --model is a Hugging Face model directory or a safetensors file (model::open_hf_model), or a checkpoint
// directory of `strata train --save` (read here: the model module does not know the engine's format).
// Everything the command line can get wrong is checked before the weights are read.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "model/device_chunks.h"
#include "model/dtype.h"
#include "model/eval.h"
#include "model/hf_dir.h"
#include "model/layout.h"
#include "model/make_model.h"
#include "model/nf4_chunk.h"
#include "model/safetensors.h"
#include "model/token_file.h"
#include "session/adapters.h"
#include "tools/cli.h"
#include "tools/model_source.h"
#include "zero3/checkpoint.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;
using detail::cat;

struct EvalOpts {
  std::string model, data, backend = "host", logits, adapter, base_dtype;
  int seq_len = 0;
  int batch_size = 1;
  std::int64_t max_batches = 0;
};

int run_eval(const EvalOpts& o) {
  // The model's shape first (no weights read yet): the command line is checked against it.
  const ModelSource source = open_model_source(o.model, "--model");
  // --adapter DIR: LoRA adapters (a PEFT adapter directory) over the base --model names.
  session::ModelSource adapted;
  if (!o.adapter.empty()) {
    if (!source.hf)
      throw ConfigError(
          cat("--adapter needs the base's weights: give --model the Hugging Face model directory "
              "(or .safetensors file) the adapters were trained over, not a checkpoint"));
    adapted.hf = source.hf;
    adapted.config = source.hf->config;
    session::resolve_adapters(adapted, {}, o.adapter, "--adapter");
  }
  const model::ModelConfig& cfg = o.adapter.empty() ? source.config() : adapted.config;
  const std::string weights = source.where();
  if (o.seq_len > cfg.max_seq_len)
    throw ConfigError(cat("--seq-len ", o.seq_len, " is longer than model '", cfg.name, "''s max_seq_len ",
                          cfg.max_seq_len));
  const model::TokenFile data = model::TokenFile::open(o.data);
  model::check_eval_inputs(cfg, data, o.seq_len, o.batch_size, o.max_batches);

  std::unique_ptr<Device> dev = open_device({.backend = o.backend});
  std::unique_ptr<Stream> stream = dev->create_stream("eval");
  std::unique_ptr<kernels::Ops> ops = kernels::make_ops(*dev, *stream);
  std::unique_ptr<model::InMemoryChunks> host =
      o.adapter.empty() ? load_params(source) : session::load_adapted(adapted, o.adapter, "--adapter");
  // --base-dtype nf4: the base's block projections as an NF4 base's gathers hold them (QLoRA's base,
  // model/nf4_chunk.h), the rest in bf16, as a run with strata.lora.base_dtype "nf4" trained over them.
  if (o.base_dtype == "nf4") {
    if (!source.hf)
      throw ConfigError(
          "--base-dtype nf4 quantises a base as its files store it: give --model the Hugging Face "
          "model directory (or .safetensors file), not a checkpoint");
    for (const model::ChunkLayout& c : host->layout().chunks())
      if (host->layout().is_base(c.id)) model::nf4_round_trip(c, DType::bf16, true, host->params(c.id));
  } else if (!o.base_dtype.empty() && o.base_dtype != "bf16") {
    throw ConfigError(cat("--base-dtype ", o.base_dtype, ": must be bf16 or nf4"));
  }
  // Chunks the ops can read where they are (the host backend: fp32 in host memory), else a copy on the
  // device in the ops' activation dtype, the host copy then freed.
  std::unique_ptr<model::DeviceChunks> on_device;
  if (!dev->caps().host_addressable || ops->caps().activation != DType::fp32) {
    on_device = std::make_unique<model::DeviceChunks>(*dev, *ops, *host);
    host.reset();
  }
  model::ChunkProvider& chunks = on_device ? static_cast<model::ChunkProvider&>(*on_device) : *host;
  const std::unique_ptr<model::TrainableModel> m =
      model::make_model(cfg, {.checkpoint_activations = true, .device = dev.get(), .ops = ops.get()});

  const std::int64_t all = model::eval_sequences(data.size(), o.seq_len);
  const std::int64_t S = o.max_batches > 0 ? std::min<std::int64_t>(all, o.max_batches * o.batch_size) : all;
  std::fprintf(
      stderr,
      "eval: model '%s' (%lld parameters) from %s on %s; %s: %lld of %lld sequences of %d tokens, "
      "batch %d\n",
      cfg.name.c_str(), (long long)cfg.num_parameters(),
      o.adapter.empty() ? weights.c_str() : cat(weights, " with the adapters of ", o.adapter).c_str(),
      dev->caps().name.c_str(), o.data.c_str(), (long long)S, (long long)all, o.seq_len, o.batch_size);
  if (const model::LossMask* mask = data.mask()) {
    // The targets evaluated are tokens 1 to S x T (sequence s reads tokens s·T .. s·T + T): the file's
    // first token is never a target, and the tokens after the last sequence are not evaluated.
    const std::size_t last = std::size_t(S) * std::size_t(o.seq_len);
    const std::size_t in_range = mask->count(1, last);
    std::fprintf(
        stderr,
        "eval: loss mask %s: %zu of %zu tokens count as targets; %zu of them are targets of the %lld "
        "sequences evaluated (tokens 1 to %zu: the first token and the %zu after the last sequence "
        "are not targets)\n",
        mask->path().c_str(), mask->counted(), mask->size(), in_range, (long long)S, last,
        mask->size() - last - 1);
  }
  if (const model::PackedDocs* docs = data.docs())
    std::fprintf(stderr,
                 "eval: documents: %s: %zu documents kept apart (attention within each, rotary positions "
                 "from 0 in each, a document's first token not a target)\n",
                 docs->path().c_str(), docs->size());
  const model::EvalResult r = model::evaluate(*m, chunks, data, o.seq_len, o.batch_size, o.max_batches);
  if (data.mask())
    std::printf("eval loss %.9g ppl %.9g tokens %lld counted %lld\n", r.loss, r.ppl, (long long)r.tokens,
                (long long)r.counted);
  else
    std::printf("eval loss %.9g ppl %.9g tokens %lld\n", r.loss, r.ppl, (long long)r.tokens);
  std::fflush(stdout);
  if (!o.logits.empty()) {
    // The first batch's logits, (B, T, vocab) little-endian fp32, for comparing with another
    // implementation token by token (tests/reference/check_strata_cli.py).
    const int B = int(std::min<std::int64_t>(o.batch_size, S));
    // With document boundaries, each row's documents kept apart as the loss above computed them.
    const model::PackedDocs* docs = data.docs();
    std::vector<std::int32_t> in(std::size_t(B) * std::size_t(o.seq_len)), pos(docs ? in.size() : 0);
    for (int b = 0; b < B; ++b) {
      const std::size_t begin = std::size_t(b) * std::size_t(o.seq_len);
      data.read(begin, std::size_t(o.seq_len), in.data() + begin);
      if (docs) docs->positions(begin, std::size_t(o.seq_len), pos.data() + begin);
    }
    m->forward(chunks, in.data(), nullptr, B, o.seq_len, docs ? pos.data() : nullptr);
    const std::vector<float> lg = m->logits();
    std::FILE* f = std::fopen(o.logits.c_str(), "wb");
    if (!f || std::fwrite(lg.data(), sizeof(float), lg.size(), f) != lg.size() || std::fclose(f) != 0)
      throw IoError(cat("--logits ", o.logits, ": cannot write ", lg.size() * sizeof(float), " bytes"));
  }
  return 0;
}

// A whole number >= `lo` (CLI11's range validators print their range in full).
CLI::Validator at_least(long long lo) {
  return CLI::Validator(
      [lo](std::string& v) -> std::string {
        try {
          std::size_t used = 0;
          if (std::stoll(v, &used) >= lo && used == v.size()) return {};
        } catch (const std::exception&) {
        }
        return cat("must be a whole number of at least ", lo, ", not ", v);
      },
      cat("INT >= ", lo));
}

Command eval("eval", "Mean next-token loss and perplexity of a model over a token file", [](CLI::App& sub) {
  auto o = std::make_shared<EvalOpts>();
  sub.add_option("--model", o->model,
                 "Hugging Face model directory, .safetensors file (e.g. from train --export), or checkpoint "
                 "directory (DIR with `latest`, or DIR/TAG)")
      ->required();
  sub.add_option("--data", o->data,
                 "Token file (llm.c .bin or flat uint16); a loss mask beside it (FILE.mask) is applied")
      ->required()
      ->check(CLI::ExistingFile);
  sub.add_option("--seq-len", o->seq_len, "Tokens per sequence, at most the model's max_seq_len")
      ->required()
      ->check(at_least(1));
  sub.add_option("--batch-size", o->batch_size, "Sequences per forward (default 1)")->check(at_least(1));
  sub.add_option("--max-batches", o->max_batches, "Stop after N batches (default 0: every whole sequence)")
      ->check(at_least(0));
  sub.add_option("--backend", o->backend, "Device backend: host (default), cuda or auto");
  sub.add_option(
      "--base-dtype", o->base_dtype,
      "nf4: evaluate over the base's block projections in NF4 (double-quantised), as a run with "
      "strata.lora.base_dtype nf4 trains over them; bf16 or unset: the base as its files store it");
  sub.add_option("--adapter", o->adapter,
                 "LoRA adapters over --model: a PEFT adapter directory (adapter_config.json, "
                 "adapter_model.safetensors), as strata train --export with adapters writes it");
  sub.add_option("--logits", o->logits,
                 "Also write the first batch's logits to FILE: (batch, seq-len, vocab) little-endian fp32");
  return [o] { return run_eval(*o); };
});

}  // namespace
}  // namespace strata::cli
