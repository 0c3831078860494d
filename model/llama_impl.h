// Internal to model/: what llama.cpp and llama_lora.cpp (the decoder's LoRA products) share — the op
// timing for the profile and the flop counts.
#pragma once

#include <chrono>
#include <cstdint>

#include "model/llama.h"

namespace strata::model {

using LlamaClock = std::chrono::steady_clock;

inline double seconds_since(LlamaClock::time_point t0) {
  return std::chrono::duration<double>(LlamaClock::now() - t0).count();
}

inline double linear_flops(int64_t n, int64_t ic, int64_t oc) {
  return 2.0 * double(n) * double(ic) * double(oc);
}

template <typename Fn>
void LlamaModel::timed(const char* op, Phase phase, double flops, Fn&& fn, int64_t n, int64_t ic,
                       int64_t oc) {
  chunk_flops_ += flops;
  if (!profile_) {
    fn();
    return;
  }
  // The ops run on the stream's worker (or the GPU) after the call returns: the op's time is from its
  // stream being idle to its stream being idle again, so profiling waits for each op (Note in profile.h).
  ops_->stream().synchronize();
  auto t0 = LlamaClock::now();
  fn();
  ops_->stream().synchronize();
  profile_->add_op(op, phase, seconds_since(t0), flops, n, ic, oc);
}

}  // namespace strata::model
