// Strata's Llama against an independent implementation, llm.c-style: tests/reference/make_reference.py
// (Hugging Face transformers on PyTorch, fp32, CPU; run by hand) saved models with transformers' own
// save_pretrained and dumped one batch's logits, loss and every parameter's gradient, and the losses of 10
// AdamW steps on that batch (tests/reference/data/<config>/). Here the same directories load the way
// `strata train --init-from` loads them, and the CPU reference ops (fp32) must agree:
//   logits     |ours - theirs| <= 2e-5 · max |theirs| + 1e-6
//   loss       relative 2e-6
//   gradients  per tensor, ||ours - theirs|| <= 1e-4 · ||theirs|| (sums of many products in another order)
//   10 AdamW   every step's loss within 1e-4 relative (the differences above, carried through the updates)
// The configurations: grouped-query attention with head_dim wider than hidden_size / heads and untied
// embeddings, tied embeddings, rope_theta 5e5, Llama 3.1's rope scaling (the newer rope_parameters form
// that transformers 5 writes), and one directory per other family (Mistral, Qwen2, Qwen3, Phi-3, Gemma:
// Note [Model families] in model/config.h), whose norms and biases are random too, Phi-3's longrope
// past its original length (the long factors) and within it (the short ones), and the rope scalings linear
// (Llama, factor 2) and yarn (Qwen2, factor 4, run past its original context; tests/reference/
// make_rope_reference.py made these two, with random norms too). Sliding windows (Note [Sliding windows]
// in model/config.h): a window of 16 at T = 64 on every layer of Mistral and Phi-3, and on Qwen2's layer 1
// alone (use_sliding_window, max_window_layers 1), at the same tolerances. bf16 applies to the cuda
// backend's ops, which are checked against these same CPU ops (tests/kernels); this machine has no GPU to run
// them here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/hf_dir.h"
#include "model/layout.h"
#include "model/llama.h"
#include "model/safetensors.h"
#include "model_test_util.h"
#include "reference_util.h"
#include "tests/common/source_dir.h"

