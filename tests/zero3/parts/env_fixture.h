// The fake environment the engine's parts run in alone (Note [Engine parts] in zero3/engine_impl.h): an
// EngineEnv made by hand as Engine::Impl's construction makes it, small — the host backend's device, a
// tier manager over it, the three streams and their ops, the CPU optimizer, a config, the tiny model's
// layout and its four chunks (about 9,000 elements each) laid out as one rank's, with working params,
// master, optimizer states and gradient shards in pinned memory and the routes the plan gives them — and
// fakes of the two interfaces the parts meet through (zero3/engine_gate.h): FakeGate and FakeRoom.
//
// Example:
//   test::PartsEnv env;                      // the chunks registered and initialised as init_chunks does
//   test::FakeGate gate;
//   ChunkCache cache(env, gate);             // the part under test, alone
//   cache.open();
//   for (const ChunkSlot& s : env.slots) cache.add_chunk(s);
//   cache.acquire(0);
//   EXPECT_EQ(gate.calls, (std::vector<std::string>{"undo(cancellation)", "settle(0)"}));
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "zero3/engine_gate.h"
#include "zero3/engine_state.h"

namespace strata::zero3::test {

// The config's precision: bf16 (the default), fp16 or fp32 training. It sets the working params' dtype
// and, as the engine does, the ops' activation dtype: bf16 for bf16 training, fp32 otherwise.
enum class Precision { bf16, fp16, fp32 };
const char* name(Precision p);
// How GoogleTest prints a parameter.
inline void PrintTo(Precision p, std::ostream* os) {
  *os << name(p);
}

struct EnvOptions {
  Precision precision = Precision::bf16;
  // The tier manager's device pool (bytes); the chunk cache's budget (MemoryPlan.device_cache) is all of it.
  std::uint64_t device_budget = 32ull << 20;
  // strata.overlap_optimizer true: every chunk's route is overlapped with backward and deferred, as
  // plan_overlap marks them when host memory holds every chunk's rollback copies.
  bool overlap = false;
};

// ZeRO-3 at one rank with offload_param and offload_optimizer cpu, AdamW (lr 3e-3, betas 0.9 / 0.999,
// eps 1e-8, weight decay 0.01), one micro-batch a step, DeepSpeed's defaults otherwise, on the host backend.
Config parts_config(const EnvOptions& o);

// The route the plan gives such a chunk at one rank (Note [Update routes] in zero3/placement.cpp): gathered
// from pinned memory, gradients copied off the device into the pinned shard, the norm by the CPU
// optimizer's reductions, stepped by the CPU optimizer with the params written in place.
UpdateRoute pinned_route(bool overlap);

struct PartsEnv : EngineEnv {
  explicit PartsEnv(EnvOptions o = {});
  // Waits for every stream: what the parts enqueued touches their own buffers.
  ~PartsEnv();
  PartsEnv(const PartsEnv&) = delete;
  PartsEnv& operator=(const PartsEnv&) = delete;

  void sync() const;
  // A tensor of `bytes` at home on the device, pinned in the tier manager as the parts' device buffers are
  // (never evicted by it), with no block yet.
  tiering::TensorId device_tensor(const std::string& name, std::uint64_t bytes) const;
};

// `n` floats in [-scale, scale), the same for the same seed.
std::vector<float> test_values(std::size_t n, std::uint32_t seed, float scale = 1.0f);

// Whether `bytes` bytes at `got` and `want` are equal; on failure, the first element of `elem` bytes that
// differs.
::testing::AssertionResult same_bytes(const void* got, const void* want, std::size_t bytes,
                                      std::size_t elem = 4);

// `n` working params at `src` (dtype `from`) in the ops' activation dtype `to`, by core/dtype.h's
// conversions: what a gather must produce.
std::vector<std::byte> widened(const void* src, DType from, DType to, std::size_t n);

// What the updater owns of a chunk (its shard): fp32 master and optimizer states, the working params.
struct ChunkState {
  std::vector<float> master, exp_avg, exp_avg_sq;  // (shard.numel) fp32
  std::vector<std::byte> params;                   // (shard.numel) working dtype, at home
};
ChunkState state_of(const EngineEnv& env, const ChunkSlot& s);
// Every byte of both, or the first field and element that differ.
::testing::AssertionResult same_state(const ChunkState& got, const ChunkState& want);

// cpu_optim's AdamW with the config's hyper-parameters at rate `lr` (an Optimizer of its own), applied to
// a copy of `before` with gradients `g` (shard.numel fp32) times `factor` at step `step_no`.
ChunkState adamw_reference(const EngineEnv& env, ChunkState before, const float* g, double lr, float factor,
                           std::int64_t step_no);

// The optimizer overlap as the cache and the gradient path see it (UpdateGate): records every call, in
// order, as text — "settle(2)", "undo(cancellation)", "handed_off(2, seen 1, expected 0, on zero3-grads)" —
// and returns the early statistics a test sets.
class FakeGate final : public UpdateGate {
 public:
  void settle(int c) override;
  void undo(UndoAs as) override;
  void handed_off(const ChunkSlot& s, Stream& on, int seen, int expected) override;
  const ShardNorm* early_stats(std::size_t c) const override;

  std::vector<std::string> calls;
  // Called inside settle(c), before it returns: to look at the caller's state at that moment.
  std::function<void(int c)> on_settle;
  std::map<std::size_t, ShardNorm> early;  // by chunk; absent: null
};

// The chunk cache as the updater and the gradient path see it (DeviceRoom): blocks straight from the tier
// manager, each filled with 0xA5 bytes (a block that held something else before), and the calls recorded.
class FakeRoom final : public DeviceRoom {
 public:
  explicit FakeRoom(const EngineEnv& env) : env_(env) {}
  void* device_alloc(tiering::TensorId id, AllocFor who) override;
  void params_written(const ChunkSlot& s, std::vector<tiering::Move>& writes) override;

  struct Alloc {
    tiering::TensorId id = 0;
    AllocFor who = AllocFor::demand;
    bool operator==(const Alloc&) const = default;
  };
  std::vector<Alloc> allocs;
  std::vector<int> written;  // chunks

 private:
  const EngineEnv& env_;
};

}  // namespace strata::zero3::test
