// strata/kernels/cpu/embedding.cpp: token embedding lookup and its gradient.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/parallel_impl.h"

namespace strata::kernels::cpu {
namespace {

void check_tokens(const char* op, const std::int32_t* tokens, int N, int V) {
  for (int i = 0; i < N; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V)
      throw Error(::strata::detail::cat(op, ": token ", tokens[i], " at position ", i,
                                        " is outside the vocabulary [0, ", V,
                                        "); check the data file against the model's vocab_size"));
  }
}

}  // namespace

void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, int N, int C, int V) {
  check_tokens("embedding_forward", tokens, N, V);
  impl::parallel_for_each_index(std::size_t(N), 16, [&](std::size_t i) {
    std::memcpy(out + i * C, wte + std::size_t(tokens[i]) * C, sizeof(float) * C);
  });
}

void embedding_backward(float* dwte, const float* dout, const std::int32_t* tokens, int N, int C, int V) {
  check_tokens("embedding_backward", tokens, N, V);
  // Group the positions by token (stable: ascending position within a token), then let one task own
  // each token's row, so the row is summed in position order whatever the thread count.
  std::vector<int> order(N);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return tokens[a] < tokens[b]; });
  std::vector<int> group_start;
  for (int j = 0; j < N; ++j)
    if (j == 0 || tokens[order[j]] != tokens[order[j - 1]]) group_start.push_back(j);
  group_start.push_back(N);
  impl::parallel_for_each_index(group_start.size() - 1, 4, [&](std::size_t g) {
    float* row = dwte + std::size_t(tokens[order[group_start[g]]]) * C;
    for (int j = group_start[g]; j < group_start[g + 1]; ++j) {
      const float* d = dout + std::size_t(order[j]) * C;
      for (int c = 0; c < C; ++c) row[c] += d[c];
    }
  });
}

}  // namespace strata::kernels::cpu
