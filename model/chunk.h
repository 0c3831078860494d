// strata/model/chunk.h: how the model reaches its parameters and hands back its gradients.
//
// Example (what LlamaModel does for each chunk; the engine implements ChunkProvider):
//   ChunkView p = chunks.acquire(id);             // may block until the gathered params are resident
//   const void* wq = p.tensor(kWq);               // (Hq*D, C) of p.dtype, read-only, valid until release
//   ... forward ...
//   chunks.release(id);
//   // backward, reverse order:
//   p = chunks.acquire(id);
//   float* g = chunks.acquire_grads(id);          // (padded_numel) fp32; backward only adds into it
//   ... recompute, backward ...
//   chunks.release_grads(id);                     // hand the chunk's gradients back (reduce, D2H, free)
//   chunks.release(id);
//
// Note [Chunk protocol]: a chunk is acquired and released in pairs, never held twice at once. The model
// holds at most two chunks at a time (the head and, with tied embeddings, the embedding chunk). Gradients:
// acquire_grads returns a buffer of padded_numel floats and the model only ever ADDS its contribution
// (+=), so an implementation may hand out either a zeroed buffer (the engine: reduce-scatter and
// accumulate into the fp32 shard on release_grads) or its running accumulator (InMemoryChunks). A chunk's
// gradients may be acquired more than once per step — with tied embeddings the head adds into chunk 0
// before the embedding's own backward does — and every hand-back must be accumulated. The padding stays
// zero: the model never writes outside the tensors. A frozen chunk (trains(id) false: a base under
// adapters) is acquired as any other but its gradients never are: backward computes through it only the
// gradients of what it feeds, no weight gradient.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "model/layout.h"

namespace strata::model {

// A chunk's gathered parameters: padded_numel elements of `dtype` (fp32, or bf16 / fp16 as raw 16-bit
// patterns), so the pointer is untyped. tensor(index) steps by the dtype's size; f32() reads the elements
// as fp32 after checking that they are.
struct ChunkView {
  const ChunkLayout* layout = nullptr;
  const void* data = nullptr;  // (padded_numel) of `dtype`, read-only, device memory
  DType dtype = DType::fp32;   // the compute interface's activation dtype (kernels/ops.h)

  // The first element of tensor `index` (BlockTensor, ...): its offset in elements of `dtype` past data.
  const void* tensor(int index) const {
    return static_cast<const char*>(data) + layout->at(index).offset * dtype_bytes(dtype);
  }
  // The elements as fp32; strata::Error naming the chunk and its dtype when they are not fp32.
  const float* f32() const;
};

// Note [Checkpoints off the device]: with activation checkpointing the forward keeps each block's input
// for backward (Note [Activation checkpointing] in model/llama.h): L tensors of (B, T, C), the only
// activations that grow with the number of layers. A provider with somewhere else to keep them (the
// engine: pinned host memory or NVMe through its tier manager, zero3/engine_checkpoints.h) gives the model
// a CheckpointStore for a training forward, and the model then holds none of them itself: it asks the
// store for each checkpoint's device memory when it writes it (forward) and when it reads it again
// (backward), and says when each use on its compute stream ends. Block l reads checkpoint l and writes
// checkpoint l + 1, so forward calls, for l = 0 .. L-1:
//   put(0) before the embedding, written(0) after it;
//   put(l + 1) and written(l + 1) around block l (l + 1 < L; the last block's output is the head's input,
//   the model's own), then forward_done(l);
// and backward, for l = L-1 .. 0: get(l, l - 1) before block l's recomputation, backward_done(l) after its
// backward. Every call is made after the model's work it speaks of is enqueued on the compute stream (the
// store orders its copies after that work with events) and before any later work that needs its answer;
// the memory returned is valid until the matching done call. The copies are exact, so a run with the
// checkpoints off the device computes the same bits.
class CheckpointStore {
 public:
  virtual ~CheckpointStore() = default;
  // A training forward begins: `count` checkpoints of `bytes` each. Forgets what an earlier forward left
  // (one whose backward never ran).
  virtual void begin(int count, std::size_t bytes) = 0;
  // Device memory for checkpoint i, for the compute stream to write.
  virtual void* put(int i) = 0;
  // The compute stream's work so far writes checkpoint i.
  virtual void written(int i) = 0;
  // The compute stream's work so far is checkpoint i's last use in forward.
  virtual void forward_done(int i) = 0;
  // Checkpoint i on the device, with the compute stream's later work ordered after its arrival; `next`
  // (-1: none) is the one backward needs after it, which may be brought back meanwhile.
  virtual void* get(int i, int next) = 0;
  // The compute stream's work so far is checkpoint i's last use in backward.
  virtual void backward_done(int i) = 0;
};

class ChunkProvider {
 public:
  virtual ~ChunkProvider() = default;

