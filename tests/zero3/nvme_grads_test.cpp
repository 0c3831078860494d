// Gradients through NVMe (Note [Gradients through NVMe] in zero3/engine_grads.cpp): with the optimizer on
// NVMe the fp32 gradient shards live there too. The same losses and norms bit for bit as with them in
// pinned host memory — every offload_param, gradients summed on the device or read back and added through
// NVMe, a step before its micro-batches were all made; pinned memory that does not grow with the model; a
// kill -9 during the writes loses no checkpoint.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "engine_util.h"
#include "tests/nvme/test_util.h"

namespace strata::zero3 {
namespace {

using test::make_tokens;
using test::ScratchDir;

constexpr int kSteps = 3;
constexpr int kSeqLen = 16;

Config config(OffloadDevice param, const std::string& dir, bool nvme_grads,
              const nlohmann::json& extra = nlohmann::json::object()) {
  nlohmann::json e = {{"strata", {{"nvme_gradients", nvme_grads}}}};
  e.merge_patch(extra);
  return test::make_config(param, OffloadDevice::nvme, dir, e);
}

// An engine over a model of `blocks` blocks at device cap `cap`, its data and its model.
struct Training {
  Training(const Config& cfg, const std::string& tokens, std::uint64_t cap, int blocks = 4,
           EngineOptions opts = {})
      : mcfg(test::block_model("nvme-grads-test", blocks)),
        engine(cfg, mcfg, with(opts, cap)),
        file(model::TokenFile::open(tokens)),
        data(file, {.batch_size = engine.micro_batch(), .seq_len = kSeqLen, .seed = 3, .vocab_size = 256}),
        m(mcfg, engine.model_options()) {
    kernels::cpu::set_blas_threads(1);
  }
  static EngineOptions with(EngineOptions o, std::uint64_t cap) {
    o.backend = "host";
    o.device_memory_cap = cap;
    o.seq_len = kSeqLen;
    return o;
  }
  model::ModelConfig mcfg;
  Engine engine;
  model::TokenFile file;
  model::DataLoader data;
  model::LlamaModel m;
};

struct Result {
  std::vector<double> losses, norms;
  TransferStats transfers;
  MemoryPlan plan;
  std::uint64_t pinned_peak = 0;
};

Result run(const Config& cfg, const std::string& tokens, std::uint64_t cap, int blocks = 4) {
  Training t(cfg, tokens, cap, blocks);
  Result r;
  for (int i = 0; i < kSteps; ++i) {
    const StepResult s = t.engine.train_batch(t.m, t.data);
    EXPECT_TRUE(s.applied);
    r.losses.push_back(s.loss);
    r.norms.push_back(s.grad_norm);
  }
  r.transfers = t.engine.transfer_stats();
  r.plan = t.engine.plan();
  r.pinned_peak = t.engine.tiers().pool_stats(tiering::Tier::pinned).used.peak;
  return r;
}

// The smallest device cap the plan accepts: no room for a chunk cache or a device accumulator.
std::uint64_t smallest_cap(const Config& cfg) {
  Engine e(cfg, test::block_model("nvme-grads-test", 4), {.backend = "host", .seq_len = kSeqLen});
  return e.plan().device_need();
}

class NvmeGradients : public ::testing::TestWithParam<std::tuple<OffloadDevice, bool>> {};

TEST_P(NvmeGradients, TrainBitIdenticallyToGradientsInPinnedMemory) {
  const auto [param, tight] = GetParam();
  ScratchDir d("nvme-grads");
  const std::string tokens = make_tokens(d);
  const Config on = config(param, d.path(), true), off = config(param, d.path(), false);
  const std::uint64_t cap = tight ? smallest_cap(on) : 0;
  const Result nvme = run(on, tokens, cap), pinned = run(off, tokens, cap);
  EXPECT_EQ(nvme.losses, pinned.losses);  // bit for bit
  EXPECT_EQ(nvme.norms, pinned.norms);
  EXPECT_LT(nvme.losses.back(), nvme.losses.front());
  // Summed on the device (room) or read back and added through NVMe (none): micro-batch 2, accumulation 2.
  EXPECT_EQ(nvme.plan.device_accumulators > 0, !tight);
  EXPECT_GT(nvme.transfers.grad_nvme_writes, 0u);
  EXPECT_EQ(nvme.transfers.grad_nvme_reads > 0, tight);
  EXPECT_EQ(pinned.transfers.grad_nvme_writes, 0u);
  // The gradient shards moved from pinned memory to NVMe in the plan, 4 bytes a parameter.
  const std::uint64_t grads = nvme.plan.nvme_state - pinned.plan.nvme_state;
  EXPECT_EQ(pinned.plan.pinned_state - nvme.plan.pinned_state, grads);
  EXPECT_GE(grads, 4 * test::block_model("nvme-grads-test", 4).num_parameters());
  EXPECT_LE(nvme.pinned_peak, nvme.plan.pinned_budget);
}

INSTANTIATE_TEST_SUITE_P(Placements, NvmeGradients,
                         ::testing::Combine(::testing::Values(OffloadDevice::none, OffloadDevice::cpu,
                                                              OffloadDevice::nvme),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string("param_") + test::name(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_no_device_room" : "_device_room");
                         });

// A step before the configured micro-batches were all made: no statistics were taken on the way out, so
// step() reads the gradients back once; the loss and norm are those of gradients in pinned memory.
TEST(NvmeGradients, AnEarlyStepReadsTheGradientsBackForTheNorm) {
  ScratchDir d("nvme-grads-early");
  const std::string tokens = make_tokens(d);
  const nlohmann::json four = {{"gradient_accumulation_steps", 4}};
  auto losses = [&](bool nvme_grads, bool tight) {
    const Config cfg = config(OffloadDevice::nvme, d.path(), nvme_grads, four);
    Training t(cfg, tokens, tight ? smallest_cap(cfg) : 0);
    std::vector<double> l;
    for (int step = 0; step < 2; ++step) {
      for (int i = 0; i < 3; ++i) t.engine.forward_backward(t.m, t.data.next());  // 3 of 4
      const StepResult r = t.engine.step();
      l.push_back(r.loss);
      l.push_back(r.grad_norm);
    }
    return l;
  };
  const std::vector<double> want = losses(false, true);
  EXPECT_EQ(losses(true, true), want);
  EXPECT_EQ(losses(true, false), want);
}

// Host memory bounded by buffers: with both offloads on NVMe (and no parameter cache in host memory), a
// model twice as deep plans the same pinned budget and peaks within it; gradients in pinned memory grow
// with it.
TEST(NvmeGradients, PinnedMemoryDoesNotGrowWithTheModel) {
  ScratchDir d("nvme-grads-bound");
  const std::string tokens = make_tokens(d);
  const nlohmann::json no_cache = {{"zero_optimization", {{"offload_param", {{"max_in_cpu", 0}}}}}};
  const Config on = config(OffloadDevice::nvme, d.path(), true, no_cache);
  const Config off = config(OffloadDevice::nvme, d.path(), false, no_cache);
  const Result small = run(on, tokens, 0, 4), big = run(on, tokens, 0, 8);
  EXPECT_EQ(small.plan.pinned_state, 0u);
  EXPECT_EQ(big.plan.pinned_state, 0u);
  EXPECT_EQ(big.plan.pinned_budget, small.plan.pinned_budget);
  EXPECT_LE(big.pinned_peak, small.plan.pinned_budget);
  const Result small_pinned = run(off, tokens, 0, 4), big_pinned = run(off, tokens, 0, 8);
  EXPECT_GT(big_pinned.plan.pinned_state, small_pinned.plan.pinned_state);
  EXPECT_GT(big_pinned.pinned_peak, big.pinned_peak);
}

// nvme_path as a list (one directory per drive): the swap files are striped over both directories, each
// holding its share, and training gives the losses and norms of one directory bit for bit.
TEST(NvmeGradients, StripedOverTwoDirectoriesTrainsBitIdentically) {
  ScratchDir d("nvme-grads-stripe"), a("nvme-grads-stripe-a"), b("nvme-grads-stripe-b");
  const std::string tokens = make_tokens(d);
  const nlohmann::json both = nlohmann::json::array({a.path(), b.path()});
  const nlohmann::json striped = {
      {"zero_optimization",
       {{"offload_param", {{"nvme_path", both}}}, {"offload_optimizer", {{"nvme_path", both}}}}}};
  const Result one = run(config(OffloadDevice::nvme, d.path(), true), tokens, 0);
  Training t(config(OffloadDevice::nvme, d.path(), true, striped), tokens, 0);
  std::vector<double> losses, norms;
  for (int i = 0; i < kSteps; ++i) {
    const StepResult s = t.engine.train_batch(t.m, t.data);
    losses.push_back(s.loss);
    norms.push_back(s.grad_norm);
  }
  EXPECT_EQ(losses, one.losses);
  EXPECT_EQ(norms, one.norms);
  // Each directory holds a swap file of the same size, which is about half of the state.
  std::vector<std::uintmax_t> sizes;
  for (const ScratchDir* dir : {&a, &b})
    for (const auto& f : std::filesystem::recursive_directory_iterator(dir->path()))
      if (f.is_regular_file() && f.path().extension() == ".bin") sizes.push_back(f.file_size());
  ASSERT_EQ(sizes.size(), 2u);
  EXPECT_EQ(sizes[0], sizes[1]);
  EXPECT_GE(2 * sizes[0], t.engine.plan().nvme_state);
}

// kill -9 while a step's gradients are being written to NVMe: the checkpoint saved before it loads, and
// training from it gives the losses of a run that was never interrupted.
TEST(NvmeGradients, AKillDuringGradientWritesLosesNoCheckpoint) {
  ScratchDir d("nvme-grads-kill");
  const std::string tokens = make_tokens(d);
  const Config cfg = config(OffloadDevice::nvme, d.path(), true);
  const std::string ckpt = d.file("ckpt");
  const nvme::test::ChildResult r = nvme::test::run_in_child([&] {
    int handoffs = 0;
    bool armed = false;
    EngineOptions o;
    o.testing.gradient_hook = [&](int, float*, std::size_t) {
      if (armed && ++handoffs == 3) ::raise(SIGKILL);  // earlier chunks' writes are in flight
    };
    Training t(cfg, tokens, 0, 4, o);
    for (int i = 0; i < 2; ++i) t.engine.train_batch(t.m, t.data);
    t.engine.save_checkpoint(ckpt, {}, &t.data);
    armed = true;
    t.engine.train_batch(t.m, t.data);
    return 1;  // not reached
  });
  ASSERT_EQ(r.code, -SIGKILL) << r.output;

  std::vector<double> resumed, straight;
  {
    Training t(cfg, tokens, 0);
    t.engine.load_checkpoint(ckpt, "", &t.data);
    for (int i = 0; i < 2; ++i) resumed.push_back(t.engine.train_batch(t.m, t.data).loss);
  }
  {
    Training t(cfg, tokens, 0);
    for (int i = 0; i < 4; ++i) {
      const double l = t.engine.train_batch(t.m, t.data).loss;
      if (i >= 2) straight.push_back(l);
    }
  }
  EXPECT_EQ(resumed, straight);
}

// A full disk while a step's gradients are written: the swap file may grow no further than the bytes of
// the state written at the start (RLIMIT_FSIZE in a forked child stands for the disk; the writes fail as
// they do on a file system that cannot preallocate, where a full disk shows). The step stops with an error
// naming the gradients, their bytes and the path, and the engine tears down cleanly.
TEST(NvmeGradients, AFullDiskDuringGradientWritesStopsNamingThePathAndTheBytes) {
  ScratchDir d("nvme-grads-enospc");
  const std::string tokens = make_tokens(d);
  const Config cfg = config(OffloadDevice::nvme, d.path(), true);
  const nvme::test::ChildResult r = nvme::test::run_in_child([&] {
    Training t(cfg, tokens, 0);
    const std::uint64_t limit = t.engine.tiers().pool_stats(tiering::Tier::nvme).reserved.current;
    std::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of death
    const rlimit rl{limit, limit};
    if (::setrlimit(RLIMIT_FSIZE, &rl) != 0) return nvme::test::kChildSkip;
    try {
      t.engine.train_batch(t.m, t.data);
    } catch (const Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 0;
    }
    std::fprintf(stderr, "the step went through a disk that was full\n");
    return 1;
  });
  if (r.code == nvme::test::kChildSkip) GTEST_SKIP() << "setrlimit(RLIMIT_FSIZE) refused: " << r.output;
  ASSERT_EQ(r.code, 0) << r.output;
  const std::size_t at = r.output.rfind("writing the fp32 gradients of chunk");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string error = r.output.substr(at);
  for (const char* must : {" bytes) to NVMe: ", "File too large", d.path().c_str()})
    EXPECT_NE(error.find(must), std::string::npos) << "names no '" << must << "': " << error;
}

}  // namespace
}  // namespace strata::zero3
