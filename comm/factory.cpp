// Rank discovery from the launcher's environment, the choice of communicator, and ending the whole job.
//
// Which communicator (make_communicator):
//   not launched by an MPI launcher, or world size 1   -> single rank (comm/single.cpp)
//   N > 1 ranks, host-addressable device (host)        -> MPI over host buffers (comm/mpi.cpp)
//   N > 1 ranks, cuda device                           -> NCCL on the stream (comm/nccl.cpp; needs a build
//                                                         with the cuda backend, which brings NCCL)
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "comm/comm.h"
#include "comm/mpi_impl.h"
#include "core/error.h"

namespace strata::comm {
namespace {

// The integer in environment variable `name`, or -1 when unset, empty or not a number.
int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > 1 << 30) return -1;
  return int(x);
}

}  // namespace

RankInfo rank_from_env() {
  RankInfo r;
  // Each launcher's names, first found wins: Open MPI (mpirun), PMIx (PMIX_RANK; size from Open MPI's
  // variable when both are there), MPICH / Intel MPI (PMI_*), Slurm (srun).
  struct Names {
    const char *rank, *size, *local_rank, *local_size;
  };
  static constexpr Names kLaunchers[] = {
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
      {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
  };
  for (const Names& n : kLaunchers) {
    const int rank = env_int(n.rank), size = env_int(n.size);
    if (rank < 0 || size < 1 || rank >= size) continue;
    r.launched = true;
    r.rank = rank;
    r.world_size = size;
    const int lr = env_int(n.local_rank), ls = env_int(n.local_size);
    // Without the local variables: one node (what mpirun on one machine gives).
    r.local_size = ls >= 1 ? ls : size;
    r.local_rank = lr >= 0 && lr < r.local_size ? lr : rank % r.local_size;
    return r;
  }
  return r;
}

std::unique_ptr<Communicator> make_communicator(const Device& dev) {
  const RankInfo r = rank_from_env();
  if (!r.launched || r.world_size <= 1) return make_single_rank();
  detail::mpi_init_once();
  if (dev.caps().host_addressable) return detail::make_mpi_communicator();
#ifdef STRATA_HAVE_NCCL
  return detail::make_nccl_communicator(dev);
#else
  throw ConfigError(::strata::detail::cat(
      "launched with ", r.world_size, " ranks on a ", to_string(dev.caps().backend),
      " device, whose buffers the CPU cannot address, but this build has no NCCL communicator. Build with "
      "the cuda backend (CUDA toolkit with NCCL: nccl.h and libnccl.so, e.g. NVIDIA's libnccl-dev), or run "
      "with the host backend (--backend host), which communicates over MPI."));
#endif
}

std::unique_ptr<Communicator> make_nccl_single_rank(const Device& dev) {
#ifdef STRATA_HAVE_NCCL
  return detail::make_local_nccl_communicator(dev);
#else
  (void)dev;
  throw BackendError(
      "an NCCL communicator was asked for, but this build has no NCCL: build with the cuda backend and "
      "NCCL (nccl.h and libnccl.so, e.g. NVIDIA's libnccl-dev)");
#endif
}

bool nccl_built() {
#ifdef STRATA_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

void abort_all(int exit_code) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (detail::mpi_active()) MPI_Abort(MPI_COMM_WORLD, exit_code);
  // Not initialised (or already finalised): exit; mpirun ends the other ranks when one exits non-zero.
  std::exit(exit_code);
}

}  // namespace strata::comm
