// EngineOptions::init_params (strata train --init-from): the engine starts from given weights in every
// placement — the fp32 master holds them exactly, the working params are their rounding to the working
// dtype — and trains the same from there wherever the state lives.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "engine_util.h"
#include "model/safetensors.h"

namespace strata::zero3 {
namespace {

using test::make_config;
using test::ScratchDir;

struct Placement {
  OffloadDevice param, optim;
};

class InitFrom : public ::testing::TestWithParam<Placement> {};

TEST_P(InitFrom, TheEngineStartsFromTheGivenWeights) {
  ScratchDir d("init-from");
  const model::ModelConfig mcfg = model::ModelConfig::preset("tiny");
  model::InMemoryChunks src{model::ModelLayout(mcfg)};
  src.init(/*seed=*/99);  // not the engine's seed (7): the engine must take these
  model::save_weights(d.file("w.safetensors"), src, DType::fp32);
  model::WeightsSource w(d.file("w.safetensors"), src.layout());

  Config cfg = make_config(GetParam().param, GetParam().optim, d.path());
  Engine e(cfg, mcfg,
           {.backend = "host", .seq_len = 32, .init_params = [&](const model::ChunkLayout& c, float* out) {
              w.read_chunk(c, out);
            }});
  // The engine's chunks are padded and aligned its own way: compare tensor by tensor.
  for (const model::ChunkLayout& c : e.layout().chunks()) {
    const model::ChunkLayout& s = src.layout().chunk(c.id);
    const std::vector<float> master = e.master_params(c.id);  // one rank: the whole chunk
    std::vector<float> working(c.padded_numel);
    e.read_params(c.id, working.data());
    for (std::size_t k = 0; k < c.tensors.size(); ++k) {
      const model::TensorSpec &t = c.tensors[k], &ts = s.tensors[k];
      const float* want = src.params(c.id) + ts.offset;
      EXPECT_EQ(0, std::memcmp(master.data() + t.offset, want, t.numel * sizeof(float))) << t.name;
      for (std::size_t i = 0; i < t.numel; ++i) {
        std::uint16_t h;
        kernels::cpu::cast_f32_to_bf16(&h, want + i, 1);
        float r;
        kernels::cpu::cast_bf16_to_f32(&r, &h, 1);
        ASSERT_EQ(working[t.offset + i], r)
            << t.name << "[" << i << "]: the working params are the bf16 rounding";
      }
    }
  }
}

// The same weights give the same losses in every placement (the engine's bit-identity across placements,
// from given weights rather than its own initialisation).
TEST(InitFrom, TrainsTheSameInEveryPlacement) {
  ScratchDir d("init-from-train");
  const model::ModelConfig mcfg = model::ModelConfig::preset("tiny");
  model::InMemoryChunks src{model::ModelLayout(mcfg)};
  src.init(99);
  model::save_weights(d.file("w.safetensors"), src, DType::fp32);
  model::WeightsSource w(d.file("w.safetensors"), src.layout());
  const std::string tokens = test::make_tokens(d);
  EngineOptions opts{.backend = "host",
                     .seq_len = 32,
                     .init_params = [&](const model::ChunkLayout& c, float* out) { w.read_chunk(c, out); }};
  const auto ref =
      test::train(make_config(OffloadDevice::cpu, OffloadDevice::cpu, d.path()), mcfg, tokens, 3, 32, opts);
  const auto nvme =
      test::train(make_config(OffloadDevice::nvme, OffloadDevice::nvme, d.path()), mcfg, tokens, 3, 32, opts);
  EXPECT_EQ(ref.losses, nvme.losses);
  const auto seeded =
      test::train(make_config(OffloadDevice::cpu, OffloadDevice::cpu, d.path()), mcfg, tokens, 3);
  EXPECT_NE(ref.losses.front(), seeded.losses.front()) << "the given weights, not the seeded ones, were used";
}

INSTANTIATE_TEST_SUITE_P(Placements, InitFrom,
                         ::testing::Values(Placement{OffloadDevice::cpu, OffloadDevice::cpu},
                                           Placement{OffloadDevice::none, OffloadDevice::none},
                                           Placement{OffloadDevice::nvme, OffloadDevice::nvme}),
                         [](const auto& info) {
                           return std::string(test::name(info.param.param)) + "_" +
                                  test::name(info.param.optim);
                         });

}  // namespace
}  // namespace strata::zero3
