// Internal to zero3: the gradient path — the engine's part that hands the model gradient buffers, takes
// each back as the chunk's backward ends (reduce-scatter at N ranks, accumulation on the device or into
// the fp32 shard), and gives step() the gradients' norm and finiteness. Notes [Gradients off the device]
// and [Stage 1 accumulates locally] in engine_grads.cpp.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "zero3/engine_gate.h"
#include "zero3/engine_state.h"

namespace strata::zero3 {

// The gradient path's own per-chunk state. Written by GradientPath only.
struct GradEntry {
  // The gradient buffer handed to the model (device, fp32, numel), between acquire_grads and release:
  // registered once and pinned, its device block allocated only while in use.
  tiering::TensorId gradbuf = 0;
  float* gbuf = nullptr;  // non-null while handed out
  // The route's device accumulator (ChunkSlot::accumulates(); device, fp32: shard.numel, the local one
  // numel), live from the step's first hand-off to its flush; while it is, the shard holds nothing.
  tiering::TensorId accbuf = 0;
  float* acc = nullptr;
  bool grads_fresh = true;            // no gradient has reached this chunk yet this step
  std::unique_ptr<Event> handed_off;  // the gradient stream's copy of the gradient buffer
  std::unique_ptr<Event> computed;    // the compute stream at the hand-off: the model's ops on the buffer
};

class GradientPath {
 public:
  GradientPath(const EngineEnv& env, DeviceRoom& room, UpdateGate& gate)
      : env_(env), room_(room), gate_(gate) {}

  // The engine's construction made chunk s (in chunk order): its gradient buffer and accumulator registered.
  void add_chunk(const ChunkSlot& s);
  // After the chunks exist: the pinned staging for accumulation into pinned shards, and with gradients on
  // a device reached by stream work only the per-chunk statistics tensor there.
  void open();
  const GradEntry& entry(int c) const { return entries_[std::size_t(c)]; }

  // ---- the model's acquire_grads / release_grads (model::ChunkProvider) ----
  float* acquire_grads(int c);
  void release_grads(int c);

  // A backward starts (BackwardStart.ends_step: it ends the step's accumulation) / completed: its hand-offs
  // per chunk become the expected ones (a chunk's hand-off is final in the step's last backward when it is
  // its expected-th).
  void begin_backward(const BackwardStart& b);
  // A step begins (after step(), or a checkpoint load): no gradient has reached any chunk yet.
  void new_step();
  void end_backward();
  // The step's last backward ended, or step() came early: what still accumulates on the device crosses.
  void flush_accumulators();
  // Waits for every gradient still travelling (raises a failed copy or add).
  void sync();
  // The squared norm and finiteness of every chunk's gradients over every rank's shards (zeroing the
  // shards no gradient reached), summed in chunk order.
  void stats(double& sum_sq, bool& finite);

  // What the gradient path counted: its hand-offs, crossings and reductions (TransferStats' grad fields),
  // and the seconds the host waited while the compute stream was idle since the last take_wait().
  const TransferStats& transfers() const { return transfers_; }
  double take_wait() { return std::exchange(wait_, 0.0); }

