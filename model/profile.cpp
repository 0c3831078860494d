#include "model/profile.h"

namespace strata::model {

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::forward:
      return "forward";
    case Phase::backward:
      return "backward";
    case Phase::recompute:
      return "recompute";
  }
  return "?";
}

void Profile::add_op(std::string_view op, Phase phase, double seconds, double flops, int64_t gemm_n,
                     int64_t gemm_ic, int64_t gemm_oc) {
  for (OpStat& s : ops_) {
    if (s.op == op && s.phase == phase && s.gemm_n == gemm_n && s.gemm_ic == gemm_ic &&
        s.gemm_oc == gemm_oc) {
      ++s.calls;
      s.seconds += seconds;
      s.flops += flops;
      return;
    }
  }
  ops_.push_back(OpStat{std::string(op), phase, 1, seconds, flops, gemm_n, gemm_ic, gemm_oc});
}

void Profile::add_chunk(int chunk, Phase phase, double seconds, double flops) {
  for (ChunkStat& s : chunks_) {
    if (s.chunk == chunk && s.phase == phase) {
      ++s.calls;
      s.seconds += seconds;
      s.flops += flops;
      return;
    }
  }
  chunks_.push_back(ChunkStat{chunk, phase, 1, seconds, flops});
}

void Profile::clear() {
  ops_.clear();
  chunks_.clear();
}

}  // namespace strata::model
