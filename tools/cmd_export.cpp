// `strata export`: a checkpoint (or any model Strata reads) as a Hugging Face model directory, without
// training.
//
//   strata export ckpt out/                        (ckpt/latest; or ckpt/TAG)
//   strata export ckpt out/ --dtype fp32 --tokenizer-from Llama-3.2-1B/
//
// Writes what `strata train --export DIR` writes (model/hf_dir.h, save_pretrained): config.json,
// generation_config.json, the weights (sharded past --max-shard-size, as transformers does) and the
// tokenizer files of --tokenizer-from, or of the --init-from directory the checkpointed run started from
// when it still exists. A checkpoint's weights are the working params the run computed with, so the export
// of a checkpoint equals the --export of the run that saved it; with --dtype fp32 they are the checkpoint's
// fp32 master weights (as DeepSpeed's zero_to_fp32 writes), not the working params widened.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "config/config.h"
#include "core/error.h"
#include "core/files.h"
#include "core/log.h"
#include "model/hf_dir.h"
#include "tools/cli.h"
#include "tools/model_source.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;
using detail::cat;

struct ExportOpts {
  std::string source, out, dtype = "bf16", tokenizer_from, max_shard = "5GB";
};

int run_export(const ExportOpts& o) {
  const DType dtype = o.dtype == "bf16"   ? DType::bf16
                      : o.dtype == "fp16" ? DType::fp16
                      : o.dtype == "fp32"
                          ? DType::fp32
                          : throw ConfigError(cat("--dtype ", o.dtype, ": use bf16, fp16 or fp32"));
  // transformers' max_shard_size: "5GB" is decimal, "5GiB" binary (parse_byte_size reads both).
  const std::uint64_t max_shard = parse_byte_size(o.max_shard, "--max-shard-size");
  std::error_code ec;
  if (!fs::exists(o.source, ec))
    throw ConfigError(cat("CHECKPOINT ", o.source,
                          ": no such file or directory; give a checkpoint directory of `strata train "
                          "--save` (or a model directory / .safetensors file)"));
  if (!o.tokenizer_from.empty() && !fs::is_directory(o.tokenizer_from, ec))
    throw ConfigError(cat("--tokenizer-from ", o.tokenizer_from, ": not a directory"));
  const ModelSource src = open_model_source(o.source, "CHECKPOINT");
  // Where the export goes, created and probed before the weights are loaded; the errors name OUT_DIR, the
  // argument as the usage line shows it.
  check_output_dir(o.out, "OUT_DIR");
  std::string tokenizer = o.tokenizer_from;
  if (tokenizer.empty() && src.ckpt && !src.ckpt->init_from.empty()) {
    if (fs::is_directory(src.ckpt->init_from, ec))
      tokenizer = src.ckpt->init_from;
    else
      STRATA_LOG_WARN("export: the run started from ", src.ckpt->init_from,
                      ", which is gone: no tokenizer files are copied (give --tokenizer-from DIR)");
  }
  if (tokenizer.empty() && src.hf && !src.hf->dir.empty()) tokenizer = src.hf->dir;
  std::fprintf(stderr, "export: model '%s' (%lld parameters) from %s\n", src.config().name.c_str(),
               (long long)src.config().num_parameters(), src.where().c_str());
  // fp32 from a checkpoint: its fp32 masters (as DeepSpeed's zero_to_fp32), not its working params widened.
  const bool masters = dtype == DType::fp32 && has_master_weights(src);
  if (masters) std::fprintf(stderr, "export: --dtype fp32 writes the checkpoint's fp32 master weights\n");
  std::unique_ptr<model::InMemoryChunks> params =
      load_params(src, masters ? CheckpointWeights::master : CheckpointWeights::working);
  model::save_pretrained(o.out, *params, dtype, {.max_shard_bytes = max_shard, .source_dir = tokenizer});
  std::printf("exported %s to %s (Hugging Face directory, %s%s)\n", src.where().c_str(), o.out.c_str(),
              o.dtype.c_str(), tokenizer.empty() ? "" : cat(", tokenizer from ", tokenizer).c_str());
  return 0;
}

Command export_cmd("export", "Write a checkpoint as a Hugging Face model directory", [](CLI::App& sub) {
  auto o = std::make_shared<ExportOpts>();
  sub.add_option("CHECKPOINT", o->source,
                 "Checkpoint directory of `strata train --save` (DIR with `latest`, or DIR/TAG), or a model "
                 "directory / .safetensors file")
      ->required();
  sub.add_option("OUT_DIR", o->out, "Directory to write the model to (created)")->required();
  sub.add_option("--dtype", o->dtype, "Weights dtype: bf16 (default), fp16 or fp32");
  sub.add_option("--tokenizer-from", o->tokenizer_from,
                 "Copy the tokenizer files of this model directory (default: the run's --init-from)");
  sub.add_option("--max-shard-size", o->max_shard, "Largest weights file (default 5GB, as transformers)");
  return [o] { return run_export(*o); };
});

}  // namespace
}  // namespace strata::cli
