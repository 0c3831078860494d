// Internal to zero3: the environment the engine's parts share (Note [Engine parts] in engine_impl.h) — the
// config, the device, its streams and ops, the ranks, the tier manager, the plan and its chunks — read-only
// to every part. One training thread calls every part; the gather and gradient streams run host functions
// that touch only the buffers they were handed and what their part gave them (a gather's error slot).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "cpu_optim/cpu_optim.h"
#include "cpu_optim/rule.h"
#include "model/nf4_chunk.h"
#include "nvme/engine.h"
#include "nvme/swap_store.h"
#include "tiering/trace_writer.h"
#include "zero3/engine.h"

namespace strata::zero3 {

using tiering::Tier;
using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// StepTimes.wait: the time the host was blocked while the compute stream had nothing running. Where the
// backend measures the stream's busy time (host: the model's ops run on the compute stream's thread), a
// block that only waited for computation to drain counts nothing; on cuda busy_seconds is 0, so the
// figure is the blocked time.
struct WaitTimer {
  explicit WaitTimer(const Stream& compute) : compute_(compute), busy0_(compute.busy_seconds()) {}
  double idle_seconds() const {
    const double blocked = seconds_since(t0_);
    return std::clamp(blocked - (compute_.busy_seconds() - busy0_), 0.0, blocked);
  }

 private:
  const Stream& compute_;
  Clock::time_point t0_ = Clock::now();
  double busy0_;
};

// One chunk as the plan laid it out: its shard's five tensors in the tier manager, their homes and stable
// addresses, and its route. Set once by the engine's construction, then read by every part, never written:
// what each part keeps per chunk is its own (ChunkCache's CacheEntry, GradientPath's GradEntry, Updater's
// ShardStep), so no part writes another's per-chunk state.
struct ChunkSlot {
  int id = 0;
  std::string name;        // "block.3"
  std::size_t numel = 0;   // gathered elements (padded_numel)
  comm::ShardRange shard;  // this rank's slice of the chunk
  // Its working-param tensor's elements and where this rank's slice starts in it (PlannedChunk): the
  // shard at 0, or (replicated) the whole chunk, the slice at shard.offset.
  std::size_t param_numel = 0, param_offset = 0;
  tiering::ShardTensors tensors;  // param (working dtype), grad, master, exp_avg, exp_avg_sq (fp32)
  // Their homes: the config's (EngineEnv::homes), or with master, states and gradients on the device when
  // offload_optimizer.ratio keeps the chunk's sub-group there.
  tiering::ShardHomes homes;
  // How it is updated, as the plan decided (Note [Update routes] in placement.cpp).
  UpdateRoute route;
  // Below stage3_param_persistence_threshold: kept gathered after release whatever its reuse distance
  // (in the cache, which gives way to what the model holds: Note [Device room]).
  bool persistent = false;
  // Device budget bytes (allocator blocks) of its gathered copy (activation dtype) and gradient buffer
  // (fp32).
  std::uint64_t gather_block = 0, grad_block = 0;
  // A chunk of an NF4 base (Note [NF4 base] in model/nf4_chunk.h; frozen, whole on every rank): its working
  // copy's packed layout, and the absmax offsets its gathers pass beside the bytes (set at initialisation).
  // Null for every other chunk.
  std::shared_ptr<const model::Nf4Chunk> nf4;
  std::vector<float> nf4_offsets;

  // Stable addresses of the tensors whose home is the device or pinned host memory (pinned in the tier
  // manager, so never moved); null for NVMe-resident ones. The pointees are the parts' to write as their
  // routes say (the gradient path the gradient shard, the updater the master, states and working params).
  void* param_home = nullptr;  // (param_numel) working dtype
  float* grad = nullptr;       // (shard.numel) fp32 gradient shard
  float* master = nullptr;     // (shard.numel) fp32
  float* exp_avg = nullptr;    // (shard.numel) fp32
  float* exp_avg_sq = nullptr;

  // The route sums its gradients on the device (Note [Gradients off the device]; stage 1's local
  // accumulator: Note [Stage 1 accumulates locally]) and crosses to the shard once per step.
  bool accumulates() const {
    return route.grads == UpdateRoute::Grads::device_accumulator ||
           route.grads == UpdateRoute::Grads::local_accumulator;
  }
};

// The environment every part of the engine reads: the config, the device, its streams and ops, the ranks,
// the tier manager, the plan and the chunks it laid out. Made by Engine::Impl's construction (engine.cpp,
// engine_plan.cpp), before any part runs; the parts hold it const. What changes from step to step — the
// step counters, the loss scale and rate, the pass — is Engine::Impl's (engine_impl.h) and reaches a part
// as an argument; what a part counts (its transfers, its waits) is the part's own.
struct EngineEnv {
  EngineEnv(const Config& cfg, const model::ModelConfig& mcfg, const EngineOptions& opts);

  Config cfg;
  model::ModelConfig mcfg;
  model::ModelLayout layout;
  EngineOptions opts;
  DType working_dtype = DType::bf16;  // of the working params (bf16, fp16 or fp32)
  tiering::ShardHomes homes;
  // The optimizer the config names: its states (exp_avg, exp_avg_sq), name and hyper-parameters.
  cpu_optim::Rule rule;

