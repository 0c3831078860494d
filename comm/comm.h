// strata/comm/comm.h: collectives across the data-parallel ranks behind one interface (DESIGN.md §1,
// comm/ row): single rank, MPI over host buffers (the host backend), NCCL over device buffers (cuda).
//
// Example (the engine's gradient path at rank r of N, stage 3):
//   std::unique_ptr<comm::Communicator> world = comm::make_communicator(dev);   // from the launcher's env
//   std::unique_ptr<comm::Communicator> grads = world->dup();   // one communicator per stream / thread
//   grads->reduce_scatter(full, shard, shard_numel, DType::fp32, comm::ReduceOp::sum, grad_stream);
//   double norm_sq = world->all_reduce_sum(local_norm_sq);      // host scalars: blocking
//   world->host_all_gather(&mine, all.data(), sizeof mine);      // small host data: blocking
//
// Note [Communicator semantics]:
// - Argument order is nccl.h's everywhere: send buffer, receive buffer, count, dtype, (op), (root),
//   stream. Counts are elements. all_gather: `send_count` per rank, recv holds world * send_count.
//   reduce_scatter: `recv_count` per rank, send holds world * recv_count.
// - In place as in NCCL: all_gather with send == recv + rank * send_count bytes; reduce_scatter with
//   recv == send + rank * recv_count; all_reduce / broadcast / reduce with send == recv.
// - `stream`: the call is enqueued on it and ordered with the stream's other work (MPI: run by the
//   stream's worker as a host function; NCCL: launched on its cudaStream_t). nullptr: the call runs on
//   the calling thread and returns when it is complete.
// - Ordering: every rank must issue the same collectives on a communicator in the same order. A
//   communicator belongs to one issuing thread or stream; use dup() for each further one (MPI needs
//   MPI_THREAD_MULTIPLE for this, which make_communicator requests).
// - Reductions: fp32 / bf16 / fp16 buffers; bf16 and fp16 are reduced in fp32 and rounded once (core's
//   rounding). avg = sum / world_size.
// - Memory: the collectives above take the Device's buffers — host memory on the host backend, device
//   memory on cuda (NCCL refuses pageable and pinned host memory with a strata::Error that names the
//   collective and the buffer; managed memory is accepted). Host data (a norm's partials, a few ids, a
//   checkpoint's metadata) goes through the host collectives, which take ordinary host memory on every
//   backend and block on the calling thread: host_all_gather (rank r's `bytes` bytes of send land at
//   recv + r * bytes on every rank; in place when send == recv + rank * bytes), host_broadcast (root's
//   `bytes` bytes of buf land in buf on every rank), and the host scalars. They are collectives like the
//   others: every rank calls them in the same order on the communicator, from the thread that owns it.
//   Single: copies; MPI: the same MPI calls as all_gather / broadcast over bytes; NCCL: MPI over the
//   communicator's MPI_Comm (a one-rank NCCL communicator made without MPI: copies).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/device.h"
#include "core/dtype.h"

namespace strata::comm {

enum class ReduceOp : std::uint8_t { sum, avg, max, min };
const char* to_string(ReduceOp op);

// Where this process sits among the ranks, from the launcher's environment (Open MPI's
// OMPI_COMM_WORLD_*, PMIx / Slurm equivalents), before any communicator exists.
struct RankInfo {
  int rank = 0, world_size = 1, local_rank = 0, local_size = 1;
  bool launched = false;  // started by an MPI launcher (mpirun / strata launch)
};
RankInfo rank_from_env();

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual const char* name() const = 0;  // "single", "mpi", "nccl"

  virtual void broadcast(const void* send, void* recv, std::size_t count, DType dtype, int root,
                         Stream* stream) = 0;
  virtual void all_gather(const void* send, void* recv, std::size_t send_count, DType dtype,
                          Stream* stream) = 0;
  virtual void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType dtype, ReduceOp op,
                              Stream* stream) = 0;
  virtual void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                          Stream* stream) = 0;
  virtual void reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, int root,
                      Stream* stream) = 0;
  virtual void barrier() = 0;  // blocking, on the calling thread
  // A new communicator over the same ranks, for another thread or stream (Note [Communicator semantics]).
  // Collective: every rank calls it in the same order.
  virtual std::unique_ptr<Communicator> dup() = 0;

  // Host memory, blocking, on the calling thread, whatever the backend (Note [Communicator semantics]).
  // Rank r's `bytes` bytes of `send` land at recv + r * bytes on every rank (recv holds world * bytes);
  // in place when send == recv + rank * bytes.
  virtual void host_all_gather(const void* send, void* recv, std::size_t bytes) = 0;
  // The root's `bytes` bytes of `buf` land in `buf` on every rank.
  virtual void host_broadcast(void* buf, std::size_t bytes, int root) = 0;

  // Host scalars, blocking (over host memory, whatever the backend).
  virtual double all_reduce_sum(double x) = 0;
  virtual bool all_reduce_and(bool x) = 0;
  virtual double all_reduce_max(double x) = 0;
};

// World size 1: every collective is a copy (or nothing).
std::unique_ptr<Communicator> make_single_rank();

// World size 1 over NCCL on the cuda Device `dev`, made without MPI (ncclCommInitAll over that one
// device): every device collective runs through NCCL, so that its code runs on a machine with one GPU;
// barrier, the host collectives and host scalars are local. make_communicator never makes it (one rank
// gets the single-rank communicator); tests and benchmarks do. Throws BackendError when the build has no
// NCCL (nccl_built()), Error when `dev` is not a cuda device.
std::unique_ptr<Communicator> make_nccl_single_rank(const Device& dev);
bool nccl_built();

// The communicator for this process: single rank when not launched by MPI (or world size 1); otherwise
// MPI (initialised here with MPI_THREAD_MULTIPLE) for a host-addressable device, NCCL (its unique id
// broadcast over MPI) for cuda. Throws ConfigError when launched with N > 1 ranks but the build has no
// MPI (or, on cuda, no NCCL).
std::unique_ptr<Communicator> make_communicator(const Device& dev);

// Ends every rank of an MPI job after an error on this one (MPI_Abort): the launcher stops the others.
// Does nothing when not launched by MPI. Call after printing the error.
[[noreturn]] void abort_all(int exit_code);

// This rank's slice of a chunk of `padded_numel` elements (a multiple of world_size).
struct ShardRange {
  std::size_t offset = 0, numel = 0;
};
ShardRange shard_range(std::size_t padded_numel, int world_size, int rank);

}  // namespace strata::comm
