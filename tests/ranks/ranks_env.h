// The communicator of the test_ranks process (make_communicator over the host backend: MPI under
// mpirun, one rank otherwise).
#pragma once

#include "comm/comm.h"
#include "core/device.h"

namespace strata::testing {
comm::Communicator& ranks();
}  // namespace strata::testing