  virtual const ModelLayout& layout() const = 0;
  // Gathered parameters of chunk `id`, valid until release(id). May block waiting on a prefetch.
  virtual ChunkView acquire(int id) = 0;
  virtual void release(int id) = 0;
  // Gradient buffer of chunk `id` (padded_numel fp32) that backward adds into; valid until
  // release_grads(id), which hands this contribution back (see Note [Chunk protocol]).
  virtual float* acquire_grads(int id) = 0;
  virtual void release_grads(int id) = 0;
  // Chunk `id`'s parameters as fp32 in host memory (`out`: padded_numel), e.g. to export them. The
  // default acquires the chunk and copies its view, which must be fp32 in host-addressable memory; a
  // provider whose chunks live in device memory overrides it.
  virtual void read_params(int id, float* out);
  // Whether the provider orders its use of the gradient buffers after the model's ops itself, by stream
  // events (zero3::Engine): the model's backward then returns without waiting for its stream. false (the
  // default): backward waits, so the provider may read the gradients on the host when it returns.
  virtual bool orders_grads_by_stream() const { return false; }
  // Whether chunk `id`'s parameters train. false: frozen — backward takes no gradient buffer for it and
  // computes no gradient of its parameters (Note [Chunk protocol]).
  virtual bool trains(int id) const {
    (void)id;
    return true;
  }
  // Where a checkpointing forward with targets keeps its block inputs (Note [Checkpoints off the device]),
  // or null (the default): in the model's own device memory.
  virtual CheckpointStore* checkpoint_store() { return nullptr; }
};

// Fills chunk `id` (padded_numel floats) with the Llama-style decoder's initial parameters (what its
// Architecture::init_chunk does, model/architecture.h): weight matrices N(0, 0.02), the residual output
// projections (wo, w_down) N(0, 0.02 / sqrt(2 n_layers)), norm weights 1, padding 0. Each value depends
// only on (seed, chunk id, tensor index, element index), so any implementation of ChunkProvider, sharded
// or not, initialises bit-identically.
void init_chunk(const ModelLayout& layout, int id, uint64_t seed, float* data);

// Every chunk in ordinary memory: parameters and gradient accumulators laid end to end (chunk c at
// layout.chunk(c).flat_offset), 64-byte aligned. The reference ChunkProvider for tests and the CPU path.
// Records the sequence of calls so tests can check the protocol; misuse (acquiring a held chunk,
// releasing one not held) throws strata::Error. Not thread-safe.
class InMemoryChunks final : public ChunkProvider {
 public:
  enum class Op { acquire, release, acquire_grads, release_grads };
  struct Call {
    Op op;
    int id;
  };

  explicit InMemoryChunks(ModelLayout layout);
  ~InMemoryChunks() override;

  const ModelLayout& layout() const override { return layout_; }
  ChunkView acquire(int id) override;
  void release(int id) override;
  float* acquire_grads(int id) override;
  void release_grads(int id) override;
  bool trains(int id) const override { return !frozen_[size_t(id)]; }

  // Chunk `id` no longer trains: acquiring its gradients is then a protocol error.
  void freeze(int id) { frozen_.at(size_t(id)) = 1; }
  void init(uint64_t seed);  // the architecture's init_chunk on every chunk (model/architecture.h)
  float* params(int id) { return params_ + layout_.chunk(id).flat_offset; }
  const float* params(int id) const { return params_ + layout_.chunk(id).flat_offset; }
  // The gradients are allocated on first use: evaluation and export never take them.
  float* grads(int id) { return grad_buffer() + layout_.chunk(id).flat_offset; }
  float* all_params() { return params_; }       // (total_padded_numel)
  float* all_grads() { return grad_buffer(); }  // (total_padded_numel)
  void zero_grads();
  // Host memory held: the parameters, and the gradients once made.
  std::size_t host_bytes() const;

  const std::vector<Call>& calls() const { return calls_; }
  void clear_calls() { calls_.clear(); }

 private:
  float* grad_buffer();

  ModelLayout layout_;
  float* params_ = nullptr;
  float* grads_ = nullptr;
  std::vector<uint8_t> held_, grads_held_, frozen_;
  std::vector<Call> calls_;
};

}  // namespace strata::model
