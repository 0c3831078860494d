// strata/kernels/cuda_ops_kernels.h: element-wise CUDA kernels of the compute interface's CUDA
// implementation (kernels/cuda_ops.cpp) that kernels/cuda does not have. Built only with STRATA_WITH_CUDA.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace strata::kernels::cuda_ops {

// x[i] = value (fp32).
void fill_f32(float* x /*(n)*/, float value, std::size_t n, cudaStream_t stream);
// dst[i] += src[i] (fp32, one rounded add per element: the CPU's result bit for bit).
void add_f32(float* dst /*(n)*/, const float* src /*(n)*/, std::size_t n, cudaStream_t stream);

}  // namespace strata::kernels::cuda_ops
