// tests/kernels/cuda_attention_cudnn_shapes.h: the attention shapes
// tests/kernels/cuda_attention_cudnn_test.cpp runs on cuDNN, in one place: the GPU test runs them against the
// CPU reference, and cuda_attention_cudnn_host_test.cpp passes them through the cuDNN frontend's host-side
// checks on every CI machine, so a shape the frontend refuses fails in CI rather than on the GPU machine.
#pragma once

#include <vector>

#include "kernels/cuda/attention_cudnn.h"

namespace strata::kernels::test {

// Grouped-query heads (NKV < NH, down to one key/value head), sequence lengths that are not multiples of
// 64 and sliding windows (the band's left bound: one token, a window inside one 64-row tile, one across
// tiles); bf16. Each is a shape the frontend accepts: T = 2 is the shortest sequence its backward takes.
inline const std::vector<AttentionShape>& cudnn_test_shapes() {
  static const std::vector<AttentionShape> shapes{
      {.B = 2, .T = 40, .NH = 4, .NKV = 4, .HD = 64},                  // T < 64, MHA
      {.B = 1, .T = 100, .NH = 8, .NKV = 2, .HD = 64},                 // GQA, T % 64 != 0
      {.B = 2, .T = 130, .NH = 6, .NKV = 1, .HD = 128},                // MQA, HD 128
      {.B = 2, .T = 257, .NH = 4, .NKV = 2, .HD = 32},                 // GQA, T = 4*64+1
      {.B = 3, .T = 2, .NH = 2, .NKV = 1, .HD = 64},                   // two tokens
      {.B = 2, .T = 100, .NH = 8, .NKV = 2, .HD = 64, .window = 16},   // a sliding window, GQA
      {.B = 1, .T = 257, .NH = 4, .NKV = 2, .HD = 32, .window = 100},  // one crossing the tiles
      {.B = 2, .T = 40, .NH = 4, .NKV = 4, .HD = 64, .window = 1},     // each query sees itself
  };
  return shapes;
}

// The CUDA compute interface's test of the fused path's buffer sizes.
inline constexpr AttentionShape kCudaOpsShape{.B = 2, .T = 1000, .NH = 8, .NKV = 2, .HD = 64};

// One token (seq_len 1): the frontend's backward refuses s_q = s_kv = 1, so plan() is not supported and the
// compute interface runs kernels/cuda's own kernel (Note [cuDNN attention graph checks]).
inline constexpr AttentionShape kOneTokenShape{.B = 3, .T = 1, .NH = 2, .NKV = 1, .HD = 64};

}  // namespace strata::kernels::test
