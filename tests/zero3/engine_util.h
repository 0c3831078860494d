// Helpers for the engine tests: the scratch directory (tests/common), configs for each offload placement, a
// token file to train on, and short training runs that return their per-step losses.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/config.h"
#include "kernels/cpu/ops.h"
#include "model/model.h"
#include "tests/common/scratch_dir.h"
#include "zero3/engine.h"

namespace strata::zero3::test {

using strata::test::ScratchDir;  // tests/common/scratch_dir.h

inline const char* name(OffloadDevice d) {
  return offload_name(d);  // zero3/placement.h
}

// A parameterised test's name for (offload_param, offload_optimizer, device state by ops).
inline std::string placement_name(OffloadDevice param, OffloadDevice optim, bool by_ops) {
  return std::string("param_") + name(param) + "_optimizer_" + name(optim) + (by_ops ? "_by_ops" : "");
}

// A byte-vocabulary model of `layers` blocks of 213,248 parameters each (d_model 128, ffn 384, 4 heads):
// 833 KiB per block gathered in fp32, above DeepSpeed's default persistence threshold of 1e5 elements;
// the embedding and head (32,768 each) below it.
inline model::ModelConfig block_model(const std::string& name, int layers) {
  model::ModelConfig c;
  c.name = name;
  c.vocab_size = 256;
  c.d_model = 128;
  c.n_layers = layers;
  c.n_heads = 4;
  c.n_kv_heads = 4;
  c.ffn_dim = 384;
  c.max_seq_len = 64;
  return c;
}

// A ZeRO-3 config with the given offload targets (NVMe under `nvme_dir`), small sub-groups so that the
// swap pipeline has several, bf16 by default; `extra` is merged over it.
inline Config make_config(OffloadDevice param, OffloadDevice optim, const std::string& nvme_dir,
                          const nlohmann::json& extra = nlohmann::json::object(), int world_size = 1) {
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", 2},
      {"gradient_accumulation_steps", 2},
      {"gradient_clipping", 1.0},
      {"bf16", {{"enabled", true}}},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.01}}}}},
      {"zero_optimization",
       {{"stage", 3},
        {"sub_group_size", 20000},
        {"stage3_prefetch_bucket_size", 20000},
        {"stage3_param_persistence_threshold", 0},
        {"offload_param", {{"device", name(param)}}},
        {"offload_optimizer",
         {{"device", name(optim)}, {"pipeline_read", true}, {"pipeline_write", true}, {"buffer_count", 9}}}}},
      {"strata", {{"backend", "host"}, {"seed", 7}, {"cpu_optim", {{"pin_threads", false}}}}},
  };
  if (param == OffloadDevice::nvme) j["zero_optimization"]["offload_param"]["nvme_path"] = nvme_dir;
  if (optim == OffloadDevice::nvme) j["zero_optimization"]["offload_optimizer"]["nvme_path"] = nvme_dir;
  j.merge_patch(extra);
  // Through text: core's size keys accept only JSON's unsigned integers, which a document built in C++
  // with int literals does not have (they are signed until dumped and parsed again).
  return Config::parse(nlohmann::json::parse(j.dump()), {}, world_size);
}

// A token file of byte-level "text" with structure a model can learn (repeated phrases).
inline std::string make_tokens(const ScratchDir& d, std::size_t n = 20000) {
  const std::string phrase = "the quick brown fox jumps over the lazy dog. strata trains big models. ";
  std::vector<std::uint32_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = std::uint8_t(phrase[(i * 7 / 5 + i / 97) % phrase.size()]);
  const std::string path = d.file("tokens.bin");
  model::write_token_file(path, t, model::TokenType::u16);
  return path;
}

struct Run {
  std::vector<double> losses;
  std::vector<bool> applied;
};

// The device bytes the compute interface of an engine of `cfg` and `mcfg` takes of its own
// (MemoryPlan.device_ops: the matrix products' workspace — cuBLASLt's 32 MiB on cuda, the CPU ops' stand-in
// of the same size on the host, tests/common/workspace_standin.cpp — and the ops' scratch for the model's
// shapes), read from an engine with `opts` and the config's cap. A test that caps the device gives it this
// plus the room it means to give the rest: a cap that leaves it out holds on the host alone.
inline std::uint64_t ops_device_bytes(const Config& cfg, const model::ModelConfig& mcfg, EngineOptions opts) {
  opts.device_memory_cap = 0;
  return Engine(cfg, mcfg, opts).plan().device_ops;
}

