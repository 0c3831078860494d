// memprof: the summary of a scripted sequence reports exactly the sizes the script moved; the estimate
// reproduces DeepSpeed's ZeRO-3 formulas and DESIGN.md §2's bytes per parameter.
#include <gtest/gtest.h>

#include <algorithm>

#include <fstream>

#include "model/model.h"
#include "tests/common/scratch_dir.h"
#include "tests/tiering/tiering_fixture.h"
#include "tiering/trace_writer.h"
#include "tools/memprof/html.h"
#include "tools/memprof/memprof.h"
#include "zero3/engine.h"

namespace strata::memprof {
namespace {

using tiering::test::random_bytes;
using tiering::test::TieringTest;

constexpr std::uint64_t MiB = 1 << 20;

class Memprof : public TieringTest {};

// The script (sizes chosen so that every figure is known):
//   param 1 MiB: written pinned, evicted to NVMe, fetched to the device (through 1 MiB of staging)
//   grad 4 MiB: written on the device, evicted to pinned
//   master, exp_avg, exp_avg_sq 2 MiB each: written pinned (all three at once), evicted to NVMe
//   huge 64 MiB on an 8 MiB device: drops the param from the device, then OutOfMemory
TEST_P(Memprof, SummaryOfAScriptedSequenceReportsTheKnownSizes) {
  make({.device_budget = 8 << 20,
        .pinned_budget = 32 << 20,
        .pinned_slab = 4 << 20,
        .nvme_capacity = 64 << 20});
  std::string path = dir.file("run.memprof.jsonl");
  {
    TraceWriter w(*tm, {.path = path, .sample_interval_ms = 1});
    tm->set_step(0, Phase::forward);
    TensorId p = tm->register_tensor({.name = "layers.0.param",
                                      .kind = Kind::param,
                                      .dtype = DType::bf16,
                                      .bytes = 1 * MiB,
                                      .home = Tier::nvme});
    write(p, Tier::pinned, random_bytes(1 * MiB, 1));
    tm->evict(p, Tier::pinned, Tier::nvme).wait();
    tm->fetch(p, Tier::device).wait();
    tm->set_step(0, Phase::backward);
    TensorId g = tm->register_tensor(
        {.name = "layers.0.grad", .kind = Kind::grad, .bytes = 4 * MiB, .home = Tier::pinned});
    write(g, Tier::device, random_bytes(4 * MiB, 2));
    tm->evict(g, Tier::device, Tier::pinned).wait();
    tm->set_step(0, Phase::optimizer);
    std::vector<TensorId> states;
    for (Kind k : {Kind::master, Kind::exp_avg, Kind::exp_avg_sq}) {
      states.push_back(tm->register_tensor({.name = std::string("layers.0.") + to_string(k),
                                            .kind = k,
                                            .bytes = 2 * MiB,
                                            .home = Tier::nvme}));
      write(states.back(), Tier::pinned, random_bytes(2 * MiB, 3 + states.size()));
    }
    for (TensorId s : states) tm->evict(s, Tier::pinned, Tier::nvme).wait();
    tm->set_step(1, Phase::forward);
    TensorId huge = tm->register_tensor({.name = "huge", .kind = Kind::param, .bytes = 64 * MiB});
    EXPECT_THROW(tm->allocate(huge, Tier::device), OutOfMemory);
    tm->synchronize();
  }
  Summary s = summarize(read_trace(path));
  EXPECT_TRUE(s.exact);
  const std::uint64_t want[kTierCount][kKindCount] = {
      // param    grad     master   exp_avg  exp_avg_sq staging
      {1 * MiB, 4 * MiB, 0, 0, 0, 0},                          // device
      {1 * MiB, 4 * MiB, 2 * MiB, 2 * MiB, 2 * MiB, 1 * MiB},  // pinned
      {1 * MiB, 0, 2 * MiB, 2 * MiB, 2 * MiB, 0},              // nvme
  };
  for (int t = 0; t < kTierCount; ++t)
    for (int k = 0; k < kKindCount; ++k)
      EXPECT_EQ(s.peak[t][k], want[t][k]) << to_string(Tier(t)) << " / " << to_string(Kind(k));
  EXPECT_EQ(s.peak_total[int(Tier::device)], 5 * MiB);
  EXPECT_EQ(s.peak_total[int(Tier::pinned)], 10 * MiB) << "grad + the three states at once";
  EXPECT_EQ(s.peak_total[int(Tier::nvme)], 7 * MiB);
  EXPECT_EQ(s.moves[direction(Tier::pinned, Tier::nvme)].count, 4u);
  EXPECT_EQ(s.moves[direction(Tier::pinned, Tier::nvme)].bytes, 7 * MiB);
  EXPECT_EQ(s.moves[direction(Tier::nvme, Tier::device)].bytes, 1 * MiB);
  EXPECT_EQ(s.moves[direction(Tier::device, Tier::pinned)].bytes, 4 * MiB);
  for (int d : {direction(Tier::pinned, Tier::device), direction(Tier::nvme, Tier::pinned),
                direction(Tier::device, Tier::nvme)})
    EXPECT_EQ(s.moves[d].count, 0u) << direction_name(d);
  EXPECT_EQ(s.evictions, 1u);
  EXPECT_EQ(s.evicted_bytes, 1 * MiB);
  EXPECT_EQ(s.ooms, 1u);
  ASSERT_EQ(s.oom_events.size(), 1u);
  EXPECT_EQ(s.oom_events[0].bytes, 64 * MiB);
  EXPECT_EQ(s.oom_events[0].step, 1);
  EXPECT_EQ(s.first_step, 0);
  EXPECT_EQ(s.last_step, 1);
  ASSERT_GE(s.largest.size(), 2u);
  EXPECT_EQ(s.largest[0].name, "huge");
  EXPECT_EQ(s.largest[1].name, "layers.0.grad");
  std::string text = format_summary(s);
  EXPECT_NE(text.find("10.00 MiB"), std::string::npos) << text;
  EXPECT_NE(text.find("pinned_to_nvme"), std::string::npos) << text;
  EXPECT_EQ(summary_json(s)["tiers"]["pinned"]["peak"]["staging"], 1 * MiB);
}

TEST_P(Memprof, ReplayedPeaksEqualTheManagersOwnCounters) {
  make({.device_budget = 4 << 20,
        .pinned_budget = 6 << 20,
        .pinned_slab = 2 << 20,
        .nvme_capacity = 64 << 20});
  std::string path = dir.file("run.memprof.jsonl");
  {
    TraceWriter w(*tm, {.path = path, .sample_interval_ms = 2});
    std::mt19937_64 rng(77);
    std::vector<TensorId> ids;
    for (int i = 0; i < 10; ++i) {
      ids.push_back(
          add(tiering::test::label("t", i), 100'000 + rng() % 900'000, Tier(rng() % 3), Kind(rng() % 5)));
      write(ids.back(), Tier::pinned, random_bytes(tm->info(ids.back()).desc.bytes, i));
    }
    for (int op = 0; op < 150; ++op) {
      TensorId id = ids[rng() % ids.size()];
      Tier to = Tier(rng() % 3);
      Tier from = Tier((int(to) + 1 + rng() % 2) % 3);
      (rng() % 2 ? tm->fetch(id, to) : tm->evict(id, from, to)).wait();
    }
    tm->synchronize();
  }
  Trace tr = read_trace(path);
  Summary s = summarize(tr);
  ASSERT_TRUE(tr.final_snapshot);
  for (int t = 0; t < kTierCount; ++t) {
    for (int k = 0; k < kKindCount; ++k)
      EXPECT_EQ(s.peak[t][k], tr.final_snapshot->tiers[t].by_kind[k].peak) << to_string(Tier(t)) << "/" << k;
    EXPECT_EQ(s.peak_total[t], tr.final_snapshot->tiers[t].total.peak) << to_string(Tier(t));
  }
  EXPECT_EQ(s.moves, tr.final_snapshot->moves);
  EXPECT_EQ(s.evictions, tr.final_snapshot->evictions);
}

STRATA_TIERING_BACKENDS(Memprof);

// Lines whose "type" is not a string, that are no JSON object, or that hold a fraction where a whole number
// belongs are ConfigErrors naming the line (found by fuzz/memprof_trace_fuzz: the error message itself read
// "type" the way that had just failed, and the JSON library's type_error escaped; 8.9e54 as an integer;
// a tensor's shard of 3.3e113).
TEST(MemprofTrace, ALineWhoseTypeIsNotAStringIsAnErrorNamingTheLine) {
  strata::test::ScratchDir dir("memprof");
  const std::string header =
      R"({"schema":"strata.memprof","version":1,"type":"header","start_t":0,"sample_interval_ms":1,)"
      R"("kinds":["param","grad","master","exp_avg","exp_avg_sq","staging"],"backend":"host","device":"host",)"
      R"("config":{},"tiers":[{"tier":"device","present":true,"capacity":1},{"tier":"pinned","present":true,)"
      R"("capacity":1},{"tier":"nvme","present":false,"capacity":0}]})";
  for (const char* line :
       {R"({"type":5})", "7",
        // A fraction where a whole number belongs would convert with undefined
        // behaviour (UBSan under fuzz/memprof_trace_fuzz); it is refused instead.
        R"({"type":"gap","dropped":8.9e54})",
        R"({"type":"event","seq":1,"t":1e30,"ev":"alloc","tier":"device","to":"device",)"
        R"("kind":"param","phase":"forward","tensor":1,"bytes":4,"step":0})",
        // A tensor's shard beyond int (3.3e113 as an int: UBSan), or a whole number
        // beyond int32 (narrowed to another shard): out of range.
        R"({"type":"tensor","bytes":4096,"chunk":-1,"dtype":"bf16","home":"pinned","id":1,)"
        R"("kind":"param","name":"p","shard":3.33e113})",
        R"({"type":"tensor","bytes":4096,"chunk":-1,"dtype":"bf16","home":"pinned","id":1,)"
        R"("kind":"param","name":"p","shard":4294967297})"}) {
    const std::string path = dir.file("t.memprof.jsonl");
    std::ofstream(path) << header << "\n" << line << "\n{\"type\":\"end\"}\n";
    try {
      (void)read_trace(path);
      ADD_FAILURE() << line << " was read";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(path + ":2: "), std::string::npos) << e.what();
    }
  }
}

// A sample whose time is far before the trace's start (int64's minimum) renders: the times are taken from
// the start in double, not as an int64 difference that overflows (found by fuzz/memprof_trace_fuzz:
// UBSan's signed-integer-overflow in render_html).
TEST(MemprofTrace, TimesAnywhereInInt64Render) {
  strata::test::ScratchDir dir("memprof");
  const std::string path = dir.file("t.memprof.jsonl");
  std::ofstream(path)
      << R"({"schema":"strata.memprof","version":1,"type":"header","start_t":9843505,"sample_interval_ms":1,)"
      << R"("kinds":["param","grad","master","exp_avg","exp_avg_sq","staging"],"backend":"host","device":"host",)"
      << R"("config":{},"tiers":[{"tier":"device","present":true,"capacity":1048576},{"tier":"pinned",)"
      << R"("present":true,"capacity":1048576},{"tier":"nvme","present":false,"capacity":0}]})"
      << "\n"
      << R"({"type":"sample","t":-9223372036854775808,"step":0,"phase":"idle","bytes":{"device":[1,2,3,4,5,6],)"
      << R"("pinned":[0,0,0,0,0,0],"nvme":[0,0,0,0,0,0]},"reserved":[0,0,0]})"
      << "\n";
  const Trace tr = read_trace(path);
  EXPECT_NE(render_html(tr, {.max_points = 64, .title = "t"}).find("<html"), std::string::npos);
}

TEST(MemprofEstimate, DeepSpeedColumnsFollowItsZero3Formulas) {
  EstimateInput in{.params = 1'000'000'000, .largest_layer = 100'000'000};
  std::vector<EstimateRow> rows = estimate(in);
  auto row = [&](Tier param, Tier optim) {
    for (const EstimateRow& r : rows)
      if (r.param_home == param && r.optim_home == optim) return r;
    ADD_FAILURE() << "no row for " << to_string(param) << "/" << to_string(optim);
    return EstimateRow{};
  };
  EstimateRow none = row(Tier::device, Tier::device), opt = row(Tier::device, Tier::pinned),
              both = row(Tier::pinned, Tier::pinned);
  EXPECT_EQ(none.ds_gpu, 18'400'000'000u);  // 4 M + 18 P
  EXPECT_EQ(none.ds_cpu_zero_init, 600'000'000u);
  EXPECT_EQ(none.ds_cpu, 6'000'000'000u);
  EXPECT_EQ(opt.ds_gpu, 2'400'000'000u);  // 4 M + 2 P
  EXPECT_EQ(opt.ds_cpu_zero_init, 24'000'000'000u);
  EXPECT_EQ(both.ds_gpu, 400'000'000u);  // 4 M
  EXPECT_EQ(both.ds_cpu_zero_init, 27'000'000'000u);
}

// Ours is the engine's plan (docs/train.md): ten chunks of 1e8 elements, bf16 params, AdamW.
TEST(MemprofEstimate, OursIsTheEnginesPlan) {
  EstimateInput in{.params = 1'000'000'000, .largest_layer = 100'000'000};
  std::vector<EstimateRow> rows = estimate(in);
  // No offload: 18 B/param on the device, and the working set of a chunk gathered in bf16 with its fp32
  // gradient buffer (6 B x M).
  EXPECT_EQ(rows[0].device, 18'000'000'000u + 600'000'000u);
  // Both offloaded to cpu: the working set on the device; 18 B/param pinned, and the gradient staging
  // of one shard (4 B x M).
  EXPECT_EQ(rows[2].device, 600'000'000u);
  EXPECT_EQ(rows[2].host, 18'000'000'000u + 400'000'000u);
  // Both on NVMe: params, optimizer state and fp32 gradients there (18 B/param); pinned: buffers only
  // (Note [Host memory bounded by buffers]) — the parameter read buffers (5 of 1e8 bf16 elements), no
  // max_in_cpu cache, and one room for what backward and the step use in turn: the larger of the
  // gradient window (two shards on their way to NVMe and their staging, 3 x 4 B x M) and the optimizer's
  // (one sub-group of the whole shard, buffer_count 4 / 4 tensors: master, two states and the gradients,
  // 16 B x 1e9, with the new working params on their way home, 2 B x 1e9).
  EXPECT_EQ(rows[6].nvme, 18'000'000'000u);
  EXPECT_EQ(rows[6].host,
            1'000'000'000ull + std::max(1'200'000'000ull, 16'000'000'000ull + 2'000'000'000ull));
  // On the host backend chunks are gathered in its compute dtype: bf16 with bf16 training (6 B x M of
  // working set), fp32 without (8 B x M).
  in.backend = "host";
  EXPECT_EQ(estimate(in)[2].device, 600'000'000u);
  in.config = Config::parse(nlohmann::json{{"train_micro_batch_size_per_gpu", 1},
                                           {"optimizer", {{"type", "AdamW"}}},
                                           {"zero_optimization", {{"stage", 3}}}});
  EXPECT_EQ(estimate(in)[2].device, 800'000'000u);
}

TEST(MemprofEstimate, ManyGpusAndNodesScaleAsDeepSpeedDoes) {
  EstimateInput in{.params = 1'000'000'000, .largest_layer = 100'000'000, .world = 4, .nodes = 2};
  std::vector<EstimateRow> rows = estimate(in);
  EXPECT_EQ(rows[0].ds_gpu, 400'000'000u + 4'500'000'000u);  // no offload: 4 M + 18 P / 4
  EXPECT_EQ(rows[0].ds_cpu, 12'000'000'000u);                // 4 x 2 GPUs per node x P x 1.5
  EXPECT_EQ(rows[2].ds_cpu_zero_init, 13'500'000'000u);      // 18 P / 2 nodes x 1.5
  // Over 4 ranks each chunk is padded to whole gradient-norm blocks of every rank's shard (4 x 8192).
  constexpr std::uint64_t Mp = 100'007'936;
  EXPECT_EQ(rows[0].device, 18 * 10 * Mp / 4 + 6 * Mp);  // 18 B/param of the shard + 6 B x M
  EXPECT_EQ(rows[2].host, 2 * (18 * 10 * Mp / 4 + 4 * Mp / 4))
      << "host is per node: 2 ranks of 18 B/param of the shard and a shard of gradient staging";
  EXPECT_THROW(estimate({.params = 10, .largest_layer = 20}), ConfigError);
  EXPECT_THROW(estimate({.params = 10, .largest_layer = 5, .world = 3, .nodes = 2}), ConfigError);
  EXPECT_THROW(estimate({.params = 10, .largest_layer = 5, .backend = "tpu"}), ConfigError);
}

// The estimate for a model and config is what a run of them peaks at: the tier manager's device pool at
// the smallest cap (state + working set; the activations and the compute interface's own bytes, its
// matrix-product workspace, beside it), its NVMe pool at the NVMe state, and its pinned pool within the host
// figure (which also counts the engine's own gradient staging).
class EstimateAgainstARun : public ::testing::TestWithParam<std::pair<OffloadDevice, OffloadDevice>> {};

TEST_P(EstimateAgainstARun, DevicePeakAndNvmeEqualTheEstimate) {
  const auto [param, optim] = GetParam();
  strata::test::ScratchDir d("estimate-run");
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", 1},
      {"gradient_accumulation_steps", 1},
      {"bf16", {{"enabled", true}}},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
      {"zero_optimization",
       {{"stage", 3},
        {"sub_group_size", 20000},
        {"offload_param", {{"device", zero3::offload_name(param)}, {"nvme_path", d.path()}}},
        {"offload_optimizer", {{"device", zero3::offload_name(optim)}, {"nvme_path", d.path()}}}}},
      {"strata", {{"backend", "host"}, {"seed", 3}, {"cpu_optim", {{"pin_threads", false}}}}}};
  const Config cfg = Config::parse(nlohmann::json::parse(j.dump()));
  const model::ModelConfig mcfg = model::ModelConfig::preset("tiny");
  EstimateInput in{.backend = "host", .model = mcfg, .config = cfg};
  EstimateRow row;
  for (const EstimateRow& r : estimate(in))
    if (r.param_home == zero3::home_of(param) && r.optim_home == zero3::home_of(optim)) row = r;
  constexpr int kSeq = 16;
  const zero3::MemoryPlan free =
      zero3::Engine(cfg, mcfg, {.backend = "", .device_memory_cap = 0, .seq_len = kSeq}).plan();
  zero3::Engine engine(cfg, mcfg,
                       {.backend = "",
                        .device_memory_cap = row.device + free.device_activations + free.device_ops,
                        .seq_len = kSeq});
  std::vector<std::uint32_t> toks(4000);
  for (std::size_t i = 0; i < toks.size(); ++i) toks[i] = std::uint32_t(i * 31 % 251);
  const std::string tokens = d.path() + "/tokens.bin";
  model::write_token_file(tokens, toks, model::TokenType::u16);
  model::TokenFile file = model::TokenFile::open(tokens);
  model::DataLoader data(file, {.batch_size = 1, .seq_len = kSeq, .seed = 1, .vocab_size = mcfg.vocab_size});
  model::LlamaModel m(mcfg, engine.model_options());
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(engine.train_batch(m, data).applied);
  const tiering::TierManager& tm = engine.tiers();
  EXPECT_EQ(tm.pool_stats(Tier::device).reserved.peak, row.device);
  EXPECT_EQ(tm.pool_stats(Tier::nvme).used.peak, row.nvme);
  EXPECT_LE(tm.pool_stats(Tier::pinned).used.peak, row.host);
  EXPECT_GE(tm.pool_stats(Tier::pinned).used.peak, engine.plan().pinned_state);
}

INSTANTIATE_TEST_SUITE_P(Placements, EstimateAgainstARun,
                         ::testing::Values(std::pair{OffloadDevice::cpu, OffloadDevice::cpu},
                                           std::pair{OffloadDevice::none, OffloadDevice::cpu},
                                           std::pair{OffloadDevice::none, OffloadDevice::none},
                                           std::pair{OffloadDevice::nvme, OffloadDevice::nvme}),
                         [](const auto& info) {
                           return std::string("param_") + zero3::offload_name(info.param.first) + "_optim_" +
                                  zero3::offload_name(info.param.second);
                         });

// With a described machine each setting is planned whole on it, as "auto" plans a placement: a setting whose
// state does not fit its device says so, one that fits has its step predicted and its bottleneck named.
TEST(MemprofEstimate, WithAMachineEachSettingIsPlannedAndPredictedOnIt) {
  zero3::MachineRates m;
  m.name = "test machine";
  m.device_memory = std::uint64_t(128) << 20;
  m.host_memory = std::uint64_t(64) << 30;
  m.compute_flops = m.backward_flops = m.attention_flops = 1e14;
  m.memory_bandwidth = 1e12;
  m.link_h2d = m.link_d2h = 2e10;
  m.cpu_optimizer = m.grad_norm = 1e9;
  m.device_optimizer = 1e10;
  m.nvme_read = m.nvme_write = 3e9;
  EstimateInput in{.model = model::ModelConfig::preset("10m"), .machine = m, .seq_len = 64};
  const std::vector<EstimateRow> rows = estimate(in);
  ASSERT_TRUE(rows[0].planned && rows[2].planned);
  EXPECT_FALSE(rows[0].planned->fits);  // none / none: 18 B a parameter of 10m on 128 MiB
  EXPECT_NE(rows[0].planned->why_not.find("device needs"), std::string::npos) << rows[0].planned->why_not;
  EXPECT_TRUE(rows[2].planned->fits) << rows[2].planned->why_not;  // cpu / cpu
  EXPECT_GT(rows[2].planned->predicted.step, 0.0);
  EXPECT_FALSE(rows[2].planned->predicted.bottleneck.empty());
}

}  // namespace
}  // namespace strata::memprof
