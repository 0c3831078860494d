// zero_optimization.offload_optimizer.ratio: a partial offload (a number below 1, or "auto", the engine's
// choice of one) needs an offloaded optimizer to split and stage 3; anywhere else it is refused, saying
// what is wrong and what to do, rather than ignored.
#include "config_test_util.h"

namespace strata {
namespace {

using testing::contains;

nlohmann::json with_ratio(int stage, const char* device, const nlohmann::json& ratio) {
  return {{"train_batch_size", 8},
          {"zero_optimization",
           {{"stage", stage}, {"offload_optimizer", {{"device", device}, {"ratio", ratio}}}}}};
}

struct Refused {
  const char* name;
  int stage;
  const char* device;
  nlohmann::json ratio;
  std::vector<std::string> expect;
};

void PrintTo(const Refused& r, std::ostream* os) {
  *os << r.name;
}

const Refused kRefused[] = {
    {"NumberBelowStage3",
     2,
     "cpu",
     0.5,
     {"zero_optimization.offload_optimizer.ratio: 0.5 (partial offload) needs zero_optimization.stage 3 "
      "(stage is 2;",
      "set stage 3, or remove ratio"}},
    {"AutoAtStage2",
     2,
     "cpu",
     "auto",
     {R"(zero_optimization.offload_optimizer.ratio: "auto" (partial offload) needs zero_optimization.stage 3 )"
      "(stage is 2;",
      "set stage 3, or remove ratio"}},
    {"AutoAtStage1",
     1,
     "cpu",
     "auto",
     {R"(zero_optimization.offload_optimizer.ratio: "auto" (partial offload) needs zero_optimization.stage 3 )"
      "(stage is 1;"}},
    {"NumberWithDeviceNone",
     3,
     "none",
     0.25,
     {R"(zero_optimization.offload_optimizer.ratio: 0.25 (partial offload) needs )"
      R"(zero_optimization.offload_optimizer.device "cpu" or "nvme" (device is "none": there is no )"
      "offloaded optimizer to split); offload the optimizer, or remove ratio"}},
    {"AutoWithDeviceNone",
     3,
     "none",
     "auto",
     {R"(zero_optimization.offload_optimizer.ratio: "auto" (partial offload) needs )"
      R"(zero_optimization.offload_optimizer.device "cpu" or "nvme" (device is "none")"}},
    {"ZeroWithDeviceNone",
     3,
     "none",
     0,
     {R"(zero_optimization.offload_optimizer.ratio: 0 (partial offload) needs )"
      R"(zero_optimization.offload_optimizer.device "cpu" or "nvme")"}},
    {"AutoWithDeviceNoneBelowStage3",
     2,
     "none",
     "auto",
     {R"(needs zero_optimization.offload_optimizer.device "cpu" or "nvme" and zero_optimization.stage 3 )"
      R"((device is "none", stage is 2: )",
      "offload the optimizer at stage 3, or remove ratio"}},
    {"AutoAtStage0", 0, "none", "auto", {R"(device is "none", stage is 0)"}},
};

class RefusedRatio : public ::testing::TestWithParam<Refused> {};

TEST_P(RefusedRatio, IsAConfigErrorSayingWhatToDo) {
  const Refused& r = GetParam();
  const std::string msg = testing::parse_error(with_ratio(r.stage, r.device, r.ratio));
  for (const auto& e : r.expect) EXPECT_TRUE(contains(msg, e)) << "missing «" << e << "» in\n" << msg;
  EXPECT_FALSE(contains(msg, "problems:")) << "one error for one problem:\n" << msg;
}

INSTANTIATE_TEST_SUITE_P(Config, RefusedRatio, ::testing::ValuesIn(kRefused),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(OffloadRatio, PartialOffloadAtStage3IsAccepted) {
  const Config a = Config::parse(with_ratio(3, "cpu", "auto"));
  EXPECT_TRUE(a.zero_optimization.offload_optimizer.ratio_auto);
  EXPECT_TRUE(a.warnings().empty()) << a.warnings()[0];
  const Config n = Config::parse(with_ratio(3, "cpu", 0.25));
  EXPECT_DOUBLE_EQ(n.zero_optimization.offload_optimizer.ratio, 0.25);
  EXPECT_TRUE(n.warnings().empty()) << n.warnings()[0];
}

// Ratio 1 (the default) offloads all of what is offloaded: a partial offload nowhere, so any stage and
// device take it, written or not.
TEST(OffloadRatio, RatioOneIsAcceptedEverywhere) {
  for (int stage = 0; stage <= 3; ++stage) {
    EXPECT_NO_THROW(Config::parse(with_ratio(stage, "none", 1))) << "stage " << stage;
    if (stage > 0) {  // (cpu needs stage 1 or more)
      EXPECT_NO_THROW(Config::parse(with_ratio(stage, "cpu", 1.0))) << "stage " << stage;
    }
  }
  const Config c =
      Config::parse({{"train_batch_size", 8},
                     {"zero_optimization", {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}}}}}});
  EXPECT_DOUBLE_EQ(c.zero_optimization.offload_optimizer.ratio, 1.0);
  EXPECT_FALSE(c.zero_optimization.offload_optimizer.ratio_auto);
}

// The deprecated cpu_offload flag offloads the optimizer, so a ratio beside it is judged by the stage.
TEST(OffloadRatio, DeviceFromTheLegacyFlagCounts) {
  const std::string msg = testing::parse_error(
      {{"train_batch_size", 8},
       {"zero_optimization",
        {{"stage", 2}, {"cpu_offload", true}, {"offload_optimizer", {{"ratio", "auto"}}}}}});
  EXPECT_TRUE(contains(msg, R"(ratio: "auto" (partial offload) needs zero_optimization.stage 3 (stage is 2)"))
      << msg;
}

}  // namespace
}  // namespace strata
