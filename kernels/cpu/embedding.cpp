// strata/kernels/cpu/embedding.cpp: token embedding lookup and its gradient, on fp32 and on bf16 activations.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/ops_impl.h"
#include "kernels/cpu/parallel_impl.h"

namespace strata::kernels::cpu {

namespace {

// Throws strata::Error naming `op` if a token is outside [0, V).
void check_tokens(const char* op, const std::int32_t* tokens, int N, int V) {
  for (int i = 0; i < N; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V)
      throw Error(::strata::detail::cat(op, ": token ", tokens[i], " at position ", i,
                                        " is outside the vocabulary [0, ", V,
                                        "); check the data file against the model's vocab_size"));
  }
}

// The positions of each token: group g's positions are order[start[g]] .. order[start[g + 1] - 1],
// ascending (a stable sort); groups in ascending token order; start.back() == N.
struct TokenGroups {
  std::vector<int> order, start;
  std::size_t count() const { return start.size() - 1; }
};

TokenGroups group_by_token(const std::int32_t* tokens, int N) {
  TokenGroups g;
  g.order.resize(std::size_t(N));
  std::iota(g.order.begin(), g.order.end(), 0);
  std::stable_sort(g.order.begin(), g.order.end(), [&](int a, int b) { return tokens[a] < tokens[b]; });
  for (int j = 0; j < N; ++j)
    if (j == 0 || tokens[g.order[j]] != tokens[g.order[j - 1]]) g.start.push_back(j);
  g.start.push_back(N);
  return g;
}

// T = float, or bf16_t (the bf16 variants: a bf16 value copied is itself; widened as it is added).
template <typename T>
void forward(T* out, const std::int32_t* tokens, const T* wte, int N, int C, int V) {
  check_tokens("embedding_forward", tokens, N, V);
  impl::parallel_for_each_index(std::size_t(N), 16, [&](std::size_t i) {
    std::memcpy(out + i * C, wte + std::size_t(tokens[i]) * C, sizeof(T) * C);
  });
}

template <typename T>
void backward(float* dwte, const T* dout, const std::int32_t* tokens, int N, int C, int V) {
  check_tokens("embedding_backward", tokens, N, V);
  // One task owns each token's row, so the row is summed in position order whatever the thread count.
  const TokenGroups groups = group_by_token(tokens, N);
  impl::parallel_for_each_index(groups.count(), 4, [&](std::size_t g) {
    float* row = dwte + std::size_t(tokens[groups.order[groups.start[g]]]) * C;
    for (int j = groups.start[g]; j < groups.start[g + 1]; ++j) {
      const T* d = dout + std::size_t(groups.order[j]) * C;
      for (int c = 0; c < C; ++c) row[c] += impl::to_f32(d[c]);
    }
  });
}

}  // namespace

void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, int N, int C, int V) {
  forward(out, tokens, wte, N, C, V);
}
void embedding_forward(bf16_t* out, const std::int32_t* tokens, const bf16_t* wte, int N, int C, int V) {
  forward(out, tokens, wte, N, C, V);
}
void embedding_backward(float* dwte, const float* dout, const std::int32_t* tokens, int N, int C, int V) {
  backward(dwte, dout, tokens, N, C, V);
}
void embedding_backward(float* dwte, const bf16_t* dout, const std::int32_t* tokens, int N, int C, int V) {
  backward(dwte, dout, tokens, N, C, V);
}

}  // namespace strata::kernels::cpu
