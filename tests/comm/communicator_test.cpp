// The communicator's identity, host scalars, argument errors, rank discovery, and the one-rank NCCL
// factory's refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/comm/comm_env.h"

namespace strata::testing {
namespace {

TEST(Communicator, MatchesLauncherEnvironment) {
  const comm::RankInfo r = comm::rank_from_env();
  EXPECT_EQ(world().rank(), r.rank);
  EXPECT_EQ(world().world_size(), r.world_size);
  EXPECT_STREQ(world().name(), r.world_size > 1 ? "mpi" : "single");
  EXPECT_LT(r.local_rank, r.local_size);
}

TEST(Communicator, HostScalarsAreTheRankOrderFold) {
  const int W = world().world_size(), me = world().rank();
  double sum = 0;
  for (int r = 0; r < W; ++r) sum += 0.1 * (r + 1);
  EXPECT_EQ(world().all_reduce_sum(0.1 * (me + 1)), sum);  // bit-equal: the same order everywhere
  EXPECT_EQ(world().all_reduce_max(-double(me)), 0.0);
  EXPECT_TRUE(world().all_reduce_and(true));
  EXPECT_FALSE(world().all_reduce_and(me != W - 1));
  EXPECT_TRUE(std::isnan(world().all_reduce_max(me == 0 ? NAN : 1.0)));
}

TEST(Communicator, BadArgumentsThrowOnEveryRankBeforeCommunicating) {
  std::vector<std::int32_t> v(8);
  const int W = world().world_size();
  EXPECT_THROW(world().broadcast(v.data(), v.data(), v.size(), DType::i32, W, nullptr), Error);
  if (W > 1) {  // the single-rank communicator copies without looking at dtypes or overlap
    EXPECT_THROW(world().all_reduce(v.data(), v.data(), v.size(), DType::i32, comm::ReduceOp::sum, nullptr),
                 Error);
    // recv overlapping send other than in the in-place slot.
    EXPECT_THROW(world().all_gather(v.data() + 1, v.data(), 2, DType::i32, nullptr),
                 Error);  // slot: v + 2 * rank
  }
  world().barrier();  // and the communicator still works
  EXPECT_EQ(run_and_check(world(), {.coll = Coll::all_reduce, .count = 5}, 9), 0u);
}

// make_nccl_single_rank wants a build with NCCL and a cuda device (test_comm_nccl runs it on a GPU).
TEST(Communicator, NcclSingleRankRefusesAHostDeviceOrABuildWithoutNccl) {
  if (comm::nccl_built())
    EXPECT_THROW(comm::make_nccl_single_rank(host_device()), Error);
  else
    EXPECT_THROW(comm::make_nccl_single_rank(host_device()), BackendError);
}

// Saves and restores the environment variables it changes.
class EnvGuard {
 public:
  explicit EnvGuard(std::vector<std::string> names) : names_(std::move(names)) {
    for (const auto& n : names_) {
      const char* v = std::getenv(n.c_str());
      saved_.push_back(v ? std::optional<std::string>(v) : std::nullopt);
      ::unsetenv(n.c_str());
    }
  }
  ~EnvGuard() {
    for (std::size_t i = 0; i < names_.size(); ++i) {
      if (saved_[i])
        ::setenv(names_[i].c_str(), saved_[i]->c_str(), 1);
      else
        ::unsetenv(names_[i].c_str());
    }
  }

 private:
  std::vector<std::string> names_;
  std::vector<std::optional<std::string>> saved_;
};

TEST(RankFromEnv, FallsBackToPmiAndSlurm) {
  EnvGuard g({"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
              "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID",
              "MPI_LOCALNRANKS", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"});
  EXPECT_FALSE(comm::rank_from_env().launched);
  ::setenv("SLURM_PROCID", "5", 1);
  ::setenv("SLURM_NTASKS", "8", 1);
  ::setenv("SLURM_LOCALID", "1", 1);
  ::setenv("SLURM_NTASKS_PER_NODE", "4", 1);
  comm::RankInfo r = comm::rank_from_env();
  EXPECT_TRUE(r.launched);
  EXPECT_EQ(r.rank, 5);
  EXPECT_EQ(r.world_size, 8);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_size, 4);
  ::setenv("PMI_RANK", "2", 1);  // PMI before Slurm
  ::setenv("PMI_SIZE", "3", 1);
  r = comm::rank_from_env();
  EXPECT_EQ(r.rank, 2);
  EXPECT_EQ(r.world_size, 3);
  EXPECT_EQ(r.local_size, 3);    // no MPI_LOCALNRANKS: one node
  ::setenv("PMI_RANK", "3", 1);  // not below PMI_SIZE: ignored
  EXPECT_EQ(comm::rank_from_env().rank, 5);
}

}  // namespace
}  // namespace strata::testing
