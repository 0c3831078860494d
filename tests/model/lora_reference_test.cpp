// LoRA against PEFT: tests/reference/make_lora_reference.py (run by hand: torch, transformers, peft) saves
// a tiny random base of four families, a PEFT adapter over it (B drawn nonzero) with PEFT's own
// save_pretrained, and PEFT's first loss, logits, every trainable parameter's gradient and the losses of 10
// AdamW steps over the trainable parameters (tests/reference/data/lora_<family>/). Here the base loads as
// `--init-from` reads it, the adapters as `--adapter` reads PEFT's files (adapter_config.json's settings,
// adapter_model.safetensors under PEFT's key names), and the CPU ops in fp32 must agree.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "model/hf_dir.h"
#include "model/layout.h"
#include "model/llama.h"
#include "model/lora.h"
#include "model/safetensors.h"
#include "reference_util.h"
#include "tests/common/source_dir.h"

namespace strata::model {
namespace {

using testing::norm;
using testing::read_all;

// PEFT's key of a tensor the adapter file holds: the model's name under "base_model.model.".
std::string peft_key(const TensorSpec& t) {
  return "base_model.model." + t.hf_name;
}

struct Loaded {
  ModelConfig cfg;
  std::unique_ptr<InMemoryChunks> chunks;
};

// The base from base/, the adapters (and any saved module) from adapter/, as the front-ends load them.
Loaded load(const std::string& dir) {
  const HfModel hf = open_hf_model(dir + "/base");
  const nlohmann::json ac = nlohmann::json::parse(std::ifstream(dir + "/adapter/adapter_config.json"));
  Loaded out;
  out.cfg = hf.config;
  LoraTargets targets;
  if (ac["target_modules"].is_string())
    targets.modules = {ac["target_modules"].get<std::string>()}, targets.regex = true;
  else
    targets.modules = ac["target_modules"].get<std::vector<std::string>>();
  if (!ac["modules_to_save"].is_null()) targets.modules_to_save = ac["modules_to_save"];
  out.cfg.lora = resolve_lora(hf.config, targets,
                              {.r = ac["r"], .alpha = ac["lora_alpha"], .rslora = ac["use_rslora"]}, dir);
  out.chunks = std::make_unique<InMemoryChunks>(ModelLayout(out.cfg));
  const ModelLayout& layout = out.chunks->layout();
  const WeightsSource base(hf.weights, ModelLayout(hf.config));
  const SafetensorsReader adapter(dir + "/adapter/adapter_model.safetensors");
  for (const ChunkLayout& c : layout.chunks()) {
    const bool from_adapter = c.kind == ChunkKind::adapter || c.kind == ChunkKind::lm_head ||
                              (c.kind == ChunkKind::embedding && out.cfg.lora.save_embed);
    if (!from_adapter) {
      base.read_chunk(c, out.chunks->params(c.id));
      continue;
    }
    for (const TensorSpec& t : c.stored)
      adapter.read_f32(peft_key(t), t.shape, out.chunks->params(c.id) + t.offset, t.name);
  }
  for (int id : layout.frozen_chunks()) out.chunks->freeze(id);
  return out;
}

class PeftReference : public ::testing::TestWithParam<std::string> {};

TEST_P(PeftReference, LossGradientsAndTenAdamWStepsMatchPeft) {
  const std::string dir = strata::test::source_path("tests/reference/data/" + GetParam());
  Loaded l = load(dir);
  InMemoryChunks& ch = *l.chunks;
  const nlohmann::json meta = nlohmann::json::parse(std::ifstream(dir + "/reference.json"));
  const SafetensorsReader ref(dir + "/reference.safetensors");
  EXPECT_FLOAT_EQ(l.cfg.lora.scale(), float(meta["scaling"].get<double>()));
  const testing::ShiftedBatch batch = testing::shifted_batch(ref, meta);
  const int B = batch.B, T = batch.T;
  const std::vector<int32_t>&in = batch.in, &tgt = batch.tgt;
  kernels::cpu::set_blas_threads(1);
  LlamaModel model(l.cfg);
  ch.zero_grads();
  const float loss = model.forward(ch, in.data(), tgt.data(), B, T);
  testing::expect_logits_match(model.logits(), ref);
  const double want_loss = meta["loss"];
  EXPECT_NEAR(loss, want_loss, 1e-6 * want_loss);

  model.backward(ch);
  int checked = 0;
  for (const ChunkLayout& c : ch.layout().chunks()) {
    if (!ch.trains(c.id)) continue;
    for (const TensorSpec& t : c.stored) {
      const std::vector<float> want = read_all(ref, "grad." + peft_key(t));
      ASSERT_EQ(want.size(), t.numel) << t.hf_name;
      const float* got = ch.grads(c.id) + t.offset;
      std::vector<float> diff(t.numel);
      for (std::size_t i = 0; i < t.numel; ++i) diff[i] = got[i] - want[i];
      EXPECT_LE(norm(diff.data(), t.numel), 1e-4 * norm(want.data(), t.numel)) << t.hf_name;
      ++checked;
    }
  }
  int theirs = 0;  // every parameter PEFT trains was checked
  for (const SafetensorsEntry& e : ref.entries()) theirs += e.name.rfind("grad.", 0) == 0 ? 1 : 0;
  EXPECT_EQ(checked, theirs);

  // 10 AdamW steps over the trainable chunks only (torch.optim.AdamW over PEFT's trainable parameters).
  Loaded fresh = load(dir);
  const auto& a = meta["adamw"];
  kernels::cpu::AdamWParams hp;
  hp.lr = a["lr"];
  hp.beta1 = a["beta1"];
  hp.beta2 = a["beta2"];
  hp.eps = a["eps"];
  hp.weight_decay = a["weight_decay"];
  const std::size_t n = fresh.chunks->layout().total_padded_numel();
  std::vector<float> m(n), v(n);
  LlamaModel trained(fresh.cfg);
  const std::vector<double> want_steps = meta["step_losses"];
  for (std::size_t s = 0; s < want_steps.size(); ++s) {
    fresh.chunks->zero_grads();
    const float got = trained.forward(*fresh.chunks, in.data(), tgt.data(), B, T);
    EXPECT_NEAR(got, want_steps[s], 1e-4 * want_steps[s]) << "step " << s + 1;
    trained.backward(*fresh.chunks);
    for (const ChunkLayout& c : fresh.chunks->layout().chunks()) {
      if (!fresh.chunks->trains(c.id)) continue;
      kernels::cpu::adamw_update(fresh.chunks->params(c.id), fresh.chunks->grads(c.id),
                                 m.data() + c.flat_offset, v.data() + c.flat_offset, nullptr, c.padded_numel,
                                 hp, std::int64_t(s + 1));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Peft, PeftReference,
                         ::testing::Values("lora_llama", "lora_qwen2", "lora_phi3", "lora_mistral"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace strata::model
