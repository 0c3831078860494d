// strata/kernels/cuda/embedding.cu: token embedding lookup and its gradient.
//
// Note [embedding gradient order]: the CPU sums each dwte row in position order (kernels/cpu/embedding.cpp:
// a stable sort of the positions by token). The device does the same: keys[i] = tokens[i] (V for a token
// outside [0, V), sorted last and skipped), a stable CUB radix sort of (key, position) pairs over the
// bits that can be set, then one block per (sorted index k, channel block): the block whose k starts a
// run of equal keys adds dout of that run's positions, in position order, into its dwte row. Every
// position is read once per channel (O(N C) work, no scan of all tokens per thread) and no atomics are
// used, so the result is deterministic and equals the CPU's fp32 order. A token that fills most positions
// makes one long serial run per channel, as on the CPU.
#include <cub/device/device_radix_sort.cuh>

#include <bit>
#include <cmath>

#include "kernels/cuda/common_impl.cuh"

namespace strata::kernels::cuda {
namespace {

__global__ void embedding_forward_kernel(bf16* out, const std::int32_t* tokens, const bf16* wte, int N, int C,
                                         int V) {
  const std::size_t idx = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= std::size_t(N) * C) return;
  const std::size_t i = idx / C, c = idx % C;
  const int tok = tokens[i];
  out[idx] = (tok >= 0 && tok < V) ? wte[std::size_t(tok) * C + c] : impl::to_bf16(NAN);
}

__global__ void sort_inputs_kernel(std::uint32_t* keys, std::int32_t* positions, const std::int32_t* tokens,
                                   int N, int V) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= N) return;
  const int tok = tokens[i];
  keys[i] = (tok >= 0 && tok < V) ? std::uint32_t(tok) : std::uint32_t(V);
  positions[i] = i;
}

// Block (k, channel block): if sorted index k starts a run of one token, add the run's rows in order.
__global__ void embedding_backward_kernel(float* dwte, const bf16* dout, const std::uint32_t* keys,
                                          const std::int32_t* positions, int N, int C, int V) {
  const int k = blockIdx.x;
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  const std::uint32_t tok = keys[k];
  if (c >= C || tok >= std::uint32_t(V) || (k > 0 && keys[k - 1] == tok)) return;
  float* row = dwte + std::size_t(tok) * C + c;
  float acc = *row;
  for (int j = k; j < N && keys[j] == tok; ++j) acc += impl::ld(dout, std::size_t(positions[j]) * C + c);
  *row = acc;
}

// The scratch: keys and positions before and after the sort, then CUB's temporary storage.
struct Layout {
  std::size_t keys_in, keys_out, pos_in, pos_out, temp, temp_bytes, total;
};

std::size_t round_up(std::size_t n) {
  return (n + 255) / 256 * 256;
}

int key_bits(int V) {
  return std::bit_width(std::uint32_t(V));  // keys are in [0, V]
}

Layout layout(int N, int V) {
  std::size_t temp_bytes = 0;
  STRATA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, temp_bytes, static_cast<const std::uint32_t*>(nullptr), static_cast<std::uint32_t*>(nullptr),
      static_cast<const std::int32_t*>(nullptr), static_cast<std::int32_t*>(nullptr), N, 0, key_bits(V)));
  Layout l{};
  const std::size_t n4 = round_up(std::size_t(N) * 4);
  l.keys_in = 0;
  l.keys_out = n4;
  l.pos_in = 2 * n4;
  l.pos_out = 3 * n4;
  l.temp = 4 * n4;
  l.temp_bytes = temp_bytes;
  l.total = l.temp + round_up(temp_bytes);
  return l;
}

}  // namespace

void embedding_forward(bf16* out, const std::int32_t* tokens, const bf16* wte, int N, int C, int V,
                       cudaStream_t stream) {
  if (N == 0 || C == 0) return;
  detail::CudaDeviceGuard guard(stream);
  embedding_forward_kernel<<<impl::blocks_for(std::size_t(N) * C), impl::kThreads, 0, stream>>>(out, tokens,
                                                                                                wte, N, C, V);
  STRATA_KERNEL_CHECK(stream);
}

std::size_t embedding_backward_scratch_bytes(int N, int V) {
  if (N == 0) return 0;
  return layout(N, V).total;
}

void embedding_backward(float* dwte, const bf16* dout, const std::int32_t* tokens, int N, int C, int V,
                        void* scratch, std::size_t scratch_bytes, cudaStream_t stream) {
  if (N == 0 || C == 0 || V == 0) return;  // nothing to add: no positions, no channels, or no rows
  detail::CudaDeviceGuard guard(stream);
  const Layout l = layout(N, V);
  STRATA_CHECK(scratch != nullptr && scratch_bytes >= l.total, "embedding_backward: scratch of ",
               scratch_bytes, " bytes, needs embedding_backward_scratch_bytes(", N, ", ", V, ") = ", l.total);
  char* base = static_cast<char*>(scratch);
  auto* keys_in = reinterpret_cast<std::uint32_t*>(base + l.keys_in);
  auto* keys_out = reinterpret_cast<std::uint32_t*>(base + l.keys_out);
  auto* pos_in = reinterpret_cast<std::int32_t*>(base + l.pos_in);
  auto* pos_out = reinterpret_cast<std::int32_t*>(base + l.pos_out);
  sort_inputs_kernel<<<impl::blocks_for(std::size_t(N)), impl::kThreads, 0, stream>>>(keys_in, pos_in, tokens,
                                                                                      N, V);
  STRATA_KERNEL_CHECK(stream);
  std::size_t temp_bytes = l.temp_bytes;
  STRATA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + l.temp, temp_bytes, keys_in, keys_out, pos_in,
                                                    pos_out, N, 0, key_bits(V), stream));
  STRATA_KERNEL_CHECK(stream);
  const dim3 grid(unsigned(N), impl::blocks_for(std::size_t(C)));
  embedding_backward_kernel<<<grid, impl::kThreads, 0, stream>>>(dwte, dout, keys_out, pos_out, N, C, V);
  STRATA_KERNEL_CHECK(stream);
}

}  // namespace strata::kernels::cuda
