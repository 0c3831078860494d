// Internal to zero3: the two narrow interfaces between the engine's parts (Note [Engine parts] in
// engine_impl.h), so that no part depends on another that depends back on it:
//
//   UpdateGate  what the chunk cache and the gradient path ask of the optimizer overlap: wait for a chunk's
//               update left to after the step before its params or gradients are touched, put back what
//               was updated during backward before an evaluation reads the params, hear of a final
//               gradient hand-off, and give the gradient statistics taken early. OptimizerOverlap
//               implements it.
//   DeviceRoom  what the updater asks of the chunk cache: a device block (dropping cached chunks to make
//               room), and the write-through of new working params to NVMe with the cache's pinned copy.
//               ChunkCache implements it.
//
// So the cache knows no overlap and the updater no cache: the overlap drives the updater, the updater
// asks for room, the cache and the gradient path pass the gate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "zero3/engine_state.h"

namespace strata::zero3 {

// How undo() counts what it puts back (OverlapStats): a rollback (step() found the updates' assumption
// false, or the step skipped) or a cancellation (anything else that must see the state before the step).
enum class UndoAs : std::uint8_t { cancellation, rollback };

// Whom a device block is for (DeviceRoom::device_alloc): a prefetch, which gets none when the allocator
// refuses, or a demand (the chunk being acquired, a gradient buffer, scratch), which drops cached chunks
// until it fits.
enum class AllocFor : std::uint8_t { prefetch, demand };

// What a backward is about to be, as the engine's step bookkeeping says (Engine::backward): whether it
// ends the step's accumulation (its final hand-offs are the step's), and the rate, gradient factor and
// step number the step would apply if it applied unclipped (what early updates assume).
struct BackwardStart {
  bool ends_step = true;
  double lr = 0;
  float unclipped_factor = 1;  // 1 / loss scale
  std::int64_t step_no = 0;
};

class UpdateGate {
 public:
  // Waits for chunk c's update left to after the step (deferred); rethrows one that failed.
  virtual void settle(int c) = 0;
  // Undoes every update made during backward, counting it `as` a rollback or a cancellation.
  virtual void undo(UndoAs as) = 0;
  // A gradient hand-off of chunk s was enqueued on `on`, the `seen`-th of this backward where the last
  // complete one made `expected`.
  virtual void handed_off(const ChunkSlot& s, Stream& on, int seen, int expected) = 0;
  // Chunk c's gradient statistics taken from its final gradients before step(), or null.
  virtual const ShardNorm* early_stats(std::size_t c) const = 0;

 protected:
  ~UpdateGate() = default;
};

class DeviceRoom {
 public:
  // A device block for `id`. A prefetch gets null when the allocator refuses; a demand drops cached
  // chunks until it fits (OutOfMemory when none is left).
  virtual void* device_alloc(tiering::TensorId id, AllocFor who) = 0;
  // The step wrote chunk s's new working params into their pinned copy (NVMe home): written through to
  // NVMe, the pinned copy kept as a cache within offload_param.max_in_cpu elements.
  virtual void params_written(const ChunkSlot& s, std::vector<tiering::Move>& writes) = 0;

 protected:
  ~DeviceRoom() = default;
};

}  // namespace strata::zero3
