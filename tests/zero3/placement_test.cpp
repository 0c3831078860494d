// DESIGN.md §7: on the host backend the same seed gives bit-identical per-step losses whatever
// offload_param and offload_optimizer are — all nine combinations of none / cpu / nvme for tiny (Llama), and
// for every other family (Note [Model families] in model/config.h: biases, per-head norms, fused
// projections, Gemma's norm and embedding scale all travel through the chunks like any tensor) the offload
// placements against no offload.
#include <gtest/gtest.h>

#include "engine_util.h"

namespace strata::zero3 {
namespace {

using test::make_config;
using test::make_tokens;
using test::ScratchDir;
using test::train;

constexpr int kSteps = 3;

const test::Run& reference() {
  static ScratchDir d("placement-ref");
  static const test::Run r = train(make_config(OffloadDevice::none, OffloadDevice::none, d.path()),
                                   model::ModelConfig::preset("tiny"), make_tokens(d), kSteps);
  return r;
}

class Placement : public ::testing::TestWithParam<std::tuple<OffloadDevice, OffloadDevice>> {};

TEST_P(Placement, LossesAreBitIdenticalToNoOffload) {
  const auto [param, optim] = GetParam();
  ScratchDir d("placement");
  const test::Run r =
      train(make_config(param, optim, d.path()), model::ModelConfig::preset("tiny"), make_tokens(d), kSteps);
  const test::Run& ref = reference();
  ASSERT_EQ(r.losses.size(), ref.losses.size());
  for (std::size_t i = 0; i < r.losses.size(); ++i) {
    EXPECT_EQ(r.losses[i], ref.losses[i]) << "step " << i + 1;  // exact: bit-identical
    EXPECT_TRUE(r.applied[i]);
  }
  EXPECT_LT(r.losses.back(), r.losses.front());  // and it trains
}

INSTANTIATE_TEST_SUITE_P(
    AllNine, Placement,
    ::testing::Combine(::testing::Values(OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme),
                       ::testing::Values(OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme)),
    [](const auto& info) {
      return std::string("param_") + test::name(std::get<0>(info.param)) + "_optim_" +
             test::name(std::get<1>(info.param));
    });

class FamilyPlacement
    : public ::testing::TestWithParam<std::tuple<std::string, std::tuple<OffloadDevice, OffloadDevice>>> {};

TEST_P(FamilyPlacement, LossesAreBitIdenticalToNoOffload) {
  const auto& [family, placement] = GetParam();
  const auto [param, optim] = placement;
  const model::ModelConfig m = model::ModelConfig::preset("tiny-" + family);
  ScratchDir d("family-placement"), dr("family-placement-ref");
  const test::Run r = train(make_config(param, optim, d.path()), m, make_tokens(d), kSteps);
  const test::Run ref =
      train(make_config(OffloadDevice::none, OffloadDevice::none, dr.path()), m, make_tokens(dr), kSteps);
  ASSERT_EQ(r.losses.size(), ref.losses.size());
  for (std::size_t i = 0; i < r.losses.size(); ++i) {
    EXPECT_EQ(r.losses[i], ref.losses[i]) << "step " << i + 1;
    EXPECT_TRUE(r.applied[i]);
  }
  EXPECT_LT(r.losses.back(), r.losses.front());
}

INSTANTIATE_TEST_SUITE_P(
    Families, FamilyPlacement,
    ::testing::Combine(::testing::Values("mistral", "qwen2", "qwen3", "phi3", "gemma"),
                       ::testing::Values(std::make_tuple(OffloadDevice::cpu, OffloadDevice::cpu),
                                         std::make_tuple(OffloadDevice::nvme, OffloadDevice::nvme),
                                         std::make_tuple(OffloadDevice::none, OffloadDevice::nvme))),
    [](const auto& info) {
      const auto& placement = std::get<1>(info.param);
      return std::get<0>(info.param) + "_param_" + test::name(std::get<0>(placement)) + "_optim_" +
             test::name(std::get<1>(placement));
    });

}  // namespace
}  // namespace strata::zero3
