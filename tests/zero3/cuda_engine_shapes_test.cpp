// One training step at the 1b preset's shapes on cuda against the host backend: configs/models/1b.json's
// blocks (d_model 2048, 32 query heads and 4 key/value heads of 64, ffn 5632) and its full vocabulary of
// 32000, with 2 of its 22 blocks (219M parameters, 131M of them the embedding and the head), one sequence
// of 64 tokens, state on the device (offload none: the device optimizer) and in host memory (offload cpu:
// the CPU optimizer). The other engine tests run the tiny preset (head dimension 8) only.
//
// What is compared, with cuda's bf16 activations against the host backend's fp32 ones (both take bf16
// weights, multiply in bf16 and accumulate in fp32):
//   - the initial fp32 master parameters: equal bit for bit (the same seed initialises both);
//   - the step's loss: within 1% (relative);
//   - the step's update of the master parameters, chunk by chunk: relative L2 error <= 5e-2 (an op's
//     output is within 2e-2 on cuda, and the gradient passes through both blocks, the head and the loss).
//     AdamW runs with eps = 100, so that its first step, lr * g / (|g| + eps), is lr * g / eps to within
//     1% for these gradients: linear in the gradient. (With the usual eps the first step is lr * sign(g),
//     and the comparison would count sign flips of near-zero gradients instead of gradient errors.)
//     Weight decay and clipping are off, so the update is the gradient alone.
// Skipped, with the reason, without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/zero3/engine_util.h"

namespace strata::zero3::test {
namespace {

constexpr int kSeq = 64;

model::ModelConfig two_blocks_of_1b() {
  model::ModelConfig c = model::ModelConfig::preset("1b");
  c.name = "1b-two-blocks";
  c.n_layers = 2;
  c.max_seq_len = kSeq;
  return c;
}

struct StepRun {
  double loss = 0;
  bool applied = false;
  std::vector<std::vector<float>> before, after;  // every chunk's fp32 master parameters
};

StepRun one_step(const Config& cfg, const model::ModelConfig& mcfg, const std::string& tokens,
                 const std::string& backend) {
  Engine e(cfg, mcfg, {.backend = backend, .device_memory_cap = 0, .seq_len = kSeq});
  model::TokenFile file = model::TokenFile::open(tokens);
  model::DataLoader data(
      file, {.batch_size = e.micro_batch(), .seq_len = kSeq, .seed = 3, .vocab_size = mcfg.vocab_size});
  model::LlamaModel m(mcfg, e.model_options());
  StepRun r;
  for (int c = 0; c < e.layout().num_chunks(); ++c) r.before.push_back(e.master_params(c));
  const StepResult s = e.train_batch(m, data);
  r.loss = s.loss;
  r.applied = s.applied;
  for (int c = 0; c < e.layout().num_chunks(); ++c) r.after.push_back(e.master_params(c));
  return r;
}

// ||(a1 - a0) - (b1 - b0)|| / ||b1 - b0||, in double; infinity when anything is NaN.
double update_error(const std::vector<float>& a0, const std::vector<float>& a1, const std::vector<float>& b0,
                    const std::vector<float>& b1) {
  if (a0.size() != b0.size() || a1.size() != a0.size() || b1.size() != b0.size()) return INFINITY;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a0.size(); ++i) {
    const double da = double(a1[i]) - double(a0[i]), db = double(b1[i]) - double(b0[i]);
    if (std::isnan(da) || std::isnan(db)) return INFINITY;
    num += (da - db) * (da - db);
    den += db * db;
  }
  return den > 0 ? std::sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
}

class CudaEngineShapes : public ::testing::TestWithParam<OffloadDevice> {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA GPU visible: " << why;
  }
};

TEST_P(CudaEngineShapes, OneStepAtThe1bShapesTracksTheHostBackend) {
  ScratchDir d("cuda-engine-1b");
  const model::ModelConfig mcfg = two_blocks_of_1b();
  const Config cfg = make_config(
      GetParam(), GetParam(), d.path(),
      {{"train_micro_batch_size_per_gpu", 1},
       {"gradient_accumulation_steps", 1},
       {"gradient_clipping", 0.0},
       {"optimizer", {{"params", {{"lr", 0.1}, {"eps", 100.0}, {"weight_decay", 0.0}}}}},
       {"zero_optimization", {{"sub_group_size", 100000000}, {"stage3_prefetch_bucket_size", 100000000}}}});
  const std::string tokens = make_tokens(d);
  const StepRun host = one_step(cfg, mcfg, tokens, "host");
  const StepRun cuda = one_step(cfg, mcfg, tokens, "cuda");
  ASSERT_TRUE(host.applied);
  ASSERT_TRUE(cuda.applied);
  EXPECT_NEAR(cuda.loss, host.loss, 1e-2 * host.loss);
  ASSERT_EQ(cuda.before.size(), host.before.size());
  for (std::size_t c = 0; c < host.before.size(); ++c) {
    EXPECT_EQ(cuda.before[c], host.before[c]) << "chunk " << c << ": the same seed, other initial masters";
    const double err = update_error(cuda.before[c], cuda.after[c], host.before[c], host.after[c]);
    EXPECT_LE(err, 5e-2) << "chunk " << c << "'s update";
    EXPECT_NE(host.after[c], host.before[c]) << "chunk " << c << " was not updated";
  }
}

INSTANTIATE_TEST_SUITE_P(Placements, CudaEngineShapes,
                         ::testing::Values(OffloadDevice::none, OffloadDevice::cpu),
                         [](const auto& info) { return std::string("offload_") + name(info.param); });

}  // namespace
}  // namespace strata::zero3::test
