// strata/zero3/zero3.h: the ZeRO-3 offload engine and the pieces of a training run around it.
//
// Example:
//   #include "zero3/zero3.h"
//   strata::Config cfg = strata::Config::load("configs/zero3_nvme.json");
//   strata::zero3::Engine engine(cfg, strata::model::ModelConfig::preset("1b"),
//                                {.backend = "host", .device_memory_cap = 1ull << 30, .seq_len = 1024});
//   auto model = strata::model::make_model(engine.layout().config(), engine.model_options());
//   for (int i = 0; i < steps; ++i) engine.train_batch(*model, data);      // forward, backward, step
//   engine.save_checkpoint("ckpt", {{"note", "nightly"}}, &data);
//
// One concern per header:
//   zero3/engine.h        Engine: chunks in their tiers, acquire/release for the model, gradients off the
//                         device, the optimizer step (in place or NVMe swap pipeline), checkpoints
//   zero3/loss_scaler.h   fp16 dynamic loss scaling (DeepSpeed's keys) and the unscale/clip factor
//   zero3/lr_schedule.h   WarmupLR, WarmupDecayLR, WarmupCosineLR with DeepSpeed's arithmetic
//   zero3/checkpoint.h    the checkpoint directory format: atomic tags, latest, shard files, checksums
//   zero3/checksum.h      CRC-32C
// docs/train.md describes a run end to end; `strata train` (tools/cmd_train.cpp) is the command.
#pragma once

#include "zero3/checkpoint.h"
#include "zero3/checksum.h"
#include "zero3/engine.h"
#include "zero3/loss_scaler.h"
#include "zero3/lr_schedule.h"
