// comm_abort_helper: rank 1 fails while the others wait in a barrier; abort_all must end the whole job.
// ctest runs it under mpirun and passes when rank 1's message appears before the timeout.
#include <cstdio>

#include "comm/comm.h"
#include "core/error.h"

int main() {
  using namespace strata;
  auto dev = open_device({.backend = "host"});
  auto world = comm::make_communicator(*dev);
  try {
    if (world->rank() == 1) throw Error("rank 1 failed on purpose");
    world->barrier();  // never completes: rank 1 does not arrive
    std::fprintf(stderr, "rank %d: passed a barrier rank 1 never entered\n", world->rank());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", world->rank(), e.what());
    comm::abort_all(3);
  }
}
