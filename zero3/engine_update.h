// Internal to zero3: the updater — the engine's part that steps each chunk the way its route says (the CPU
// optimizer, the NVMe swap pipeline, the compute interface's optimizer, the host's device optimizer on
// the model's cpus) and writes the new working params home. Notes [The optimizer's tail] and [NVMe swap
// pipeline] in engine_update.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "zero3/engine_gate.h"
#include "zero3/engine_state.h"

namespace strata::zero3 {

class Updater {
 public:
  Updater(const EngineEnv& env, DeviceRoom& room) : env_(env), room_(room) {}

  // After the plan and the chunks: each chunk's optimizer step bookkeeping, and pinned staging for the new
  // working params of a device home the CPU steps.
  void open();
  // The update of `chunks` (those the overlap did not make during backward) at rate `lr`, gradient factor
  // and step number: in addressable memory, with a share on the model's idle cpus where the routes allow
  // (update_rest); through the NVMe pipeline by sub-group where the routes say so. Returns when every new
  // working param is home.
  void update(const std::vector<int>& chunks, double lr, float factor, std::int64_t step_no);
  // The CPU optimizer's update of one chunk from its fp32 gradients `g` (`with`: another cpu_optim::Optimizer
  // than the engine's), the new working params to `out`.
  void update_chunk(const ChunkSlot& s, const float* g, float* master, float* m, float* v, void* out,
                    double lr, float factor, std::int64_t step_no, cpu_optim::Optimizer* with = nullptr);
  // The same update of any `n`-element shard whose bookkeeping is `st` (the offload ratio's timed sample).
  void step_shard(cpu_optim::ShardStep& st, std::size_t n, const float* g, float* master, float* m, float* v,
                  void* out, double lr, float factor, std::int64_t step_no,
                  cpu_optim::Optimizer* with = nullptr) const;
  // Chunk c's optimizer step bookkeeping (the updater's own per-chunk state: written by its updates),
  // read by the overlap before an early update, put back by a rollback, or read from a checkpoint.
  const cpu_optim::ShardStep& shard_step(int c) const { return steps_[std::size_t(c)]; }
  void set_shard_step(int c, cpu_optim::ShardStep st) { steps_[std::size_t(c)] = st; }
  // Who stepped the chunks (UpdateStats), and the seconds the host waited while the compute stream was
  // idle since the last take_wait().
  const UpdateStats& stats() const { return updates_; }
  double take_wait() { return std::exchange(wait_, 0.0); }
  // The host backend's device optimizer: the SIMD CPU optimizer with its own threads on the cpus the model's
  // ops compute on (compute_cpus; every cpu when the cores are shared), run from the compute stream. Made on
  // first use.
  cpu_optim::Optimizer& host_device_optimizer();
  // The config's Adam/AdamW hyper-parameters at rate `lr`, for the device optimizer (Ops::adamw).
  kernels::Ops::AdamW device_adamw(double lr) const;

 private:
  void update_group(const std::vector<int>& group, double lr, float factor, std::int64_t step_no,
                    std::vector<tiering::Move>& writes);
  // The chunks with the optimizer in addressable memory: update_group, with a share of the CPU optimizer's
  // work on the model's idle cpus (Note [The optimizer's tail]).
  void update_rest(const std::vector<int>& chunks, double lr, float factor, std::int64_t step_no,
                   std::vector<tiering::Move>& writes);
  // Note [NVMe swap pipeline]: every sub-group, the swapped ones' states read from NVMe and written back.
  void update_through_nvme(double lr, float factor, std::int64_t step_no);
  // The compute interface's AdamW on the compute stream (Stepper::device_ops), the new working params to
  // their home (through the device's scratch and pinned staging when that home is host memory).
  void update_chunk_on_device(const ChunkSlot& s, void* out, double lr, float factor, std::int64_t step_no);
  // The host backend's direct path: the device optimizer's updates enqueued (their new working params
  // written straight home), finished by finish_device_updates after the CPU optimizer's share of the step:
  // the compute stream is waited for and the params' writes issued.
  void update_on_model_cpus(const ChunkSlot& s, double lr, float factor, std::int64_t step_no);
  void finish_device_updates(std::vector<tiering::Move>& writes);
  // Where the update writes the new working params (the route's Params), and after it: staged ones to the
  // device, NVMe ones written out.
  void* param_out(const ChunkSlot& s);
  void param_written(const ChunkSlot& s, std::vector<tiering::Move>& writes);
  void wait_all(std::vector<tiering::Move>& moves);

  const EngineEnv& env_;
  DeviceRoom& room_;
  std::vector<cpu_optim::ShardStep> steps_;  // per chunk
  std::unique_ptr<cpu_optim::Optimizer> device_opt_;
  std::vector<int> device_updates_;
  // Pinned staging for new working params that the CPU optimizer computes for a device home reached by
  // stream work only (largest shard, working dtype).
  PinnedBuffer param_staging_;
  // Device scratch for the new working params the device optimizer computes for a home in host memory
  // (largest shard, working dtype): a block only during the update (update_chunk_on_device).
  tiering::TensorId scratch_id_ = 0;
  UpdateStats updates_;
  double wait_ = 0;
};

}  // namespace strata::zero3
