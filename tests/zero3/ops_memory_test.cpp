// The compute interface's own device memory is planned (kernels/ops.h, Note [Ops device memory]): a
// workspace like cuBLASLt's — here the CPU ops' stand-in, OpsOptions.workspace_bytes, or cuda's size by
// default in this binary (Note [Workspace stand-in] in kernels/workspace_standin.h) — is in
// MemoryPlan.device_ops, the smallest cap the plan accepts is the step's peak to the byte, and a cap one
// byte smaller is refused before training.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine_util.h"
#include "kernels/workspace_standin.h"

namespace strata::zero3 {
namespace {

using test::make_tokens;
using test::ScratchDir;

constexpr int kSeqLen = 16;
constexpr std::size_t kWorkspace = (std::size_t(3) << 20) + 4096;

model::ModelConfig ops_model() {
  return test::block_model("ops-memory-test", 3);
}

Config ops_config(const std::string& dir) {
  return test::make_config(OffloadDevice::cpu, OffloadDevice::cpu, dir,
                           {{"train_micro_batch_size_per_gpu", 1}, {"gradient_accumulation_steps", 1}});
}

EngineOptions options(std::uint64_t cap, std::optional<std::size_t> workspace) {
  EngineOptions o;
  o.device_memory_cap = cap;
  o.seq_len = kSeqLen;
  o.checkpoint_activations = true;  // fixed, so that a smaller cap cannot fit by checkpointing instead
  o.testing.ops_workspace_bytes = workspace;
  return o;
}

struct Outcome {
  std::vector<double> losses;
  std::size_t peak = 0;
};

Outcome train(const Config& cfg, const std::string& tokens, const EngineOptions& o) {
  const model::ModelConfig mcfg = ops_model();
  kernels::cpu::set_blas_threads(1);
  Engine engine(cfg, mcfg, o);
  model::TokenFile file = model::TokenFile::open(tokens);
  model::DataLoader data(file,
                         {.batch_size = 1, .seq_len = kSeqLen, .seed = 3, .vocab_size = mcfg.vocab_size});
  model::LlamaModel m(mcfg, engine.model_options());
  Outcome out;
  for (int i = 0; i < 4; ++i) out.losses.push_back(engine.train_batch(m, data).loss);
  out.peak = engine.device().memory_stats().peak_in_use;
  return out;
}

TEST(OpsMemory, TheWorkspaceIsPlanned) {
  ScratchDir d("ops-planned");
  const Config cfg = ops_config(d.path());
  const MemoryPlan without = Engine(cfg, ops_model(), options(0, 0)).plan();
  const MemoryPlan with = Engine(cfg, ops_model(), options(0, kWorkspace)).plan();
  const MemoryPlan standin = Engine(cfg, ops_model(), options(0, std::nullopt)).plan();
  EXPECT_EQ(without.device_ops, 0u);  // the CPU ops need no scratch
  EXPECT_EQ(with.device_ops, kWorkspace);
  EXPECT_EQ(with.device_need(), without.device_need() + kWorkspace);
  // No value: the test binary's stand-in, cuda's cuBLASLt workspace (tests/common/workspace_standin.cpp).
  EXPECT_EQ(standin.device_ops, kernels::kCudaWorkspaceBytes);
  EXPECT_EQ(standin.device_need(), without.device_need() + kernels::kCudaWorkspaceBytes);
}

TEST(OpsMemory, TheSmallestAcceptedCapIsThePeak) {
  ScratchDir d("ops-peak");
  const Config cfg = ops_config(d.path());
  const std::string tokens = make_tokens(d);
  const std::uint64_t need = Engine(cfg, ops_model(), options(0, kWorkspace)).plan().device_need();
  const Outcome free_run = train(cfg, tokens, options(0, 0));
  const Outcome o = train(cfg, tokens, options(need, kWorkspace));
  EXPECT_EQ(o.losses, free_run.losses);
  EXPECT_EQ(o.peak, need) << "the plan is neither exceeded nor padded";
}

TEST(OpsMemory, OneByteBelowThePlanIsRefusedBeforeTraining) {
  ScratchDir d("ops-below");
  const Config cfg = ops_config(d.path());
  const std::uint64_t need = Engine(cfg, ops_model(), options(0, kWorkspace)).plan().device_need();
  EXPECT_THROW(Engine(cfg, ops_model(), options(need - 1, kWorkspace)), OutOfMemory);
}

// The engine's copy streams take runtime-role compute interfaces, which hold no workspace: one is all the
// products need, and only the compute stream's object has one.
TEST(OpsMemory, OnlyTheComputeStreamHasAWorkspace) {
  ScratchDir d("ops-one");
  const Config cfg = ops_config(d.path());
  Engine e(cfg, ops_model(), options(0, kWorkspace));
  EXPECT_EQ(e.ops().device_bytes(), kWorkspace);
  EXPECT_EQ(e.plan().device_ops, kWorkspace);
}

}  // namespace
}  // namespace strata::zero3
