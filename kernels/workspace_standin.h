// strata/kernels/workspace_standin.h: the matrix-product workspace the CPU ops take from the device in
// place of cuda's, so that a run on the host backend takes every device byte a run on cuda takes.
//
// Example (a test binary, once, before any Ops exists; tests/common/workspace_standin.cpp does this):
//   strata::kernels::set_cpu_workspace_standin(strata::kernels::kCudaWorkspaceBytes);
//   auto ops = strata::kernels::make_ops(dev, stream);   // model role: 32 MiB taken from dev, never written
//   ops->device_bytes();                                  // 32 MiB, counted in dev's memory_stats and caps
//
// Note [Workspace stand-in]: on cuda every model-role Ops takes cuBLASLt's workspace from the Device at
// construction (kernels/cuda/ops.h, Gemm; Note [Ops device memory] in kernels/ops.h); the CPU ops need
// none. A device cap that a test computes without counting it holds on the host backend and throws
// OutOfMemory on a GPU, where the cuda cases of the engine and model tests run only when a GPU is lent.
// So the CPU ops take, for each model-role object whose OpsOptions.workspace_bytes has no value, the
// stand-in set here from the device: allocated, counted by the device, the engine's plan
// (MemoryPlan.device_ops) and its cap checks as cuda's is, and never read or written (an allocation the
// host backend does not touch costs no memory and no time). Runtime-role objects take none, as on cuda.
// The product leaves it at 0 (the CPU ops then take nothing unless OpsOptions.workspace_bytes asks);
// the engine and model test binaries set it to cuda's size for the whole process, so that CI fails a cap
// too small for cuda. OpsOptions.workspace_bytes, when it has a value, wins for its one object.
#pragma once

#include <cstddef>

namespace strata::kernels {

// cuBLASLt's workspace per model-role Ops on cuda (kernels/cuda/ops.h: Gemm's default, kGemmWorkspaceBytes,
// which kernels/cuda/ops.cpp asserts equal to this).
inline constexpr std::size_t kCudaWorkspaceBytes = std::size_t(32) << 20;

// The workspace (bytes) every model-role CPU Ops made from now on takes from its device when its
// OpsOptions.workspace_bytes has no value; 0, the default, takes none. Safe from any thread; Ops made
// before the call keep what they took.
void set_cpu_workspace_standin(std::size_t bytes);
std::size_t cpu_workspace_standin();

}  // namespace strata::kernels
