// The versioned JSON: snapshots and trace files read back to what was written; other schemas and newer
// versions are refused with a message that says so.
#include <gtest/gtest.h>

#include <fstream>

#include "tests/tiering/tiering_fixture.h"
#include "tiering/trace_writer.h"
#include "tools/memprof/memprof.h"

namespace strata::tiering {
namespace {

using memprof::read_trace;
using memprof::replay;
using memprof::summarize;
using memprof::TimelinePoint;
using memprof::Trace;
using test::random_bytes;
using test::TieringTest;

class Schema : public TieringTest {
 protected:
  // A little of everything: all kinds, moves in every direction, an eviction, a pinned tensor.
  void scripted_state() {
    ShardTensors s = tm->register_shard(
        {.prefix = "layers.0",
         .chunk = 0,
         .shard = 0,
         .numel = 100'000,
         .homes = {
             .param = Tier::nvme, .grad = Tier::pinned, .master = Tier::pinned, .optim = Tier::pinned}});
    for (TensorId id : {s.param, s.grad, s.master, s.exp_avg, s.exp_avg_sq})
      write(id, Tier::pinned, random_bytes(tm->info(id).desc.bytes, id));
    tm->set_step(3, Phase::forward);
    tm->evict(s.param, Tier::pinned, Tier::nvme).wait();
    tm->fetch(s.param, Tier::device).wait();
    tm->evict(s.master, Tier::pinned, Tier::device).wait();
    tm->evict(s.master, Tier::device, Tier::nvme).wait();
    tm->pin(s.grad);
    tm->set_step(3, Phase::optimizer);
  }
};

TEST_P(Schema, SnapshotJsonRoundTripsToAnEqualSnapshot) {
  make();
  scripted_state();
  Snapshot s = tm->snapshot();
  nlohmann::json j = s.to_json();
  EXPECT_EQ(j["schema"], "strata.memprof");
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["type"], "snapshot");
  Snapshot back = Snapshot::from_json(nlohmann::json::parse(j.dump(1)));
  EXPECT_EQ(back, s);
  EXPECT_EQ(back.tensors.size(), 5u);
  EXPECT_EQ(back.step, 3);
  EXPECT_EQ(back.phase, Phase::optimizer);
  EXPECT_TRUE(back.tiers[int(Tier::device)].has_allocator);
  EXPECT_FALSE(back.tiers[int(Tier::nvme)].has_allocator);
}

TEST_P(Schema, AnotherSchemaANewerVersionOrAWrongFieldAreRefusedByName) {
  make();
  nlohmann::json j = tm->snapshot().to_json();
  auto refused = [](nlohmann::json doc, const std::string& want) {
    try {
      Snapshot::from_json(doc);
      ADD_FAILURE() << "accepted a snapshot that should fail with \"" << want << "\"";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  nlohmann::json other = j;
  other["schema"] = "torch.memory";
  refused(other, "torch.memory");
  nlohmann::json newer = j;
  newer["version"] = 2;
  refused(newer, "version 2");
  nlohmann::json wrong = j;
  wrong["tiers"]["pinned"]["capacity"] = "lots";
  refused(wrong, "capacity");
}

TEST_P(Schema, TraceFileHoldsTheHeaderEveryEventAndTheFinalSnapshot) {
  make();
  std::string path = dir.file("trace.jsonl");
  TraceStats stats;
  {
    TraceWriter w(*tm, {.path = path, .sample_interval_ms = 1, .config = {{"train_batch_size", 8}}});
    scripted_state();
    tm->synchronize();
    w.close();
    stats = w.stats();
  }
  Trace tr = read_trace(path);
  EXPECT_EQ(tr.header["config"]["train_batch_size"], 8);
  EXPECT_EQ(tr.backend, GetParam());
  for (int t = 0; t < kTierCount; ++t) {
    EXPECT_TRUE(tr.present[t]);
    EXPECT_EQ(tr.capacity[t], tm->pool_stats(Tier(t)).capacity) << to_string(Tier(t));
  }
  std::vector<MemEvent> ring = tm->events_since(0);
  EXPECT_EQ(tr.events, ring) << "the trace holds exactly the ring's events";
  EXPECT_EQ(stats.events, ring.size());
  EXPECT_EQ(tr.dropped, 0u);
  ASSERT_EQ(tr.tensors.size(), 5u);
  EXPECT_EQ(tr.tensors[0].name, "layers.0.param");
  EXPECT_EQ(tr.tensors[4].kind, Kind::exp_avg_sq);
  ASSERT_TRUE(tr.final_snapshot.has_value());
  Snapshot now = tm->snapshot(false);
  EXPECT_EQ(tr.final_snapshot->tiers, now.tiers);
  EXPECT_EQ(tr.final_snapshot->moves, now.moves);
  EXPECT_EQ(tr.final_snapshot->tensors, now.tensors);
  EXPECT_GE(tr.samples.size(), 2u);
  // The last sample and the replay both end at the manager's current figures.
  std::vector<TimelinePoint> tl = replay(tr);
  for (int t = 0; t < kTierCount; ++t)
    for (int k = 0; k < kKindCount; ++k) {
      EXPECT_EQ(tl.back().bytes[t][k], now.tiers[t].by_kind[k].current)
          << to_string(Tier(t)) << "/" << to_string(Kind(k));
      EXPECT_EQ(tr.samples.back().bytes[t][k], now.tiers[t].by_kind[k].current);
    }
}

TEST_P(Schema, ARingThatOverflowsBetweenDrainsIsReportedAsAGap) {
  make({.ring = 16});
  std::string path = dir.file("trace.jsonl");
  TraceWriter w(*tm, {.path = path, .sample_interval_ms = 1000});
  scripted_state();  // far more than 16 events before the writer's first drain
  w.close();
  Trace tr = read_trace(path);
  EXPECT_GT(tr.dropped, 0u);
  EXPECT_FALSE(summarize(tr).exact);
}

TEST_P(Schema, ReadingSomethingElseOrACutShortTraceSaysWhat) {
  make();
  std::string bad = dir.file("bad.jsonl");
  std::ofstream(bad) << "{\"schema\":\"other\"}\n";
  try {
    read_trace(bad);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("not a memprof trace"), std::string::npos) << e.what();
  }
  std::string path = dir.file("cut.jsonl");
  {
    TraceWriter w(*tm, {.path = path});
    scripted_state();
  }
  std::ofstream(path, std::ios::app) << "{\"type\":\"event\",\"seq\":99";  // killed mid-line
  Trace tr = read_trace(path);
  EXPECT_FALSE(tr.events.empty());
}

STRATA_TIERING_BACKENDS(Schema);

// Traces and snapshots already written spell dtypes this way; they must keep reading back.
TEST(SchemaDtype, WrittenSpellingsAreTheOnesOldFilesHold) {
  const std::pair<const char*, DType> spellings[] = {
      {"bf16", DType::bf16}, {"fp16", DType::fp16}, {"fp32", DType::fp32}, {"u8", DType::u8}};
  for (const auto& [name, t] : spellings) {
    EXPECT_STREQ(dtype_name(t), name);
    EXPECT_EQ(parse_dtype(name), t) << name;
  }
  EXPECT_THROW(parse_dtype("BF16", "tensor.dtype"), ConfigError);
}

}  // namespace
}  // namespace strata::tiering
