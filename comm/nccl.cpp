// The NCCL communicator: every collective of comm/comm.h over cuda device buffers, launched on the
// stream's cudaStream_t (Stream::native_handle()). Built only with the cuda backend (STRATA_HAVE_NCCL).
//
// Status: compiled, NEVER RUN — the machines this was written on have no GPU. Treat the first multi-GPU
// run as its first test (tests/comm's suite is written against the host backend's MPI communicator).
//
// Note [NCCL bootstrap]: rank 0 of the communicator's MPI_Comm creates the ncclUniqueId and MPI_Bcast's it
// to the others; every rank then calls ncclCommInitRank with the Device's ordinal current. dup() does the
// same over an MPI_Comm_dup of that MPI_Comm (a fresh unique id, so it works with any NCCL 2.x, where
// ncclCommSplit needs 2.18). The MPI_Comm also carries barrier() and the host-scalar reductions, which
// are blocking host operations.
//
// Note [NCCL reductions]: fp32 / bf16 / fp16 go to NCCL as ncclFloat32 / ncclBfloat16 / ncclFloat16 with
// ncclSum / ncclAvg / ncclMax / ncclMin. NCCL chooses the order of the additions (ring or tree, per
// chunk) and, for bf16 and fp16, rounds after each step, so for N > 2 ranks the result may differ in the
// last bit from comm.h's "reduced in fp32 and rounded once" (which the MPI communicator does exactly). It
// is the same on every rank and reproducible for a fixed NCCL version, topology and NCCL_ALGO/PROTO.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <cmath>
#include <cstddef>
#include <vector>

#include "comm/comm.h"
#include "comm/mpi_impl.h"
#include "core/cuda_check.h"
#include "core/error.h"

namespace strata::comm::detail {
namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::fp32:
      return ncclFloat32;
    case DType::bf16:
      return ncclBfloat16;
    case DType::fp16:
      return ncclFloat16;
    case DType::i32:
      return ncclInt32;
    case DType::u8:
      return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  return ncclSum;
}

class NcclCommunicator final : public Communicator {
 public:
  // Takes ownership of `mpi` (a dup made for this communicator). Collective over `mpi`.
  NcclCommunicator(MPI_Comm mpi, int device) : mpi_(mpi), device_(device) {
    STRATA_MPI_CHECK("nccl bootstrap", MPI_Comm_set_errhandler(mpi_, MPI_ERRORS_RETURN));
    STRATA_MPI_CHECK("nccl bootstrap", MPI_Comm_rank(mpi_, &rank_));
    STRATA_MPI_CHECK("nccl bootstrap", MPI_Comm_size(mpi_, &world_));
    ncclUniqueId id{};
    if (rank_ == 0) STRATA_NCCL_CHECK(ncclGetUniqueId(&id));
    STRATA_MPI_CHECK("nccl bootstrap", MPI_Bcast(&id, int(sizeof id), MPI_BYTE, 0, mpi_));
    ::strata::detail::CudaDeviceGuard guard(device_);
    STRATA_NCCL_CHECK(ncclCommInitRank(&nccl_, world_, id, rank_));
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&own_, cudaStreamNonBlocking));
  }
  ~NcclCommunicator() override {
    // Best effort (a destructor cannot throw): the caller has synchronised the streams it used.
    ::strata::detail::CudaDeviceGuard guard(device_);
    if (own_) cudaStreamDestroy(own_);
    if (nccl_) ncclCommDestroy(nccl_);
    if (mpi_active()) MPI_Comm_free(&mpi_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  const char* name() const override { return "nccl"; }

  void broadcast(const void* send, void* recv, std::size_t count, DType dtype, int root,
                 Stream* stream) override {
    check_root("broadcast", root, world_);
    if (count == 0) return;
    launch(stream, [&](cudaStream_t s) {
      STRATA_NCCL_CHECK(ncclBroadcast(send, recv, count, nccl_type(dtype), root, nccl_, s));
    });
  }
  void all_gather(const void* send, void* recv, std::size_t send_count, DType dtype,
                  Stream* stream) override {
    if (send_count == 0) return;
    launch(stream, [&](cudaStream_t s) {
      STRATA_NCCL_CHECK(ncclAllGather(send, recv, send_count, nccl_type(dtype), nccl_, s));
    });
  }
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType dtype, ReduceOp op,
                      Stream* stream) override {
    check_reducible("reduce_scatter", dtype);
    if (recv_count == 0) return;
    launch(stream, [&](cudaStream_t s) {
      STRATA_NCCL_CHECK(ncclReduceScatter(send, recv, recv_count, nccl_type(dtype), nccl_op(op), nccl_, s));
    });
  }
  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                  Stream* stream) override {
    check_reducible("all_reduce", dtype);
    if (count == 0) return;
    launch(stream, [&](cudaStream_t s) {
      STRATA_NCCL_CHECK(ncclAllReduce(send, recv, count, nccl_type(dtype), nccl_op(op), nccl_, s));
    });
  }
  void reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, int root,
              Stream* stream) override {
    check_reducible("reduce", dtype);
    check_root("reduce", root, world_);
    if (count == 0) return;
    launch(stream, [&](cudaStream_t s) {
      STRATA_NCCL_CHECK(ncclReduce(send, recv, count, nccl_type(dtype), nccl_op(op), root, nccl_, s));
    });
  }

  // Host threads only: device work already enqueued on streams is not waited for.
  void barrier() override { STRATA_MPI_CHECK("barrier", MPI_Barrier(mpi_)); }

  std::unique_ptr<Communicator> dup() override {
    MPI_Comm c = MPI_COMM_NULL;
    STRATA_MPI_CHECK("dup", MPI_Comm_dup(mpi_, &c));
    return std::make_unique<NcclCommunicator>(c, device_);
  }

  double all_reduce_sum(double x) override { return mpi_scalar_sum(mpi_, x); }
  bool all_reduce_and(bool x) override { return mpi_scalar_and(mpi_, x); }
  double all_reduce_max(double x) override { return mpi_scalar_max(mpi_, x); }

 private:
  // On the caller's stream, or on this communicator's own stream followed by a wait (stream == nullptr:
  // the call returns when the collective is complete).
  template <class F>
  void launch(Stream* stream, F&& f) {
    cudaStream_t s = stream ? static_cast<cudaStream_t>(stream->native_handle()) : own_;
    STRATA_CHECK(!stream || s, "the NCCL communicator needs a cuda stream; stream '", stream->name(),
                 "' has no native handle (a host-backend stream?)");
    ::strata::detail::CudaDeviceGuard guard(device_);
    f(s);
    if (!stream) STRATA_CUDA_CHECK(cudaStreamSynchronize(own_));
  }

  MPI_Comm mpi_;
  int device_ = 0;
  int rank_ = 0, world_ = 1;
  ncclComm_t nccl_ = nullptr;
  cudaStream_t own_ = nullptr;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const Device& dev) {
  STRATA_CHECK(mpi_active(), "make_nccl_communicator before mpi_init_once");
  STRATA_CHECK(dev.caps().backend == BackendKind::cuda, "the NCCL communicator needs a cuda device, not ",
               to_string(dev.caps().backend));
  MPI_Comm c = MPI_COMM_NULL;
  STRATA_MPI_CHECK("communicator", MPI_Comm_dup(MPI_COMM_WORLD, &c));
  return std::make_unique<NcclCommunicator>(c, dev.caps().ordinal);
}

}  // namespace strata::comm::detail
