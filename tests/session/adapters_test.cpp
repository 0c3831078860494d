// LoRA adapters through the session (session/adapters.h, Note [Adapter directories]): a PEFT adapter
// directory (tests/reference/data/lora_*/adapter, written by PEFT 0.21.2) sets the model's adapters and
// their weights, the exports write back what was read, the merged export of untrained adapters is the base,
// and an adapter directory for another base or with other shapes is refused by name before any step.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/nf4.h"
#include "model/hf_dir.h"
#include "model/safetensors.h"
#include "session/adapters.h"
#include "session/session.h"
#include "tests/common/scratch_dir.h"
#include "tests/common/source_dir.h"

namespace strata::session {
namespace {

namespace fs = std::filesystem;

std::string data(const std::string& rel) {
  return test::source_path("tests/reference/data/" + rel);
}

Config host_config(const nlohmann::json& lora = nullptr) {
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", 1},
      {"bf16", {{"enabled", true}}},
      {"zero_optimization",
       {{"stage", 3}, {"offload_param", {{"device", "cpu"}}}, {"offload_optimizer", {{"device", "cpu"}}}}},
      {"strata", {{"backend", "host"}, {"cpu_optim", {{"pin_threads", false}}}}}};
  if (!lora.is_null()) j["strata"]["lora"] = lora;
  return Config::parse(nlohmann::json::parse(j.dump()), {}, 1);
}

ModelSource llama_base() {
  return open_model(data("lora_llama/base"), Weights::allowed);
}

std::string refusal(ModelSource src, const StrataConfig::Lora& block, const std::string& dir) {
  try {
    resolve_adapters(src, block, dir, "--adapter");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

std::vector<float> tensor(const model::SafetensorsReader& r, const std::string& name) {
  const model::SafetensorsEntry* e = r.find(name);
  EXPECT_NE(e, nullptr) << name;
  if (!e) return {};
  std::vector<float> v(e->numel());
  r.read_f32(name, e->shape, v.data());
  return v;
}

TEST(Adapters, APeftDirectorySetsTheAdaptersItWasSavedWith) {
  ModelSource src = llama_base();
  resolve_adapters(src, {}, data("lora_llama/adapter"), "--adapter");
  EXPECT_EQ(src.config.lora.r, 8);
  EXPECT_FLOAT_EQ(src.config.lora.scale(), 2.0f);
  EXPECT_TRUE(src.config.lora.save_lm_head);
  EXPECT_EQ(model::lora_target_paths(src.config).size(), 14u);
}

// Step 0's export writes back the adapter file it started from, bit for bit (fp32 masters of fp32 values),
// and a config PEFT reads to the same modules.
TEST(Adapters, ExportAtStepZeroWritesBackTheDirectoryItRead) {
  test::ScratchDir dir("adapters-export");
  ModelSource src = llama_base();
  Config cfg = host_config();
  cfg.strata.lora.adapter_dir = data("lora_llama/adapter");
  resolve_adapters(src, cfg.strata.lora, cfg.strata.lora.adapter_dir, "--adapter");
  Trainer t = build(cfg, src, 16, {}, {.backend = "host"});
  export_adapter(*t.engine, dir.file("out"), src);
  const model::SafetensorsReader in(data("lora_llama/adapter/adapter_model.safetensors"));
  const model::SafetensorsReader out(dir.file("out/adapter_model.safetensors"));
  ASSERT_EQ(in.entries().size(), out.entries().size());
  for (const model::SafetensorsEntry& e : in.entries()) {
    const std::vector<float> a = tensor(in, e.name), b = tensor(out, e.name);
    ASSERT_EQ(a.size(), b.size()) << e.name;
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << e.name;
  }
  ModelSource again = llama_base();
  resolve_adapters(again, {}, dir.file("out"), "--adapter");
  EXPECT_EQ(again.config, src.config);
}

// Fresh adapters (B = 0) merged are the base's working copy exactly.
TEST(Adapters, MergedExportOfUntrainedAdaptersIsTheBase) {
  test::ScratchDir dir("adapters-merged");
  ModelSource src = llama_base();
  Config cfg = host_config({{"r", 4}, {"target_modules", "all-linear"}});
  resolve_adapters(src, cfg.strata.lora, "", "--adapter");
  Trainer t = build(cfg, src, 16, {}, {.backend = "host"});
  export_merged(*t.engine, dir.file("merged.safetensors"), src);
  const model::SafetensorsReader merged(dir.file("merged.safetensors"));
  const model::SafetensorsReader base(data("lora_llama/base/model.safetensors"));
  ASSERT_EQ(merged.entries().size(), base.entries().size());
  for (const model::SafetensorsEntry& e : base.entries()) {
    std::vector<float> want = tensor(base, e.name);
    for (float& v : want) v = bf16_to_f32(f32_to_bf16(v));  // the working copy, bf16
    const std::vector<float> got = tensor(merged, e.name);
    ASSERT_EQ(got.size(), want.size()) << e.name;
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << e.name;
  }
}

TEST(Adapters, ADirectoryMadeForAnotherBaseIsRefusedByName) {
  test::ScratchDir dir("adapters-other-base");
  fs::copy(data("lora_llama/adapter"), dir.file("a"), fs::copy_options::recursive);
  nlohmann::json j = nlohmann::json::parse(std::ifstream(dir.file("a/adapter_config.json")));
  j["base_model_name_or_path"] = "meta-llama/Llama-3.2-1B";
  std::ofstream(dir.file("a/adapter_config.json")) << j.dump();
  const std::string e = refusal(llama_base(), {}, dir.file("a"));
  EXPECT_NE(e.find("Llama-3.2-1B"), std::string::npos) << e;
}

TEST(Adapters, AnAdapterFileWithOtherShapesIsRefusedBeforeAnyStep) {
  // lora_mistral's adapters target other modules of a base of another shape.
  ModelSource src = open_model(data("lora_llama/base"), Weights::allowed);
  resolve_adapters(src, {}, data("lora_llama/adapter"), "--adapter");
  src.config.lora =
      model::resolve_lora(src.config, {.modules = {"q_proj", "down_proj"}}, {.r = 8, .alpha = 16}, "test");
  try {
    AdapterWeights w(data("lora_mistral/adapter"), model::ModelLayout(src.config), "--adapter");
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--adapter"), std::string::npos) << e.what();
  }
}

TEST(Adapters, TheBlockMayRestateTheDirectorysSettingsNotChangeThem) {
  StrataConfig::Lora block;
  block.enabled = true;
  block.r = 16;
  block.target_modules = {"all-linear"};
  const std::string e = refusal(llama_base(), block, data("lora_llama/adapter"));
  EXPECT_NE(e.find("strata.lora.r"), std::string::npos) << e;
}

// Over an NF4 base (Note [NF4 base] in model/nf4_chunk.h), fresh adapters merged are the dequantised base
// exactly: each projection loaded in bf16 and quantised alone, as bitsandbytes dequantises it
// (kernels/cpu/nf4.h, checked against bitsandbytes bit for bit), rounded to bf16; the other tensors their
// bf16 working copy.
TEST(Adapters, MergedExportOverAnNf4BaseIsTheDequantisedBase) {
  test::ScratchDir dir("adapters-merged-nf4");
  ModelSource src = llama_base();
  Config cfg = host_config({{"r", 4}, {"target_modules", "all-linear"}, {"base_dtype", "nf4"}});
  resolve_adapters(src, cfg.strata.lora, "", "--adapter");
  ASSERT_TRUE(src.config.lora.nf4_base);
  ASSERT_TRUE(src.config.lora.double_quant);
  Trainer t = build(cfg, src, 16, {}, {.backend = "host"});
  export_merged(*t.engine, dir.file("merged.safetensors"), src);
  const model::SafetensorsReader merged(dir.file("merged.safetensors"));
  const model::SafetensorsReader base(data("lora_llama/base/model.safetensors"));
  int quantised = 0;
  for (const model::SafetensorsEntry& e : base.entries()) {
    std::vector<float> want = tensor(base, e.name);
    if (e.name.starts_with("model.layers.") && e.name.ends_with("_proj.weight")) {
      for (float& v : want) v = bf16_to_f32(f32_to_bf16(v));  // loaded in bf16, then quantised
      const std::size_t n = want.size(), nblocks = kernels::cpu::nf4_blocks(n, 64);
      std::vector<std::uint8_t> codes(kernels::cpu::nf4_code_bytes(n));
      std::vector<float> absmax(nblocks);
      kernels::cpu::quantize_nf4(want.data(), n, 64, codes.data(), absmax.data());
      kernels::cpu::dequantize_nf4_absmax(kernels::cpu::quantize_nf4_absmax(absmax.data(), nblocks), nblocks,
                                          absmax.data());
      kernels::cpu::dequantize_nf4(codes.data(), absmax.data(), n, 64, want.data());
      ++quantised;
    }
    for (float& v : want) v = bf16_to_f32(f32_to_bf16(v));
    const std::vector<float> got = tensor(merged, e.name);
    ASSERT_EQ(got.size(), want.size()) << e.name;
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << e.name;
  }
  EXPECT_EQ(quantised, 7 * int(src.config.n_layers));
}

// The NF4 base is quantised from the base's files; a model without files (a preset) is refused by build(),
// before any state exists, naming the setting and the way out.
TEST(Adapters, AnNf4BaseWithoutFilesIsRefusedByName) {
  ModelSource src = open_model("tiny", Weights::fresh_only);
  Config cfg = host_config({{"r", 4}, {"target_modules", "all-linear"}, {"base_dtype", "nf4"}});
  resolve_adapters(src, cfg.strata.lora, "", "--adapter");
  try {
    build(cfg, src, 16, {}, {.backend = "host"});
    ADD_FAILURE() << "an NF4 base without files was built";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("base_dtype \"nf4\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--init-from"), std::string::npos) << e.what();
  }
}

TEST(Adapters, LoraDropoutIsAccepted) {
  StrataConfig::Lora block;
  block.enabled = true;
  block.target_modules = {"all-linear"};
  block.lora_dropout = 0.1;
  ModelSource src = llama_base();
  resolve_adapters(src, block, "", "--adapter");
  EXPECT_EQ(src.config.lora.dropout, 0.1);
}

}  // namespace
}  // namespace strata::session