  std::unique_ptr<Device> dev;
  // The ranks: `comm` for the training thread's collectives (norms, losses, checkpoints), one dup for
  // each stream that issues collectives in its own order (gathers, gradients). `owned_comm` when the
  // engine made it. Note [Ranks] in engine_cache.cpp.
  std::unique_ptr<comm::Communicator> owned_comm, gather_comm, grad_comm;
  comm::Communicator* comm = nullptr;
  int world = 1;
  // ZeRO stages 1 and 2 over N ranks: every rank keeps the whole chunk's working params (at home on the
  // device); only the gradients (stage 2), the master and the optimizer states are partitioned. Then the
  // param tensor is the chunk, and this rank's slice of it starts at shard.offset.
  bool replicated = false;
  std::unique_ptr<nvme::AioEngine> aio;
  std::unique_ptr<nvme::SwapStore> swap;
  std::unique_ptr<tiering::TierManager> tm;
  std::unique_ptr<tiering::TraceWriter> trace;
  // The streams, then the compute interface on each (declared after them: destroyed first, as an Ops
  // waits for its stream's work when it goes). Only `ops` has the model role (the matrix products'
  // workspace, the attention library's handle); the copy streams' are runtime-role (kernels/ops.h).
  std::unique_ptr<Stream> gather_stream, grad_stream, compute_stream;
  std::unique_ptr<kernels::Ops> ops;         // on compute_stream: the model's ops, gradient adds
  std::unique_ptr<kernels::Ops> gather_ops;  // on gather_stream: the gathers' casts
  std::unique_ptr<kernels::Ops> grad_ops;    // on grad_stream: reduced and accumulated gradients
  DType act = DType::fp32;                   // the ops' activation dtype: gathered chunks hold it
  // State at home on the device is reached by stream work only (EngineOptions.testing.device_state_by_ops, or
  // a device the CPU cannot address): the CPU never dereferences a device pointer.
  bool by_ops = false;
  // The rank's cpus, split between the CPU optimizer and the host backend's compute (Note [Cores] in
  // engine_plan.cpp).
  std::vector<int> compute_cpus, optimizer_cpus;
  // The CPU optimizer (and its threads' reductions and adds). Several threads may call it at once
  // (cpu_optim.h), which the training thread and the overlap's worker do.
  std::unique_ptr<cpu_optim::Optimizer> opt;
  // The plan (zero3/placement.h) and what it was made from; the chunks and optimizer sub-groups it laid out.
  MemoryPlan plan;
  PlanInput planned;
  std::vector<ChunkSlot> slots;
  std::vector<std::vector<int>> groups;  // optimizer sub-groups: consecutive chunks, <= sub_group_size
  std::size_t group_window = 1;          // NVMe sub-groups whose states may be in pinned memory at once
  std::uint64_t largest_shard = 0;       // elements

  std::size_t working_dtype_bytes() const { return std::size_t(dtype_bytes(working_dtype)); }
  // Bytes of a chunk's working-param tensor (packed for an NF4 base's chunk).
  std::size_t param_bytes(const ChunkSlot& s) const {
    return s.nf4 ? s.nf4->bytes : s.param_numel * working_dtype_bytes();
  }
  // This rank's slice of the working params at their home (device or pinned memory).
  void* my_params(const ChunkSlot& s) const {
    return static_cast<char*>(s.param_home) + s.param_offset * dtype_bytes(working_dtype);
  }
  // The optimizer's tensors of a chunk: its master and the states the optimizer type keeps.
  std::vector<tiering::TensorId> optimizer_tensors(const ChunkSlot& s) const;
  // Synchronous copies between host memory and device memory, on the compute stream (ordered after the
  // ops that wrote the device side): initialisation, checkpoints and staged params when `by_ops`.
  void to_device(void* dst, const void* src, std::size_t bytes) const;
  void from_device(void* dst, const void* src, std::size_t bytes) const;
  // Calls fn(ptr) with a host-readable copy of tensor `id` (fetched from NVMe into pinned memory if that is
  // the only copy, and dropped again after).
  template <typename Fn>
  void with_host_copy(tiering::TensorId id, Fn&& fn) const {
    const tiering::TierMask valid = tm->info(id).valid;
    if (tiering::has(valid, Tier::pinned)) return fn(static_cast<const void*>(tm->data(id, Tier::pinned)));
    if (tiering::has(valid, Tier::device)) {
      if (!by_ops) return fn(static_cast<const void*>(tm->data(id, Tier::device)));
      std::vector<std::byte> host(tm->info(id).desc.bytes);
      from_device(host.data(), tm->data(id, Tier::device), host.size());
      return fn(static_cast<const void*>(host.data()));
    }
    tm->pin(id);
    try {
      tm->fetch(id, Tier::pinned).wait();
      fn(static_cast<const void*>(tm->data(id, Tier::pinned)));
    } catch (...) {
      tm->unpin(id);
      throw;
    }
    tm->unpin(id);
    tm->evict(id, Tier::pinned, Tier::nvme);  // the NVMe copy is still valid: the pinned one is dropped
  }
};

// A gradient shard's part of step()'s norm, by the CPU optimizer's reductions (the route's Norm): its squared
// norm and finiteness at one rank, or its per-block partial sums at N (Note [Ranks]). One function for
// the gradient path and the overlap's worker (engine_grads.cpp), so both take the same sums.
struct ShardNorm {
  bool valid = false;
  double sum_sq = 0;
  bool finite = true;
  std::vector<double> blocks;
};
ShardNorm shard_norm(const UpdateRoute& r, cpu_optim::Optimizer& opt, const float* g, std::size_t n);

// Bytes of RAM (0: unknown).
std::uint64_t physical_memory();
// The aio settings of the config (strata.aio.backend, the aio block), as the swap files use them.
nvme::AioOptions aio_options(const Config& cfg);

}  // namespace strata::zero3
