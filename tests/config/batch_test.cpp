// Batch sizes: train = micro × accumulation × world; any two determine the third (DeepSpeed's rules).
#include "config_test_util.h"

namespace strata {
namespace {

struct BatchCase {
  const char* name;
  std::int64_t train, micro, accum;  // 0: not in the file
  int world;
  std::int64_t want_train, want_micro, want_accum;
};

void PrintTo(const BatchCase& b, std::ostream* os) {
  *os << b.name;
}

nlohmann::json batch_doc(std::int64_t train, std::int64_t micro, std::int64_t accum) {
  nlohmann::json doc = nlohmann::json::object();
  if (train) doc["train_batch_size"] = train;
  if (micro) doc["train_micro_batch_size_per_gpu"] = micro;
  if (accum) doc["gradient_accumulation_steps"] = accum;
  return doc;
}

class BatchInference : public ::testing::TestWithParam<BatchCase> {};

TEST_P(BatchInference, FillsTheMissingSizes) {
  const BatchCase& b = GetParam();
  Config c = Config::parse(batch_doc(b.train, b.micro, b.accum), {}, b.world);
  EXPECT_EQ(c.train_batch_size, b.want_train);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, b.want_micro);
  EXPECT_EQ(c.gradient_accumulation_steps, b.want_accum);
  EXPECT_EQ(c.train_batch_size,
            c.train_micro_batch_size_per_gpu * c.gradient_accumulation_steps * c.world_size);
}

const BatchCase kBatchCases[] = {
    {"AllThreeConsistent", 32, 4, 2, 4, 32, 4, 2},
    {"TrainAndMicroGiveAccumulation", 64, 4, 0, 2, 64, 4, 8},
    {"TrainAndAccumulationGiveMicro", 64, 0, 4, 2, 64, 8, 4},
    {"MicroAndAccumulationGiveTrain", 0, 3, 5, 4, 60, 3, 5},
    {"TrainAloneSplitsOverRanks", 48, 0, 0, 3, 48, 16, 1},
    {"MicroAloneMeansNoAccumulation", 0, 6, 0, 2, 12, 6, 1},
};

INSTANTIATE_TEST_SUITE_P(Config, BatchInference, ::testing::ValuesIn(kBatchCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(BatchInference, InconsistentSizesShowTheArithmetic) {
  std::string msg = testing::parse_error(batch_doc(32, 4, 2), {}, 2);
  EXPECT_TRUE(testing::contains(msg,
                                "train_batch_size 32 != train_micro_batch_size_per_gpu 4 × "
                                "gradient_accumulation_steps 2 × world_size 2 = 16"))
      << msg;
}

TEST(BatchInference, IndivisibleTrainBatchNamesTheRoundedInference) {
  std::string msg = testing::parse_error(batch_doc(30, 4, 0), {}, 2);
  EXPECT_TRUE(testing::contains(msg,
                                "train_batch_size 30 != train_micro_batch_size_per_gpu 4 × "
                                "gradient_accumulation_steps 3 × world_size 2 = 24"))
      << msg;
  EXPECT_TRUE(testing::contains(msg, "gradient_accumulation_steps inferred as 30 / 4 / 2, rounded down"))
      << msg;
}

TEST(BatchInference, TrainBatchSmallerThanTheRanksIsRejected) {
  std::string msg = testing::parse_error(batch_doc(2, 0, 0), {}, 4);
  EXPECT_TRUE(testing::contains(msg, "train_batch_size 2 is too small: it must be at least world_size 4"))
      << msg;
}

TEST(BatchInference, AccumulationAloneDoesNotDetermineTheBatch) {
  std::string msg = testing::parse_error(batch_doc(0, 0, 4));
  EXPECT_TRUE(testing::contains(msg, "train_batch_size, train_micro_batch_size_per_gpu: neither is given"))
      << msg;
}

TEST(BatchInference, WorldSizeOverrideReplacesTheArgument) {
  Config c = Config::parse(batch_doc(64, 4, 0), {{"world_size", 8}}, 1);
  EXPECT_EQ(c.world_size, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
}

TEST(BatchInference, ZeroBatchSizeIsOutOfRange) {
  std::string msg = testing::parse_error({{"train_batch_size", 0}});
  EXPECT_TRUE(testing::contains(msg, "train_batch_size: 0 is out of range; allowed: an integer >= 1")) << msg;
}

}  // namespace
}  // namespace strata