 private:
  // The stream a hand-off of chunk s ends on (UpdateRoute::Handoff).
  Stream& handoff_stream(const ChunkSlot& s) const {
    return s.route.handoff == UpdateRoute::Handoff::compute_stream ? *env_.compute_stream : *env_.grad_stream;
  }
  // Records the gradient stream's work enqueued so far on chunk s (GradEntry::handed_off: its hand-off's
  // copies and adds) and returns it, for the frees and writes that follow the hand-off.
  Event& record_handoff(const ChunkSlot& s);
  // Records the compute stream's work enqueued so far on chunk s (GradEntry::computed) and returns it.
  // Waits and frees made after it take that point (an event's later records do not move them).
  Event& computed(const ChunkSlot& s);
  bool final_handoff(const ChunkSlot& s) const {
    const int n = expected_[std::size_t(s.id)];
    return last_micro_ && n > 0 && seen_[std::size_t(s.id)] == n;
  }
  // Hands this rank's slice `src` (in device block `buffer`, freed once read) to the chunk's fp32 gradient
  // shard: copied into it when it is empty this step, else added (Note [Gradients off the device]).
  void hand_to_shard(const ChunkSlot& s, const float* src, tiering::TensorId buffer, bool final);
  // Copies a live device accumulator into its (empty) pinned shard on the gradient stream and frees it
  // after the copy.
  void flush_accumulator(const ChunkSlot& s);
  // Sums chunk s's whole gradients `whole` (device, numel) over the ranks in place on the gradient stream,
  // leaving this rank's slice at shard.offset (Note [Ranks]), counted.
  void reduce_scatter(const ChunkSlot& s, float* whole);
  // Stage 1's local accumulator: reduce-scattered, its slice handed to the shard, freed (Note [Stage 1
  // accumulates locally]).
  void flush_local_accumulator(const ChunkSlot& s);
  // dst += src (fp32, one add per element) on the CPU optimizer's threads: the gradient stream's add of a
  // staged gradient into a pinned shard.
  void add_on_host(float* dst, const float* src, std::size_t n);
  // Note [Gradients through NVMe]: chunk `s`'s fp32 gradients at device address `src` to its NVMe shard,
  // through the pool's staging block and a pinned block (`fresh`: the shard is empty this step;
  // `with_stats`: take its statistics on the way). to_nvme is the gradient stream's part: staged into the
  // block, and the stats.
  void stage_for_nvme(const ChunkSlot& s, const float* src, bool fresh, bool with_stats);
  // The staging block of gradients on their way to NVMe: taken from the tier manager's pinned pool at the
  // first crossing of a step, given back once the step's writes are drained (sync), so that it shares the
  // pool's room with the optimizer's window (Note [Host memory bounded by buffers] in placement.cpp).
  float* nvme_staging();
  void release_nvme_staging();
  void to_nvme(const ChunkSlot& s, float* dst, const float* staged, bool fresh, bool with_stats);
  // stats() in pieces: the NVMe shards' statistics made whole (zeros for a shard no gradient reached, a
  // read back for one without them); chunk i's statistics taken before stats() (on the way to NVMe, or by
  // the overlap's worker), or null; N ranks' host shards summed by their blocks' partials over every rank;
  // the device's reductions read back (summed over the ranks at N).
  void settle_nvme_stats();
  const ShardNorm* taken_norm(std::size_t i) const;
  void sum_block_norms(double& sum_sq, bool& finite);
  void sum_device_norms(double& sum_sq, bool& finite);
  // Waits for the NVMe gradient writes still in flight (raising a failed one).
  void drain_nvme_writes();
  // Waits for the oldest write in flight; a failed one raises its error with the chunk and the bytes.
  void finish_oldest_write();
  // "writing the fp32 gradients of chunk block.3 (N bytes) to NVMe: "
  std::string write_context(int chunk) const;

  const EngineEnv& env_;
  DeviceRoom& room_;
  UpdateGate& gate_;
  std::vector<GradEntry> entries_;  // per chunk
  // Gradient hand-offs per chunk in the last complete backward (0: unknown) and in this one.
  std::vector<int> expected_, seen_;
  bool last_micro_ = true;  // the backward in progress ends the step's accumulation
  // Pinned staging for a gradient buffer on its way to a pinned shard that already holds gradients
  // (accumulation): copied off the device here, then added on the host. (largest shard)
  PinnedBuffer staging_;
  // The same for shards on NVMe, a tensor of the tier manager's (nvme_staging); its block while held.
  tiering::TensorId nvme_staging_id_ = 0;
  float* nvme_staged_ = nullptr;
  // Note [Gradients through NVMe]: the writes of gradient shards to NVMe in flight, oldest first, with
  // their chunks (touched by the gradient stream's host functions, and by the training thread only after
  // that stream is synchronised); and each chunk's statistics taken on the way out in the step's last
  // backward (valid until stats() reads them).
  struct NvmeWrite {
    int chunk = 0;
    tiering::Move move;
  };
  std::deque<NvmeWrite> nvme_writes_;
  std::vector<ShardNorm> out_stats_;
  // by_ops: the per-chunk gradient statistics on the device (16 bytes a chunk: the fp64 squared norm and the
  // int32 non-finite flag), a tensor of the device state.
  tiering::TensorId stats_id_ = 0;
  char* stats_ = nullptr;
  TransferStats transfers_;
  double wait_ = 0;
};

}  // namespace strata::zero3
