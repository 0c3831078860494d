// Linked into the test binaries that train on the host backend (test_zero3, test_model, test_tools,
// test_ranks: their CMakeLists): every model-role CPU Ops of the process takes cuda's matrix-product
// workspace from its device as a stand-in (kernels/workspace_standin.h, Note [Workspace stand-in]), so a
// device cap a test computes without the compute interface's own bytes fails in CI, as it would on a GPU.
// A test that wants another workspace says so with OpsOptions.workspace_bytes or
// EngineOptions.testing.ops_workspace_bytes (0: none).
#include "kernels/workspace_standin.h"

namespace {

// Before main(), so before any test makes an Ops.
[[maybe_unused]] const bool standin_set = [] {
  strata::kernels::set_cpu_workspace_standin(strata::kernels::kCudaWorkspaceBytes);
  return true;
}();

}  // namespace
