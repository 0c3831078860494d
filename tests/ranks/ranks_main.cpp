// main of test_ranks: GoogleTest under N MPI ranks. Only rank 0 prints the report; the exit code is
// non-zero on every rank when a test failed on any of them.
#include <gtest/gtest.h>

#include <cstdio>

#include "tests/ranks/ranks_env.h"

namespace strata::testing {

comm::Communicator& ranks() {
  static std::unique_ptr<Device> dev = open_device({.backend = "host"});
  static std::unique_ptr<comm::Communicator> world = comm::make_communicator(*dev);
  return *world;
}

}  // namespace strata::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  strata::comm::Communicator& world = strata::testing::ranks();
  if (world.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const bool failed_here = RUN_ALL_TESTS() != 0;
  if (failed_here && world.rank() != 0)
    std::fprintf(stderr, "test_ranks: a test failed on rank %d\n", world.rank());
  const bool failed = world.all_reduce_max(failed_here ? 1.0 : 0.0) > 0;
  return failed ? 1 : 0;
}
