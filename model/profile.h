// strata/model/profile.h: optional per-op and per-chunk timing of LlamaModel's forward and backward.
//
// Example:
//   strata::model::Profile prof;
//   model.set_profile(&prof);
//   model.forward(chunks, in, tgt, B, T);
//   model.backward(chunks);
//   for (const auto& s : prof.ops()) std::printf("%s %s %.3f ms\n", s.op.c_str(), phase_name(s.phase), ...);
//
// The model times each op with a steady clock only while a Profile is set. Ops run on the compute
// stream after their call returns (kernels/ops.h), so a profiled model waits for the stream before and
// after each op: the figures are each op's own run time, and the step loses the overlap of op enqueueing
// with the previous op (small) and of the engine's transfers with compute (they are waited for in the
// acquire that follows). Chunk times are from acquire to release, those waits included.
// flops are the multiply-adds ×2 each call performs, counted as the model computes them (attention counts
// the causal half: s <= t). Linear ops also carry their GEMM shape so a benchmark can time a plain sgemm of
// the same size. Not thread-safe: one model, one thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata::model {

enum class Phase { forward, backward, recompute };
const char* phase_name(Phase p);

struct OpStat {
  std::string op;  // "q_proj", "attention", ...
  Phase phase = Phase::forward;
  int64_t calls = 0;
  double seconds = 0;  // summed over calls
  double flops = 0;    // summed over calls
  // Linear ops: out (n, oc) = x (n, ic) W^T; zero for other ops.
  int64_t gemm_n = 0, gemm_ic = 0, gemm_oc = 0;
};

struct ChunkStat {
  int chunk = 0;
  Phase phase = Phase::forward;  // backward includes the recompute of a checkpointed block
  int64_t calls = 0;
  double seconds = 0;  // from acquire to release, waits included
  double flops = 0;
};

class Profile {
 public:
  void add_op(std::string_view op, Phase phase, double seconds, double flops, int64_t gemm_n = 0,
              int64_t gemm_ic = 0, int64_t gemm_oc = 0);
  void add_chunk(int chunk, Phase phase, double seconds, double flops);
  const std::vector<OpStat>& ops() const { return ops_; }  // in first-seen order
  const std::vector<ChunkStat>& chunks() const { return chunks_; }
  void clear();

 private:
  std::vector<OpStat> ops_;
  std::vector<ChunkStat> chunks_;
};

}  // namespace strata::model
