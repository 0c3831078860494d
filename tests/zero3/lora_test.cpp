// LoRA adapters in the engine (model/lora.h): the base's chunks are frozen by the model's shape — their
// working copy alone, in offload_param's tier — and the adapter chunks train as any chunk does, so the
// oracles every route keeps hold for them: the same losses bit for bit at every placement, with the
// optimizer overlapped or not, and across a checkpoint.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "tests/zero3/engine_util.h"
#include "zero3/placement.h"

namespace strata::zero3 {
namespace {

using test::make_config;

model::ModelConfig lora_model() {
  model::ModelConfig m = test::block_model("lora", 2);
  m.lora = model::resolve_lora(m, {.modules = {"all-linear"}}, {.r = 4, .alpha = 8}, "test");
  return m;
}

constexpr int kSteps = 4;

class LoraPlacements : public ::testing::TestWithParam<std::tuple<OffloadDevice, OffloadDevice>> {};

// Every placement trains the adapters to the same losses, bit for bit, and the losses move (the adapters
// train); the base's params are never changed, the adapters' always are.
TEST_P(LoraPlacements, LossesEqualThePinnedRunsAndOnlyTheAdaptersChange) {
  test::ScratchDir dir("lora");
  const model::ModelConfig mcfg = lora_model();
  const std::string tokens = test::make_tokens(dir);
  const auto [param, optim] = GetParam();
  const Config cfg = make_config(param, optim, dir.path());
  const EngineOptions opts{.backend = "host", .seq_len = 32};
  const test::Run here = test::train(cfg, mcfg, tokens, kSteps, 32, opts);
  const test::Run pinned = test::train(make_config(OffloadDevice::cpu, OffloadDevice::cpu, dir.path()), mcfg,
                                       tokens, kSteps, 32, opts);
  EXPECT_EQ(here.losses, pinned.losses);
  EXPECT_NE(here.losses.front(), here.losses.back());

  kernels::cpu::set_blas_threads(1);
  Engine e(cfg, mcfg, opts);
  const int C = e.layout().num_chunks();
  std::vector<std::vector<float>> before(static_cast<std::size_t>(C));
  for (int c = 0; c < C; ++c) {
    before[std::size_t(c)].resize(e.layout().chunk(c).padded_numel);
    e.read_params(c, before[std::size_t(c)].data());
  }
  model::TokenFile file = model::TokenFile::open(tokens);
  model::DataLoader data(file, {.batch_size = e.micro_batch(), .seq_len = 32, .seed = 3, .vocab_size = 256});
  model::LlamaModel m(mcfg, e.model_options());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(e.train_batch(m, data).applied);
  for (int c = 0; c < C; ++c) {
    std::vector<float> now(before[std::size_t(c)].size());
    e.read_params(c, now.data());
    const bool same = std::memcmp(now.data(), before[std::size_t(c)].data(), now.size() * sizeof(float)) == 0;
    EXPECT_EQ(same, e.layout().is_base(c)) << e.layout().chunk(c).name;
    EXPECT_EQ(e.trains(c), !e.layout().is_base(c)) << e.layout().chunk(c).name;
  }
}

INSTANTIATE_TEST_SUITE_P(Placements, LoraPlacements,
                         ::testing::Values(std::tuple{OffloadDevice::none, OffloadDevice::none},
                                           std::tuple{OffloadDevice::nvme, OffloadDevice::nvme}),
                         [](const auto& i) {
                           return test::placement_name(std::get<0>(i.param), std::get<1>(i.param), false);
                         });

TEST(LoraOverlap, LossesEqualThoseWithoutTheOverlap) {
  test::ScratchDir dir("lora-overlap");
  const model::ModelConfig mcfg = lora_model();
  const std::string tokens = test::make_tokens(dir);
  Config on = make_config(OffloadDevice::cpu, OffloadDevice::cpu, dir.path()), off = on;
  on.strata.overlap_optimizer = StrataConfig::Overlap::on;
  off.strata.overlap_optimizer = StrataConfig::Overlap::off;
  const EngineOptions opts{.backend = "host", .seq_len = 32};
  EXPECT_EQ(test::train(on, mcfg, tokens, kSteps, 32, opts).losses,
            test::train(off, mcfg, tokens, kSteps, 32, opts).losses);
}

// Two steps, a checkpoint, two more in another placement: the four steps of one run, bit for bit.
TEST(LoraResume, TwoStepsSavedAndTwoMoreAreFourStepsBitForBit) {
  test::ScratchDir dir("lora-resume");
  const model::ModelConfig mcfg = lora_model();
  const std::string tokens = test::make_tokens(dir);
  const Config pinned = make_config(OffloadDevice::cpu, OffloadDevice::cpu, dir.path());
  const Config nvme = make_config(OffloadDevice::nvme, OffloadDevice::nvme, dir.path());
  const EngineOptions opts{.backend = "host", .seq_len = 32};
  const std::vector<double> whole = test::train(pinned, mcfg, tokens, 4, 32, opts).losses;
  const std::vector<double> resumed =
      test::resumed_losses(pinned, nvme, mcfg, tokens, dir.file("ckpt"), opts, 2, 2);
  EXPECT_EQ(resumed, whole);
}

// Note [The adapters' base in checkpoints]: with the base named, a checkpoint holds the adapters alone (the
// base's working copy is not written), resumes over the same digest, and is refused over another, or
// without a named base, by name.
TEST(LoraResume, ACheckpointNamesItsBaseAndResumesOverThatBaseOnly) {
  test::ScratchDir dir("lora-base");
  const model::ModelConfig mcfg = lora_model();
  const Config cfg = make_config(OffloadDevice::cpu, OffloadDevice::cpu, dir.path());
  const EngineOptions opts{.backend = "host", .seq_len = 32};
  const nlohmann::json base = {{"path", "models/base"}, {"digest", "crc32c:00000001/1"}};
  std::uint64_t whole = 0, named = 0;
  {
    Engine e(cfg, mcfg, opts);
    whole = e.checkpoint_bytes();
    e.set_base(base);
    named = e.checkpoint_bytes();
    e.save_checkpoint(dir.file("ckpt"));
  }
  EXPECT_LT(named * 3, whole) << "the base's working copy is not in the checkpoint";
  {
    Engine same(cfg, mcfg, opts);
    same.set_base(base);
    EXPECT_NO_THROW(same.load_checkpoint(dir.file("ckpt")));
  }
  Engine other(cfg, mcfg, opts), none(cfg, mcfg, opts);
  other.set_base({{"path", "models/other"}, {"digest", "crc32c:00000002/1"}});
  for (Engine* e : {&other, &none}) {
    try {
      e->load_checkpoint(dir.file("ckpt"));
      ADD_FAILURE() << "loaded over another base";
    } catch (const ConfigError& err) {
      EXPECT_NE(std::string(err.what()).find("models/base"), std::string::npos) << err.what();
    }
  }
}

// The state is the base's working copy (bf16: 2 bytes a parameter) and the adapters' full state (their
// working copy and 16 bytes a parameter: master, gradient shard, two moments): against the same base
// trained in full, the plan's pinned state loses 16 bytes a base parameter and gains the adapters' 18.
TEST(LoraPlan, PinnedStateIsTheBasesWorkingCopyAndTheAdaptersFullState) {
  test::ScratchDir dir("lora-plan");
  const Config cfg = make_config(OffloadDevice::cpu, OffloadDevice::cpu, dir.path());
  const model::ModelConfig mcfg = lora_model();
  model::ModelConfig base = mcfg;
  base.lora = {};
  Engine e(cfg, mcfg, {.backend = "host", .seq_len = 32}),
      full(cfg, base, {.backend = "host", .seq_len = 32});
  std::uint64_t base_numel = 0, adapter_numel = 0;
  for (const model::ChunkLayout& c : e.layout().chunks())
    (e.layout().is_base(c.id) ? base_numel : adapter_numel) += c.padded_numel;
  EXPECT_EQ(e.plan().pinned_state + 16 * base_numel, full.plan().pinned_state + 18 * adapter_numel);
  EXPECT_LT(e.plan().pinned_state, full.plan().pinned_state / 4);
}

}  // namespace
}  // namespace strata::zero3
