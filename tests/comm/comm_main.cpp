// main of test_comm: one communicator for the whole binary (make_communicator over the host backend), run
// as N MPI ranks by ctest (`mpirun --oversubscribe -np N test_comm`) and as a plain process (single rank).
// Only rank 0 prints GoogleTest's report; a failure on any rank fails every rank's exit code.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <memory>

#include "comm/mpi_impl.h"
#include "tests/comm/comm_env.h"

namespace strata::testing {
namespace {
std::unique_ptr<Device> g_device;
std::unique_ptr<comm::Communicator> g_world;
}  // namespace

comm::Communicator& world() {
  return *g_world;
}
Device& host_device() {
  return *g_device;
}

}  // namespace strata::testing

int main(int argc, char** argv) {
  using namespace strata;
  ::testing::InitGoogleTest(&argc, argv);
  strata::testing::g_device = open_device({.backend = "host"});
  strata::testing::g_world = comm::make_communicator(*strata::testing::g_device);
  const int rank = strata::testing::g_world->rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  if (failed && rank != 0) {
    for (int i = 0; i < ::testing::UnitTest::GetInstance()->total_test_suite_count(); ++i) {
      const auto* s = ::testing::UnitTest::GetInstance()->GetTestSuite(i);
      for (int j = 0; j < s->total_test_count(); ++j)
        if (s->GetTestInfo(j)->result()->Failed())
          std::fprintf(stderr, "rank %d: FAILED %s.%s\n", rank, s->name(), s->GetTestInfo(j)->name());
    }
  }
  if (comm::detail::mpi_active()) MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && failed) std::fprintf(stderr, "test_comm: a test failed on at least one rank\n");
  strata::testing::g_world.reset();
  strata::testing::g_device.reset();
  return failed;
}
