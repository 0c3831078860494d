// The checkpointed block inputs off the device (Note [Checkpoints off the device] in
// zero3/engine_checkpoints.h): activation_checkpointing.cpu_checkpointing plans them in pinned host memory
// with a bounded window on the device, "auto" offloads only where the device would not hold them, the
// losses and gradient norms are those of the run with them on the device bit for bit at every placement,
// and memprof's trace shows each going out and coming back.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "tests/zero3/engine_util.h"
#include "tools/memprof/memprof.h"

namespace strata::zero3::test {
namespace {

const model::ModelConfig kModel = block_model("blocks", 4);
constexpr int kSeq = 32;

Config offload_config(OffloadDevice param, OffloadDevice optim, const std::string& nvme,
                      const nlohmann::json& cpu_checkpointing, const nlohmann::json& extra = {}) {
  nlohmann::json x = {{"strata", {{"checkpoint_activations", true}}},
                      {"activation_checkpointing", {{"cpu_checkpointing", cpu_checkpointing}}}};
  if (!extra.is_null()) x.merge_patch(extra);
  return make_config(param, optim, nvme, x);
}

EngineOptions opts(std::uint64_t cap = 0) {
  return {.backend = "host", .device_memory_cap = cap, .seq_len = kSeq};
}

// Each step's loss and gradient norm, `steps` steps of `m` under `cfg` from a fresh engine (and, where the
// block inputs are on NVMe, a check that NVMe carried them).
std::vector<double> losses_and_norms(const Config& cfg, const model::ModelConfig& m,
                                     const std::string& tokens, const EngineOptions& o, int steps) {
  kernels::cpu::set_blas_threads(1);
  Engine engine(cfg, m, o);
  model::TokenFile file = model::TokenFile::open(tokens);
  model::DataLoader data(
      file,
      {.batch_size = engine.micro_batch(), .seq_len = o.seq_len, .seed = 3, .vocab_size = m.vocab_size});
  model::LlamaModel model(m, engine.model_options());
  std::vector<double> seen;
  for (int i = 0; i < steps; ++i) {
    const StepResult s = engine.train_batch(model, data);
    seen.push_back(s.loss), seen.push_back(s.grad_norm);
  }
  // The state is in pinned memory in the NVMe test: what NVMe carries is the block inputs, out and back.
  if (engine.plan().nvme_activations > 0 && engine.plan().nvme_state == 0) {
    EXPECT_GE(engine.nvme_stats().bytes_written, engine.plan().nvme_activations / std::uint64_t(m.n_layers));
    EXPECT_GE(engine.nvme_stats().bytes_read, engine.plan().nvme_activations / std::uint64_t(m.n_layers));
  }
  return seen;
}

// The long-context budget the plan keeps (docs/train.md, "Long-context fine-tuning"): a 125m-shaped model
// at 1 x 32768 tokens with its block inputs off the device needs at most 24 KB of device activations a
// token (the window included), and no more with twice the layers.
TEST(CheckpointOffload, At32768TokensA125mShapedModelPlansAtMost24KBATokenWhateverItsDepth) {
  std::unique_ptr<Device> dev = open_device({.backend = "host", .ordinal = 0, .memory_cap = 0});
  std::unique_ptr<Stream> s = dev->create_stream("plan");
  std::unique_ptr<kernels::Ops> ops = kernels::make_ops(*dev, *s, {.matmul = DType::bf16});
  constexpr int kT = 32768;
  auto per_token = [&](const model::ModelConfig& m) {
    PlanInput in;
    apply_activations(in, activation_sizes(m, 1, kT, *ops), {.checkpoint = true, .offload = true});
    return double(in.activations + in.checkpoint_window) / kT;
  };
  model::ModelConfig m = model::ModelConfig::preset("125m");
  m.max_seq_len = kT;
  model::ModelConfig deep = m;
  deep.n_layers = 2 * m.n_layers;
  const double twelve = per_token(m), twenty_four = per_token(deep);
  EXPECT_LE(twelve, 24000.0);
  EXPECT_LE(std::fabs(twenty_four - twelve) / twelve, 0.05) << twelve << " vs " << twenty_four;
}

TEST(CheckpointOffload, ThePlanKeepsAWindowOnTheDeviceAndTheRestPinned) {
  ScratchDir d("ckpt-offload-plan");
  const Engine on(offload_config(OffloadDevice::cpu, OffloadDevice::cpu, d.path(), true), kModel, opts());
  const Engine off(offload_config(OffloadDevice::cpu, OffloadDevice::cpu, d.path(), false), kModel, opts());
  const MemoryPlan& p = on.plan();
  ASSERT_TRUE(p.activation_offload);
  EXPECT_FALSE(off.plan().activation_offload);
  const std::uint64_t one =
      std::uint64_t(on.micro_batch()) * kSeq * std::uint64_t(kModel.d_model) * 2;  // bf16
  EXPECT_EQ(p.pinned_activations, std::uint64_t(kModel.n_layers) * one);
  EXPECT_GE(p.device_checkpoint_window, std::uint64_t(kCheckpointWindow) * one);
  // The device holds the model's activations without the L block inputs, plus the window.
  EXPECT_EQ(p.device_activations - p.device_checkpoint_window,
            off.plan().device_activations - std::uint64_t(kModel.n_layers) * one);
  EXPECT_EQ(p.device_activations_other_offload, off.plan().device_activations);
  EXPECT_EQ(off.plan().device_activations_other_offload, p.device_activations);
  EXPECT_GE(p.pinned_budget, off.plan().pinned_budget + p.pinned_activations);
}

TEST(CheckpointOffload, AutoOffloadsOnlyWhereTheDeviceWouldNotHoldThem) {
  ScratchDir d("ckpt-offload-auto");
  model::ModelConfig deep = block_model("deep", 16);
  const auto plan = [&](const nlohmann::json& mode, std::uint64_t cap) {
    return Engine(offload_config(OffloadDevice::cpu, OffloadDevice::cpu, d.path(), mode), deep, opts(cap))
        .plan();
  };
  const MemoryPlan on_device = plan(false, 0), offloaded = plan(true, 0);
  ASSERT_LT(offloaded.device_need(), on_device.device_need());
  EXPECT_FALSE(plan("auto", 0).activation_offload);
  const std::uint64_t between = (offloaded.device_need() + on_device.device_need()) / 2;
  const MemoryPlan chosen = plan("auto", between);
  EXPECT_TRUE(chosen.activation_offload);
  EXPECT_LE(chosen.device_need(), between);
  try {
    plan(false, between);
    FAIL() << "the plan with the block inputs on the device was accepted";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("activation_checkpointing.cpu_checkpointing"), std::string::npos)
        << e.what();
  }
}

struct Placement {
  OffloadDevice param, optim;
};
class CheckpointOffloadAt : public ::testing::TestWithParam<Placement> {};

// Losses and gradient norms, every step, with the block inputs off the device and on it.
TEST_P(CheckpointOffloadAt, TrainsTheSameLossesAndGradientNormsBitForBit) {
  ScratchDir d("ckpt-offload-bits");
  const std::string tokens = make_tokens(d);
  const auto run = [&](bool offload) {
    return losses_and_norms(offload_config(GetParam().param, GetParam().optim, d.path(), offload), kModel,
                            tokens, opts(), 3);
  };
  EXPECT_TRUE(Engine(offload_config(GetParam().param, GetParam().optim, d.path(), true), kModel, opts())
                  .plan()
                  .activation_offload);
  EXPECT_EQ(run(true), run(false));
}

INSTANTIATE_TEST_SUITE_P(Placements, CheckpointOffloadAt,
                         ::testing::Values(Placement{OffloadDevice::none, OffloadDevice::none},
                                           Placement{OffloadDevice::cpu, OffloadDevice::cpu},
                                           Placement{OffloadDevice::nvme, OffloadDevice::nvme}),
                         [](const auto& info) {
                           return std::string("param_") + offload_name(info.param.param) + "_optimizer_" +
                                  offload_name(info.param.optim);
                         });

// NVMe, the next tier: a host too small for the block inputs in pinned memory sends them on to the swap
// file, and the run trains the same bits.
TEST(CheckpointOffload, WherePinnedMemoryWouldNotHoldThemTheyGoToNvme) {
  ScratchDir d("ckpt-offload-nvme");
  const std::string tokens = make_tokens(d);
  constexpr int kLong = 256;
  model::ModelConfig deep = block_model("deep", 8);
  deep.max_seq_len = kLong;
  const Config cfg =
      offload_config(OffloadDevice::cpu, OffloadDevice::cpu, d.path(), true,
                     {{"zero_optimization", {{"offload_optimizer", {{"nvme_path", d.path()}}}}}});
  // The host memory at which the plan with them pinned does not fit (check_fits' 90%), by half of them —
  // rounded up, so that check_fits' allowance, host_memory / 10 * 9, is at least need less that half and
  // never up to 8 bytes below it, which the plan through NVMe (as much pinned memory as that) would exceed.
  const EngineOptions at_long = {.backend = "host", .seq_len = kLong};
  Engine probe(cfg, deep, at_long);
  const MemoryPlan& pinned = probe.plan();
  ASSERT_EQ(pinned.nvme_activations, 0u);
  const std::uint64_t need = pinned.pinned_state + pinned.pinned_staging + pinned.pinned_activations +
                             std::min<std::uint64_t>(probe.device().caps().capacity, pinned.device_need());
  EngineOptions small = at_long;
  small.testing.host_memory = (need - pinned.pinned_activations / 2 + 8) / 9 * 10;
  const Engine e(cfg, deep, small);
  EXPECT_EQ(e.plan().nvme_activations,
            std::uint64_t(deep.n_layers) * e.micro_batch() * kLong * deep.d_model * 2);
  EXPECT_LT(e.plan().pinned_activations, pinned.pinned_activations);
  EXPECT_EQ(losses_and_norms(cfg, deep, tokens, small, 2), losses_and_norms(cfg, deep, tokens, at_long, 2));
}

// memprof's trace: every block input but the last goes out once a forward and comes back once a backward,
// as tensors of kind "activation" in the pinned tier.
TEST(CheckpointOffload, MemprofShowsTheCheckpointsMovingOutAndBack) {
  ScratchDir d("ckpt-offload-memprof");
  const std::string tokens = make_tokens(d), trace = d.file("t.memprof.jsonl");
  const int steps = 2, micro = 2, rows = 2;  // make_config's gradient_accumulation_steps and micro-batch
  train(offload_config(OffloadDevice::cpu, OffloadDevice::cpu, d.path(), true,
                       {{"strata", {{"memprof", {{"path", trace}}}}}}),
        kModel, tokens, steps, kSeq, opts());
  const memprof::Trace tr = memprof::read_trace(trace);
  std::uint64_t out = 0, back = 0;
  for (const tiering::MemEvent& e : tr.events) {
    if (e.type != tiering::EventType::move_done || e.kind != tiering::Kind::activation) continue;
    if (e.tier == tiering::Tier::device && e.to == tiering::Tier::pinned) ++out;
    if (e.tier == tiering::Tier::pinned && e.to == tiering::Tier::device) ++back;
  }
  const std::uint64_t want = std::uint64_t(steps) * micro * std::uint64_t(kModel.n_layers - 1);
  EXPECT_EQ(out, want);
  EXPECT_EQ(back, want);
  const memprof::Summary s = memprof::summarize(tr);
  EXPECT_EQ(s.peak[int(tiering::Tier::pinned)][int(tiering::Kind::activation)],
            std::uint64_t(kModel.n_layers - 1) * rows * kSeq * std::uint64_t(kModel.d_model) * 2);
}

}  // namespace
}  // namespace strata::zero3::test
