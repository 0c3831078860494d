// DeepSpeed keys Strata accepts without acting on them (Note [Keys without effect] in
// config/config_schema.cpp): read and checked, one warning with the reason when the file asks for
// something Strata does not do, none for defaults, "auto" or a value Strata does anyway; the resolved
// table (`strata config`) and docs/config.md mark them.
#include <algorithm>

#include "config_test_util.h"

namespace strata {
namespace {

using testing::contains;

const char* const kNoEffectKeys[] = {
    "reduce_bucket_size",    "allgather_bucket_size",
    "allgather_partitions",  "overlap_comm",
    "contiguous_gradients",  "reduce_scatter",
    "round_robin_gradients", "stage3_gather_16bit_weights_on_model_save",
};

nlohmann::json zero(int stage, const nlohmann::json& keys) {
  nlohmann::json z = keys;
  z["stage"] = stage;
  return {{"train_batch_size", 8}, {"zero_optimization", z}};
}

struct Asked {
  const char* name;
  int stage;
  const char* key;  // under zero_optimization
  nlohmann::json value;
  const char* shown;   // the value as the warning shows it
  const char* reason;  // a phrase of the reason: what Strata does instead
};

void PrintTo(const Asked& a, std::ostream* os) {
  *os << a.name;
}

// A value Strata does not honour: one warning naming the key, the value, "no effect" and what Strata does.
const Asked kIgnoredValues[] = {
    {"ReduceBucketSize", 2, "reduce_bucket_size", 2e8, "200000000", "in one collective"},
    {"AllgatherBucketSize", 2, "allgather_bucket_size", 2e8, "200000000", "in one collective"},
    {"AllgatherPartitionsFalse", 2, "allgather_partitions", false, "false", "never broadcast"},
    {"OverlapCommFalse", 2, "overlap_comm", false, "false", "on a gradient stream of their own"},
    {"ContiguousGradientsFalse", 3, "contiguous_gradients", false, "false", "one contiguous buffer"},
    {"ReduceScatterFalse", 2, "reduce_scatter", false, "false", "Strata reduce-scatters"},
    {"ReduceScatterFalseAtStage1", 1, "reduce_scatter", false, "false", "at every stage"},
    {"RoundRobinGradientsFalse", 2, "round_robin_gradients", false, "false", "only its own slice"},
    {"Gather16BitFalse", 3, "stage3_gather_16bit_weights_on_model_save", false, "false",
     "always gathers every rank's shard"},
};

class IgnoredValue : public ::testing::TestWithParam<Asked> {};

TEST_P(IgnoredValue, WarnsOnceNamingTheKeyAndWhatStrataDoes) {
  const Asked& a = GetParam();
  const Config c = Config::parse(zero(a.stage, {{a.key, a.value}}));
  ASSERT_EQ(c.warnings().size(), 1u) << (c.warnings().empty() ? "" : c.warnings()[0]);
  const std::string& w = c.warnings()[0];
  EXPECT_TRUE(contains(w, detail::cat("zero_optimization.", a.key, ": ", a.shown, " has no effect; "))) << w;
  EXPECT_TRUE(contains(w, a.reason)) << w;
  EXPECT_EQ(c.source(detail::cat("zero_optimization.", a.key)), "file");  // still read and checked
}

INSTANTIATE_TEST_SUITE_P(Config, IgnoredValue, ::testing::ValuesIn(kIgnoredValues),
                         [](const auto& info) { return std::string(info.param.name); });

// A value that asks for what Strata does anyway is silent, as stock configs write them.
const Asked kHonouredValues[] = {
    {"AllgatherPartitionsTrue", 2, "allgather_partitions", true, "", ""},
    {"OverlapCommTrueAtStage2", 2, "overlap_comm", true, "", ""},
    {"OverlapCommTrueAtStage3", 3, "overlap_comm", true, "", ""},
    {"ContiguousGradientsTrue", 3, "contiguous_gradients", true, "", ""},
    {"ReduceScatterTrueAtStage2", 2, "reduce_scatter", true, "", ""},
    {"ReduceScatterTrueAtStage3", 3, "reduce_scatter", true, "", ""},
    {"ReduceScatterTrueAtStage1", 1, "reduce_scatter", true, "", ""},
    {"RoundRobinGradientsTrue", 2, "round_robin_gradients", true, "", ""},
    {"Gather16BitTrue", 3, "stage3_gather_16bit_weights_on_model_save", true, "", ""},
    {"ReduceBucketSizeAuto", 3, "reduce_bucket_size", "auto", "", ""},
    {"AllgatherBucketSizeNull", 2, "allgather_bucket_size", nullptr, "", ""},
};

class HonouredValue : public ::testing::TestWithParam<Asked> {};

TEST_P(HonouredValue, IsSilent) {
  const Asked& a = GetParam();
  const Config c = Config::parse(zero(a.stage, {{a.key, a.value}}));
  EXPECT_TRUE(c.warnings().empty()) << c.warnings()[0];
}

INSTANTIATE_TEST_SUITE_P(Config, HonouredValue, ::testing::ValuesIn(kHonouredValues),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(NoEffectKeys, DefaultsGiveNoWarningAtAnyStage) {
  for (int stage = 0; stage <= 3; ++stage) {
    const Config c = Config::parse(zero(stage, nlohmann::json::object()));
    EXPECT_TRUE(c.warnings().empty()) << "stage " << stage << ": " << c.warnings()[0];
  }
}

TEST(NoEffectKeys, AllSetAtOnceWarnOncePerKey) {
  const Config c = Config::parse(zero(2, {{"reduce_bucket_size", 1e8},
                                          {"allgather_bucket_size", 1e8},
                                          {"allgather_partitions", false},
                                          {"overlap_comm", false},
                                          {"contiguous_gradients", false},
                                          {"reduce_scatter", false},
                                          {"round_robin_gradients", false},
                                          {"stage3_gather_16bit_weights_on_model_save", false}}));
  ASSERT_EQ(c.warnings().size(), std::size(kNoEffectKeys));
  for (const char* key : kNoEffectKeys) {
    int n = 0;
    for (const std::string& w : c.warnings()) n += contains(w, detail::cat("zero_optimization.", key, ": "));
    EXPECT_EQ(n, 1) << key;
  }
}

// Through a spelling, the warning names what the user wrote.
TEST(NoEffectKeys, WarningNamesTheAliasWritten) {
  const Config c = Config::parse(zero(3, {{"stage3_gather_fp16_weights_on_model_save", false}}));
  ASSERT_EQ(c.warnings().size(), 2u);  // deprecated, and no effect
  EXPECT_TRUE(
      testing::any_contains(c.warnings(),
                            "zero_optimization.stage3_gather_fp16_weights_on_model_save: false has no "
                            "effect"));
  const Config d = Config::parse(zero(3, {{"gather_16bit_weights_on_model_save", true}}));
  EXPECT_TRUE(d.warnings().empty()) << d.warnings()[0];
}

// The table `strata config` prints: each such key marked, and the reasons for the ones the file set.
TEST(NoEffectKeys, ResolvedTableMarksThemAndGivesTheReasonsForTheOnesSet) {
  const Config c = Config::parse(zero(2, {{"overlap_comm", true}, {"reduce_bucket_size", 2e8}}));
  const std::string t = c.resolved_table();
  for (const char* key : kNoEffectKeys) {
    const std::string path = detail::cat("zero_optimization.", key);
    const auto at = t.find("\n" + path + " ");
    ASSERT_NE(at, std::string::npos) << path << " missing from\n" << t;
    const std::string row = t.substr(at + 1, t.find('\n', at + 1) - at - 1);
    EXPECT_TRUE(contains(row, "(no effect)")) << row;
  }
  const auto footer = t.find("accepted without effect");
  ASSERT_NE(footer, std::string::npos) << t;
  const std::string reasons = t.substr(footer);
  EXPECT_TRUE(contains(reasons, "  zero_optimization.overlap_comm: at every stage")) << reasons;
  EXPECT_TRUE(contains(reasons, "  zero_optimization.reduce_bucket_size: Strata reduces")) << reasons;
  EXPECT_FALSE(contains(reasons, "allgather_bucket_size")) << "not set in the file:\n" << reasons;
  // Other keys are not marked.
  const auto stage = t.find("\nzero_optimization.stage ");
  ASSERT_NE(stage, std::string::npos);
  EXPECT_FALSE(contains(t.substr(stage + 1, t.find('\n', stage + 1) - stage - 1), "no effect"));
  // Nothing set: the keys are marked, and no reasons are listed.
  EXPECT_FALSE(
      contains(Config::parse(zero(3, nlohmann::json::object())).resolved_table(), "accepted without"));
}

TEST(NoEffectKeys, ReferenceSaysAcceptedWithoutEffect) {
  const std::string md = config_reference_markdown();
  for (const char* key : kNoEffectKeys) {
    const std::string row = detail::cat("| `zero_optimization.", key, "` |");
    const auto at = md.find(row);
    ASSERT_NE(at, std::string::npos) << row;
    EXPECT_TRUE(contains(md.substr(at, md.find('\n', at) - at), "Accepted; no effect: ")) << key;
  }
}

// The reference and this list agree: every zero_optimization key without effect is tested here.
TEST(NoEffectKeys, ReferenceListsExactlyThese) {
  const std::string md = config_reference_markdown();
  std::vector<std::string> documented;
  for (std::size_t at = md.find("\n| `zero_optimization."); at != std::string::npos;
       at = md.find("\n| `zero_optimization.", at + 1)) {
    const std::string row = md.substr(at + 1, md.find('\n', at + 1) - at - 1);
    if (contains(row, "Accepted; no effect")) documented.push_back(row.substr(3, row.find('`', 3) - 3));
  }
  std::vector<std::string> expected;
  for (const char* key : kNoEffectKeys) expected.push_back(detail::cat("zero_optimization.", key));
  std::sort(documented.begin(), documented.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(documented, expected);
}

}  // namespace
}  // namespace strata
