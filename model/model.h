// strata/model/model.h: the model module's public header — a Llama-style decoder to train, its sizes,
// its parameters as chunks, its data, and its weight files. Each concern has its own header, included
// here; see docs/model.md.
//
// Example (train the 10m preset on a text file, on the CPU, then export the weights):
//   using namespace strata::model;
//   ModelConfig cfg = ModelConfig::preset("10m");                       // config.h
//   ByteTokenizer::text_file_to_tokens("book.txt", "book.bin");         // tokenizer.h
//   TokenFile file = TokenFile::open("book.bin");                       // token_file.h
//   DataLoader data(file, {.batch_size = 8, .seq_len = 256, .seed = 1,  // data_loader.h
//                          .vocab_size = cfg.vocab_size});
//   InMemoryChunks chunks{ModelLayout(cfg)};                            // chunk.h, layout.h
//   chunks.init(/*seed=*/1);
//   LlamaModel model(cfg, {.checkpoint_activations = true});            // llama.h
//   for (int step = 1; step <= 100; ++step) {
//     Batch b = data.next();
//     chunks.zero_grads();
//     float loss = model.forward(chunks, b.inputs.data(), b.targets.data(), b.rows, b.seq_len);
//     model.backward(chunks);
//     // optimizer over chunks.all_params() / chunks.all_grads() (kernels::cpu::adamw_update, cpu_optim)
//   }
//   save_weights("out/model.safetensors", chunks, DType::bf16);         // safetensors.h
//
// The engine (zero3/) implements ChunkProvider instead of InMemoryChunks; the model code is the same.
#pragma once

#include "model/architecture.h"
#include "model/chunk.h"
#include "model/config.h"
#include "model/data_loader.h"
#include "model/device_chunks.h"
#include "model/dtype.h"
#include "model/layout.h"
#include "model/llama.h"
#include "model/loss_mask.h"
#include "model/profile.h"
#include "model/safetensors.h"
#include "model/token_file.h"
#include "model/tokenizer.h"