// `steps` optimizer steps of `mcfg` under `cfg` from a fresh engine.
inline Run train(const Config& cfg, const model::ModelConfig& mcfg, const std::string& tokens, int steps,
                 int seq_len = 32, EngineOptions opts = {}) {
  kernels::cpu::set_blas_threads(1);  // one fixed thread count: matrix products are then bit-reproducible
  if (opts.seq_len == 0) opts.seq_len = seq_len;
  Engine engine(cfg, mcfg, opts);
  model::TokenFile file = model::TokenFile::open(tokens);
  model::DataLoader data(
      file,
      {.batch_size = engine.micro_batch(), .seq_len = seq_len, .seed = 3, .vocab_size = mcfg.vocab_size});
  model::LlamaModel m(mcfg, engine.model_options());
  Run r;
  for (int i = 0; i < steps; ++i) {
    StepResult s = engine.train_batch(m, data);
    r.losses.push_back(s.loss);
    r.applied.push_back(s.applied);
  }
  return r;
}

// Two runs as one: `before` steps under `first`, a checkpoint in `ckpt`, then `after` steps of a new engine
// under `second` loaded from it (32 tokens a row). Returns every step's loss.
inline std::vector<double> resumed_losses(const Config& first, const Config& second,
                                          const model::ModelConfig& mcfg, const std::string& tokens,
                                          const std::string& ckpt, const EngineOptions& opts, int before,
                                          int after) {
  kernels::cpu::set_blas_threads(1);
  model::TokenFile file = model::TokenFile::open(tokens);
  const model::DataOptions shape{.batch_size = 0, .seq_len = 32, .seed = 3, .vocab_size = mcfg.vocab_size};
  std::vector<double> losses;
  {
    Engine e(first, mcfg, opts);
    model::DataOptions d = shape;
    d.batch_size = e.micro_batch();
    model::DataLoader data(file, d);
    model::LlamaModel m(mcfg, e.model_options());
    for (int i = 0; i < before; ++i) losses.push_back(e.train_batch(m, data).loss);
    e.save_checkpoint(ckpt, {}, &data);
  }
  Engine e(second, mcfg, opts);
  model::DataOptions d = shape;
  d.batch_size = e.micro_batch();
  model::DataLoader data(file, d);
  e.load_checkpoint(ckpt, "", &data);
  model::LlamaModel m(mcfg, e.model_options());
  for (int i = 0; i < after; ++i) losses.push_back(e.train_batch(m, data).loss);
  return losses;
}

// The tiny preset training under `cfg` on `tokens`, 32 tokens a row: an engine with its data loader
// (this rank's DistributedSampler slice under `c`; one rank without) and model, kept between calls of
// run() — for checkpoint tests that save from one and load into another.
struct Trainer {
  Trainer(const Config& cfg, const std::string& tokens, comm::Communicator* c = nullptr)
      : mcfg(model::ModelConfig::preset("tiny")),
        engine(cfg, mcfg, {.backend = "host", .device_memory_cap = 0, .seq_len = 32, .communicator = c}),
        file(model::TokenFile::open(tokens)),
        data(file, {.batch_size = engine.micro_batch(),
                    .seq_len = 32,
                    .rank = c ? c->rank() : 0,
                    .world = c ? c->world_size() : 1,
                    .seed = 3,
                    .vocab_size = 256}),
        m(mcfg, engine.model_options()) {
    kernels::cpu::set_blas_threads(1);
  }
  std::vector<double> run(int steps) {
    std::vector<double> l;
    for (int i = 0; i < steps; ++i) l.push_back(engine.train_batch(m, data).loss);
    return l;
  }
  model::ModelConfig mcfg;
  Engine engine;
  model::TokenFile file;
  model::DataLoader data;
  model::LlamaModel m;
};

}  // namespace strata::zero3::test
