// Internal to zero3: the model's checkpointed block inputs off the device, as tensors of the tier manager.
//
// Note [Checkpoints off the device]: with activation checkpointing the forward keeps every block's input
// for backward, L tensors of (B, T, C) — at long context the activations that grow with the model's depth
// (an 8B model's 32 layers at 32k tokens: 8 GiB in bf16). With activation_checkpointing.cpu_checkpointing
// (true, or "auto" where the plan with them on the device does not fit), the engine hands the model this
// CheckpointStore (model/chunk.h) for each training forward, and each block input is a tensor of the tier
// manager, of kind `activation`, at home in pinned host memory:
//   forward   put(i) takes a device block from the pool for the tensor (pinned there: never evicted while
//             in use); written(i) marks it written and starts its copy out on the manager's D2H stream
//             after the compute stream's write (an event); after forward_done(i) its device block is freed
//             (following the compute stream's last read) once that copy has ended — checked at the next
//             calls, and waited for at put(i + 2), which would otherwise pass the window. So the copy runs
//             beside block i's forward, which reads it, and the training thread runs at most one block
//             ahead of the compute stream while the pool is at its plan.
//   backward  get(i, next) waits (on the compute stream) for checkpoint i's copy back, issued one block
//             ahead, and issues next's; backward_done(i) frees the device block after block i's backward.
// The last block's input never leaves: the first backward block reads it at once; its device block goes,
// uncopied, after that block's backward (TierManager::discard). So the device holds kCheckpointWindow
// (placement.h) blocks at most — in forward the one being read and the one being written, in backward the
// one being read and the one brought back — planned inside the pool (MemoryPlan.device_checkpoint_window),
// and pinned memory holds L - 1 of them
// (pinned_activations, in the pool's budget). Where that would take the host plan past 90% of the
// machine's memory and the config names an nvme_path, NVMe is the next tier (Engine::Impl::plan_memory
// decides, and says so): each block input goes on from pinned memory to its swap file once copied out, and
// comes back to the device through a pinned staging block, so pinned memory holds kCheckpointWindow + 1 of
// them on their way (MemoryPlan.nvme_activations the rest). The copies are exact: the losses and
// gradients are those of the run with the block inputs on the device, bit for bit. Every move is the tier
// manager's, so memprof's trace shows each checkpoint going out in forward and coming back in backward (kind
// "activation").
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "model/chunk.h"
#include "zero3/engine_state.h"

namespace strata::zero3 {

class CheckpointOffload final : public model::CheckpointStore {
 public:
  explicit CheckpointOffload(const EngineEnv& env) : env_(env) {}
  ~CheckpointOffload() override = default;
  CheckpointOffload(const CheckpointOffload&) = delete;
  CheckpointOffload& operator=(const CheckpointOffload&) = delete;

  // What the plan chose: `count` block inputs of `bytes` each off the device, or none (count 0). The
  // tensors are registered at the first forward, the tier manager being open then.
  void plan(int count, std::size_t bytes, Tier home);
  bool active() const { return planned_count_ > 0; }
  // Frees what a forward left on the device (one that failed, or whose backward will not run).
  void reset();
  // Checkpoints copied out and back since the engine was made.
  std::uint64_t moved_out() const { return moved_out_; }
  std::uint64_t moved_back() const { return moved_back_; }

  void begin(int count, std::size_t bytes) override;
  void* put(int i) override;
  void written(int i) override;
  void forward_done(int i) override;
  void* get(int i, int next) override;
  void backward_done(int i) override;

 private:
  struct Entry {
    tiering::TensorId id = 0;
    bool held = false;   // pinned in the tier manager (its device block in use)
    tiering::Move out;   // its copy out (forward)
    tiering::Move back;  // its copy back to the device, issued ahead (backward)
    std::unique_ptr<Event> written, done;
  };
  Entry& at(int i);
  bool last(int i) const { return i == int(entries_.size()) - 1; }
  void hold(Entry& e);
  void let_go(Entry& e);
  // Frees the device blocks of the block inputs forward is done with whose copy out has ended, and more
  // (waiting for their copies) while more than `keep` remain: the training thread waits for a copy only
  // where the window would grow past its plan.
  void free_done(std::size_t keep);

  const EngineEnv& env_;
  int planned_count_ = 0;
  std::size_t planned_bytes_ = 0, bytes_ = 0;
  Tier home_ = Tier::pinned;
  std::vector<Entry> entries_;
  std::vector<int> leaving_;  // forward is done with these; their device blocks go once copied out
  std::uint64_t moved_out_ = 0, moved_back_ = 0;
};

}  // namespace strata::zero3
