// strata/comm/mpi_impl.h: internals shared by the MPI and NCCL communicators and the factory — MPI's
// one-time initialisation, the error check, and a testing hook. Not part of the public interface
// (comm/comm.h is); tests include it to reach the hook.
//
// Example (what make_communicator does for a host-addressable device):
//   comm::detail::mpi_init_once();                              // MPI_THREAD_MULTIPLE or ConfigError
//   std::unique_ptr<comm::Communicator> c = comm::detail::make_mpi_communicator();   // dup of WORLD
#pragma once

#include <mpi.h>

#include <cstddef>
#include <memory>

#include "comm/comm.h"
#include "core/error.h"

namespace strata::comm::detail {

// Note [MPI lifetime]: MPI is initialised once per process, by the first make_communicator that needs
// it, with MPI_THREAD_MULTIPLE (every dup'ed communicator may be driven by its own thread or stream
// worker). A process whose MPI was already initialised by someone else is accepted when it provides
// MPI_THREAD_MULTIPLE, and then is not finalised by us. MPI_Finalize runs from an atexit handler, and
// only when no collective enqueued on a stream is still pending (finalising under a running collective
// is undefined behaviour in MPI): otherwise the handler skips it and says so on stderr. A communicator
// destroyed after MPI_Finalize does not free its MPI_Comm (MPI already did).
void mpi_init_once();
bool mpi_active();  // initialised and not yet finalised

// Throws BackendError "MPI <what>: <call> failed: <MPI_Error_string> (error <rc>)" unless rc is
// MPI_SUCCESS. Communicators set MPI_ERRORS_RETURN so that errors reach this check instead of aborting.
void mpi_check(int rc, const char* call, const char* what);
#define STRATA_MPI_CHECK(what, stmt) ::strata::comm::detail::mpi_check((stmt), #stmt, (what))

// Collectives enqueued on streams and not yet finished, all communicators of the process together
// (what the atexit handler looks at).
void mpi_pending_add(int delta);

// Argument checks shared by the MPI and NCCL communicators (programming errors: STRATA_CHECK).
inline void check_root(const char* what, int root, int world) {
  STRATA_CHECK(root >= 0 && root < world, what, ": root ", root, " is not a rank of world ", world);
}
inline void check_reducible(const char* what, DType t) {
  STRATA_CHECK(dtype_is_float(t), what, ": reductions take fp32, bf16 or fp16 buffers, not ", dtype_name(t));
}

// Host scalars over `c` (the MPI and NCCL communicators' all_reduce_sum / _and / _max): every rank's
// value gathered, then folded in rank order, so that every rank gets the same bits. max propagates NaN.
double mpi_scalar_sum(MPI_Comm c, double x);
bool mpi_scalar_and(MPI_Comm c, bool x);
double mpi_scalar_max(MPI_Comm c, double x);

// A communicator over a dup of MPI_COMM_WORLD. Requires mpi_init_once().
std::unique_ptr<Communicator> make_mpi_communicator();
// A communicator over `owned`, which it frees when destroyed (the NCCL communicator's host side).
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm owned);

#ifdef STRATA_HAVE_NCCL
// A communicator over the cuda Device `dev` (ncclCommInitRank, unique id broadcast over MPI). Requires
// mpi_init_once(). Multi-rank: compiled, never run on GPUs so far.
std::unique_ptr<Communicator> make_nccl_communicator(const Device& dev);
// One rank, no MPI (ncclCommInitAll over dev): comm.h's make_nccl_single_rank.
std::unique_ptr<Communicator> make_local_nccl_communicator(const Device& dev);
#endif

// MPI counts are int: messages longer than this many elements are split into pieces of at most this
// many. Default INT_MAX. Tests lower it to run the splitting paths on small buffers; set it only while
// no collective runs (every rank must use the same value).
void set_mpi_max_message_count(std::size_t elements);
std::size_t mpi_max_message_count();

}  // namespace strata::comm::detail