namespace strata::model {
namespace {

std::string data_dir(const std::string& name) {
  return strata::test::source_path("tests/reference/data/" + name);
}

using testing::norm;
using testing::read_all;

class Reference : public ::testing::TestWithParam<std::string> {};

TEST_P(Reference, ForwardBackwardAndTenAdamWStepsMatchTransformers) {
  const std::string dir = data_dir(GetParam());
  const HfModel hf = open_hf_model(dir);
  const ModelConfig& cfg = hf.config;
  InMemoryChunks ch{ModelLayout(cfg)};
  load_weights(hf.weights, ch);
  const nlohmann::json meta = nlohmann::json::parse(std::ifstream(dir + "/reference.json"));
  const SafetensorsReader ref(dir + "/reference.safetensors");
  const testing::ShiftedBatch batch = testing::shifted_batch(ref, meta);
  const int B = batch.B, T = batch.T;
  const std::vector<int32_t>&in = batch.in, &tgt = batch.tgt;

  kernels::cpu::set_blas_threads(1);
  LlamaModel model(cfg);
  ch.zero_grads();
  const float loss = model.forward(ch, in.data(), tgt.data(), B, T);
  testing::expect_logits_match(model.logits(), ref);
  const double want_loss = meta["loss"];
  EXPECT_NEAR(loss, want_loss, 2e-6 * want_loss);

  model.backward(ch);
  int checked = 0;
  for (const ChunkLayout& c : ch.layout().chunks())
    for (const TensorSpec& t : c.stored) {  // as transformers names them (Phi-3's fused projections)
      const std::vector<float> want = read_all(ref, "grad." + t.hf_name);
      ASSERT_EQ(want.size(), t.numel) << t.hf_name;
      const float* got = ch.grads(c.id) + t.offset;
      std::vector<float> diff(t.numel);
      for (std::size_t i = 0; i < t.numel; ++i) diff[i] = got[i] - want[i];
      EXPECT_LE(norm(diff.data(), t.numel), 1e-4 * norm(want.data(), t.numel)) << t.hf_name;
      ++checked;
    }
  // Every parameter transformers has was checked.
  int theirs = 0;
  for (const SafetensorsEntry& e : ref.entries()) theirs += e.name.rfind("grad.", 0) == 0 ? 1 : 0;
  EXPECT_EQ(checked, theirs);

  // 10 AdamW steps on the same batch from the loaded weights (torch.optim.AdamW's hyperparameters).
  InMemoryChunks fresh{ModelLayout(cfg)};
  load_weights(hf.weights, fresh);
  const auto& a = meta["adamw"];
  kernels::cpu::AdamWParams hp;
  hp.lr = a["lr"];
  hp.beta1 = a["beta1"];
  hp.beta2 = a["beta2"];
  hp.eps = a["eps"];
  hp.weight_decay = a["weight_decay"];
  const std::size_t n = fresh.layout().total_padded_numel();
  std::vector<float> m(n), v(n);
  LlamaModel trained(cfg);
  const std::vector<double> want_steps = meta["step_losses"];
  for (std::size_t s = 0; s < want_steps.size(); ++s) {
    fresh.zero_grads();
    const float l = trained.forward(fresh, in.data(), tgt.data(), B, T);
    EXPECT_NEAR(l, want_steps[s], 1e-4 * want_steps[s]) << "step " << s + 1;
    trained.backward(fresh);
    kernels::cpu::adamw_update(fresh.all_params(), fresh.all_grads(), m.data(), v.data(), nullptr, n, hp,
                               std::int64_t(s + 1));
  }
}

// transformers' labels = -100: its loss is the mean over the labels kept, position t scored against
// labels[t + 1] (it shifts them inside the model). The same batch with those targets, and -100 (ignored) for
// the rest and the last position, must give that loss.
TEST_P(Reference, MaskedLossMatchesTransformersLabels) {
  const std::string dir = data_dir(GetParam());
  const nlohmann::json meta = nlohmann::json::parse(std::ifstream(dir + "/reference.json"));
  if (!meta.contains("masked_loss")) GTEST_SKIP() << GetParam() << " was dumped without a masked loss";
  const HfModel hf = open_hf_model(dir);
  InMemoryChunks ch{ModelLayout(hf.config)};
  load_weights(hf.weights, ch);
  const SafetensorsReader ref(dir + "/reference.safetensors");
  const int B = meta["batch"], T = meta["seq_len"];
  const std::vector<float> ids = read_all(ref, "input_ids"), labels = read_all(ref, "labels");  // (B, T)
  std::vector<int32_t> in(std::size_t(B) * T), tgt(in.size(), -100);
  int kept = 0;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      in[std::size_t(b) * T + t] = int32_t(ids[std::size_t(b) * (T + 1) + t]);
      if (t + 1 < T) tgt[std::size_t(b) * T + t] = int32_t(labels[std::size_t(b) * T + t + 1]);
      kept += tgt[std::size_t(b) * T + t] >= 0;
    }
  ASSERT_GT(kept, 0);
  ASSERT_LT(kept, B * T - B);  // some are masked
  kernels::cpu::set_blas_threads(1);
  LlamaModel model(hf.config);
  const double want = meta["masked_loss"];
  EXPECT_NEAR(model.forward(ch, in.data(), tgt.data(), B, T), want, 1e-5 * want);
}

INSTANTIATE_TEST_SUITE_P(Transformers, Reference,
                         ::testing::Values("gqa_head_dim_untied", "tied", "rope_theta_5e5", "llama3_scaling",
                                           "mistral", "qwen2", "qwen3", "phi3", "phi3_longrope",
                                           "phi3_longrope_short", "gemma", "rope_linear", "rope_yarn",
                                           "mistral_window", "qwen2_window", "phi3_window"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace strata::model
