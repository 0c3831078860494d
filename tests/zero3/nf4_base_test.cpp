// QLoRA's base in the engine (Note [NF4 base] in model/nf4_chunk.h): the frozen blocks' projections kept
// packed in NF4 in offload_param's tier, dequantised by each gather; and the adapters' working params off
// NVMe (Note [Adapters off NVMe] in zero3/placement.cpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/ops.h"
#include "model/architecture.h"
#include "model/nf4_chunk.h"
#include "tests/zero3/engine_util.h"
#include "tiering/accounting.h"
#include "zero3/placement.h"

namespace strata::zero3 {
namespace {

using test::make_config;

model::ModelConfig adapted(bool nf4, bool double_quant = true) {
  model::ModelConfig m = test::block_model("qlora", 2);
  m.lora = model::resolve_lora(m, {.modules = {"all-linear"}},
                               {.r = 4, .alpha = 8, .nf4_base = nf4, .double_quant = double_quant}, "test");
  return m;
}

constexpr int kSteps = 4;
const EngineOptions kOpts{.backend = "host", .seq_len = 32};

// What a gather of base chunk c must hold, in fp32: its initial values packed and unpacked (the NF4 parts
// dequantised, the rest rounded to bf16), or for a chunk without projections their bf16 rounding.
std::vector<float> dequantised_base(const Engine& e, const model::ModelConfig& mcfg, const Config& cfg,
                                    int c) {
  const model::ChunkLayout& cl = e.layout().chunk(c);
  std::vector<float> init(cl.padded_numel), out(cl.padded_numel);
  model::architecture(mcfg).init_chunk(e.layout(), c, std::uint64_t(cfg.strata.seed), init.data());
  if (model::nf4_quantizes(cl)) {
    const model::Nf4Chunk f = model::nf4_chunk(cl, DType::bf16, mcfg.lora.double_quant);
    std::vector<std::byte> packed(f.bytes);
    const std::vector<float> offsets = model::pack_nf4(f, init.data(), packed.data());
    model::unpack_nf4(f, packed.data(), offsets, out.data());
  } else {
    std::vector<kernels::cpu::bf16_t> h(init.size());
    kernels::cpu::cast_f32_to_bf16(h.data(), init.data(), init.size());
    kernels::cpu::cast_bf16_to_f32(out.data(), h.data(), init.size());
  }
  return out;
}

class Nf4Base : public ::testing::TestWithParam<bool> {};  // double quantisation

// read_params (the CPU's unpacking) and the gathered chunk (the compute interface's dequantisation on the
// gather stream) both hold the dequantised base, bit for bit, at every placement of the base.
TEST_P(Nf4Base, GathersHoldTheDequantisedBase) {
  test::ScratchDir dir("nf4-gather");
  const model::ModelConfig mcfg = adapted(true, GetParam());
  for (OffloadDevice param : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme}) {
    const Config cfg = make_config(param, OffloadDevice::cpu, dir.path());
    Engine e(cfg, mcfg, kOpts);
    for (int c = 0; c < e.layout().num_chunks(); ++c) {
      if (!e.layout().is_base(c)) continue;
      const std::vector<float> want = dequantised_base(e, mcfg, cfg, c);
      std::vector<float> got(want.size());
      e.read_params(c, got.data());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
          << e.layout().chunk(c).name << ", offload_param " << offload_name(param);
      const model::ChunkView v = e.acquire(c);
      e.model_options().ops->stream().synchronize();  // the compute stream waits for the gather, not the host
      ASSERT_EQ(v.dtype, DType::bf16) << "bf16 training gathers bf16 on the host backend";
      std::vector<kernels::cpu::bf16_t> want16(want.size());
      kernels::cpu::cast_f32_to_bf16(want16.data(), want.data(), want.size());
      EXPECT_EQ(std::memcmp(v.data, want16.data(), want16.size() * 2), 0) << e.layout().chunk(c).name;
      e.release(c);
    }
  }
}

// Every placement of the NF4 base trains the adapters to the same losses, bit for bit, and they move.
TEST_P(Nf4Base, PlacementsTrainToTheSameLosses) {
  test::ScratchDir dir("nf4-placements");
  const model::ModelConfig mcfg = adapted(true, GetParam());
  const std::string tokens = test::make_tokens(dir);
  const test::Run pinned = test::train(make_config(OffloadDevice::cpu, OffloadDevice::cpu, dir.path()), mcfg,
                                       tokens, kSteps, 32, kOpts);
  EXPECT_NE(pinned.losses.front(), pinned.losses.back());
  for (auto [param, optim] : {std::tuple{OffloadDevice::none, OffloadDevice::none},
                              std::tuple{OffloadDevice::nvme, OffloadDevice::nvme}})
    EXPECT_EQ(test::train(make_config(param, optim, dir.path()), mcfg, tokens, kSteps, 32, kOpts).losses,
              pinned.losses)
        << offload_name(param) << " / " << offload_name(optim);
}

INSTANTIATE_TEST_SUITE_P(Absmax, Nf4Base, ::testing::Bool(),
                         [](const auto& i) { return i.param ? "DoubleQuant" : "Fp32Absmax"; });

// The base's tier holds the packed bytes: against the same adapters over a bf16 base, the pinned state
// shrinks by 2 bytes a parameter of each packed chunk less its packed bytes, about 1.48 bytes a quantised
// parameter.
TEST(Nf4Plan, TheBasesTierHoldsThePackedBytes) {
  test::ScratchDir dir("nf4-plan");
  const Config cfg = make_config(OffloadDevice::cpu, OffloadDevice::cpu, dir.path());
  const Engine nf4(cfg, adapted(true), kOpts), bf16(cfg, adapted(false), kOpts);
  std::uint64_t saved = 0, quantised = 0;
  for (const model::ChunkLayout& c : nf4.layout().chunks()) {
    if (!nf4.layout().is_base(c.id) || !model::nf4_quantizes(c)) continue;
    const model::Nf4Chunk f = model::nf4_chunk(c, DType::bf16, true);
    saved += 2 * c.padded_numel - f.bytes;
    quantised += f.quantized;
  }
  EXPECT_EQ(bf16.plan().pinned_state - nf4.plan().pinned_state, saved);
  EXPECT_GT(double(saved), 1.45 * double(quantised));
}

// Two steps, a checkpoint (the base named, never written), two more in another placement: the four steps
// of one run, bit for bit.
TEST(Nf4Resume, TwoStepsSavedAndTwoMoreAreFourStepsBitForBit) {
  test::ScratchDir dir("nf4-resume");
  const model::ModelConfig mcfg = adapted(true);
  const std::string tokens = test::make_tokens(dir);
  const nlohmann::json base = {{"path", "models/base"}, {"digest", "crc32c:00000001/1"}};
  const Config pinned = make_config(OffloadDevice::cpu, OffloadDevice::cpu, dir.path());
  const Config nvme = make_config(OffloadDevice::nvme, OffloadDevice::nvme, dir.path());
  const std::vector<double> whole = test::train(pinned, mcfg, tokens, 4, 32, kOpts).losses;
  kernels::cpu::set_blas_threads(1);
  model::TokenFile file = model::TokenFile::open(tokens);
  std::vector<double> resumed;
  std::uint64_t bytes = 0;
  {
    Engine e(pinned, mcfg, kOpts);
    e.set_base(base);
    bytes = e.checkpoint_bytes();
    model::DataLoader data(file,
                           {.batch_size = e.micro_batch(), .seq_len = 32, .seed = 3, .vocab_size = 256});
    model::LlamaModel m(mcfg, e.model_options());
    for (int i = 0; i < 2; ++i) resumed.push_back(e.train_batch(m, data).loss);
    e.save_checkpoint(dir.file("ckpt"), {}, &data);
  }
  Engine e(nvme, mcfg, kOpts);
  e.set_base(base);
  model::DataLoader data(file, {.batch_size = e.micro_batch(), .seq_len = 32, .seed = 3, .vocab_size = 256});
  e.load_checkpoint(dir.file("ckpt"), "", &data);
  model::LlamaModel m(mcfg, e.model_options());
  for (int i = 0; i < 2; ++i) resumed.push_back(e.train_batch(m, data).loss);
  EXPECT_EQ(resumed, whole);
  std::uint64_t adapters = 0;
  for (const model::ChunkLayout& c : e.layout().chunks())
    if (!e.layout().is_base(c.id)) adapters += c.padded_numel;
  EXPECT_LT(bytes, 18 * adapters + (std::uint64_t(1) << 20)) << "the checkpoint holds the adapters alone";
}

// Note [Adapters off NVMe]: with offload_param nvme the base is read from NVMe and never written; the
// adapters' working params stay in pinned memory, so a step writes nothing to NVMe (the optimizer's state
// in pinned memory here), and the plan's NVMe params are the base's alone.
TEST(AdaptersOffNvme, AStepWritesNothingToNvmeAndTheBaseAloneIsThere) {
  test::ScratchDir dir("adapters-off-nvme");
  const std::string tokens = test::make_tokens(dir);
  for (bool nf4 : {false, true}) {
    const model::ModelConfig mcfg = adapted(nf4);
    kernels::cpu::set_blas_threads(1);
    Engine e(make_config(OffloadDevice::nvme, OffloadDevice::cpu, dir.path()), mcfg, kOpts);
    std::uint64_t base_bytes = 0;
    for (const model::ChunkLayout& c : e.layout().chunks()) {
      if (!e.layout().is_base(c.id)) continue;
      base_bytes +=
          nf4 && model::nf4_quantizes(c) ? model::nf4_chunk(c, DType::bf16, true).bytes : 2 * c.padded_numel;
    }
    EXPECT_EQ(e.plan().nvme_params, base_bytes) << (nf4 ? "nf4" : "bf16");
    for (const UpdateRoute& r : e.update_routes()) {
      if (r.trains) {
        EXPECT_EQ(r.param_home, tiering::Tier::pinned);
      }
    }
    model::TokenFile file = model::TokenFile::open(tokens);
    model::DataLoader data(file,
                           {.batch_size = e.micro_batch(), .seq_len = 32, .seed = 3, .vocab_size = 256});
    model::LlamaModel m(mcfg, e.model_options());
    const int to_nvme = tiering::direction(tiering::Tier::pinned, tiering::Tier::nvme);
    const std::uint64_t before = e.tiers().snapshot().moves[std::size_t(to_nvme)].bytes;
    for (int i = 0; i < 2; ++i) ASSERT_TRUE(e.train_batch(m, data).applied);
    EXPECT_EQ(e.tiers().snapshot().moves[std::size_t(to_nvme)].bytes, before) << (nf4 ? "nf4" : "bf16");
  }
}

}  // namespace
}  // namespace strata::zero3
