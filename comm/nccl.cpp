// The NCCL communicator: every collective of comm/comm.h over cuda device buffers, launched on the
// stream's cudaStream_t (Stream::native_handle()). Built only with the cuda backend (STRATA_HAVE_NCCL).
//
// Status: compiled. tests/comm/cuda_nccl_test.cpp runs every collective of the one-rank communicator
// (make_nccl_single_rank) through NCCL on a GPU; it was written on machines without one, so its first
// GPU run is its first test. The multi-rank path (MPI bootstrap, N > 1) has not run on several GPUs.
//
// Note [NCCL bootstrap]: rank 0 of the communicator's MPI_Comm creates the ncclUniqueId and MPI_Bcast's it
// to the others; every rank then calls ncclCommInitRank with the Device's ordinal current. dup() does the
// same over an MPI_Comm_dup of that MPI_Comm (a fresh unique id, so it works with any NCCL 2.x, where
// ncclCommSplit needs 2.18). The MPI_Comm also carries barrier(), the host collectives and the host
// scalars, which are blocking host operations: an MPI communicator over it (comm/mpi.cpp) does them. A
// one-rank communicator made without MPI (make_nccl_single_rank) uses ncclCommInitAll over its device,
// and the single-rank communicator for those host operations.
//
// Note [NCCL buffers]: NCCL's kernels read and write the buffers on the device; handed host memory (a
// std::vector, say) they fault or read garbage, and the error shows up far from the call.
// Every device collective therefore asks cudaPointerGetAttributes (a table lookup, no synchronisation)
// about each buffer it will touch (send on the root only for broadcast, recv on the root only for
// reduce) and throws strata::Error for pageable host memory (cudaMemoryTypeUnregistered), pinned host
// memory (cudaMemoryTypeHost) and another GPU's memory, naming the collective, the buffer and what to
// use instead: a device buffer, or the host collectives for host data. Device and managed memory pass.
//
// Note [NCCL teardown]: the destructor makes the device current, waits for the communicator's own stream
// (nullptr-stream collectives), destroys the NCCL communicator, then the stream, then (as a member) the
// MPI side. The stream outlives the communicator whose kernels ran on it. The caller has synchronised
// the streams it passed (comm.h); work still queued on them when the communicator goes is undefined, as
// in NCCL.
//
// Note [NCCL reductions]: fp32 / bf16 / fp16 go to NCCL as ncclFloat32 / ncclBfloat16 / ncclFloat16 with
// ncclSum / ncclAvg / ncclMax / ncclMin. NCCL chooses the order of the additions (ring or tree, per
// chunk) and, for bf16 and fp16, rounds after each step, so for N > 2 ranks the result may differ in the
// last bit from comm.h's "reduced in fp32 and rounded once" (which the MPI communicator does exactly). It
// is the same on every rank and reproducible for a fixed NCCL version, topology and NCCL_ALGO/PROTO.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <cstddef>
#include <string>

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

// Note [NCCL buffers]: the kind of memory at p, or "" when NCCL may use it on `device`.
std::string refused_kind(const void* p, int device) {
  ::strata::detail::CudaDeviceGuard guard(device);
  cudaPointerAttributes a{};
  STRATA_CUDA_CHECK(cudaPointerGetAttributes(&a, p));
  switch (a.type) {
    case cudaMemoryTypeManaged:
      return {};
    case cudaMemoryTypeDevice:
      return a.device == device ? std::string()
                                : ::strata::detail::cat("memory of CUDA device ", a.device,
                                                        " (this communicator's device is ", device, ")");
    case cudaMemoryTypeHost:
      return "pinned host memory (cudaHostAlloc / cudaHostRegister, e.g. a PinnedBuffer)";
    case cudaMemoryTypeUnregistered:
    default:
      return "pageable host memory (not known to CUDA)";
  }
}

void check_buffer(const char* coll, const char* which, const void* p, int device) {
  const std::string kind = refused_kind(p, device);
  if (kind.empty()) return;
  throw Error(::strata::detail::cat(
      "NCCL ", coll, ": the ", which, " buffer ", p, " is ", kind,
      "; NCCL's collectives take device memory of the communicator's GPU. Pass device buffers "
      "(Device::allocate), "
      "or for host data use the blocking host collectives (Communicator::host_all_gather, host_broadcast, "
      "all_reduce_sum / all_reduce_max / all_reduce_and)"));
}

class NcclCommunicator final : public Communicator {
 public:
  // Over MPI: takes ownership of `mpi` (a dup made for this communicator). Collective over `mpi`.
  NcclCommunicator(MPI_Comm mpi, int device) : mpi_(mpi), device_(device) {
    host_ = make_mpi_communicator(mpi_);  // owns mpi_ from here on, also if the rest throws
    rank_ = host_->rank();
    world_ = host_->world_size();
    ncclUniqueId id{};
    if (rank_ == 0) STRATA_NCCL_CHECK(ncclGetUniqueId(&id));
    host_->host_broadcast(&id, sizeof id, 0);
    init([&] { STRATA_NCCL_CHECK(ncclCommInitRank(&nccl_, world_, id, rank_)); });
  }
  // One rank, no MPI (make_nccl_single_rank).
  explicit NcclCommunicator(int device) : mpi_(MPI_COMM_NULL), device_(device) {
    host_ = make_single_rank();
    init([&] { STRATA_NCCL_CHECK(ncclCommInitAll(&nccl_, 1, &device_)); });
  }
  // Note [NCCL teardown]. Best effort: a destructor cannot throw.
  ~NcclCommunicator() override {
    ::strata::detail::make_device_current_noexcept(device_);
    if (cudaStreamSynchronize(own_) != cudaSuccess) (void)cudaGetLastError();
    (void)ncclCommDestroy(nccl_);
    if (cudaStreamDestroy(own_) != cudaSuccess) (void)cudaGetLastError();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  const char* name() const override { return "nccl"; }

  void broadcast(const void* send, void* recv, std::size_t count, DType dtype, int root,
                 Stream* stream) override {
    check_root("broadcast", root, world_);
    if (count == 0) return;
    if (rank_ == root) check_buffer("broadcast", "send", send, device_);
    check_buffer("broadcast", "recv", recv, device_);
    launch(stream, [&](cudaStream_t s) {
      STRATA_NCCL_CHECK(ncclBroadcast(send, recv, count, nccl_type(dtype), root, nccl_, s));
    });
  }
  void all_gather(const void* send, void* recv, std::size_t send_count, DType dtype,
                  Stream* stream) override {
    if (send_count == 0) return;
    check_buffers("all_gather", send, recv);
    launch(stream, [&](cudaStream_t s) {
      STRATA_NCCL_CHECK(ncclAllGather(send, recv, send_count, nccl_type(dtype), nccl_, s));
    });
  }
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType dtype, ReduceOp op,
                      Stream* stream) override {
    check_reducible("reduce_scatter", dtype);
    if (recv_count == 0) return;
    check_buffers("reduce_scatter", send, recv);
    launch(stream, [&](cudaStream_t s) {
      STRATA_NCCL_CHECK(ncclReduceScatter(send, recv, recv_count, nccl_type(dtype), nccl_op(op), nccl_, s));
    });
  }
  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                  Stream* stream) override {
    check_reducible("all_reduce", dtype);
    if (count == 0) return;
    check_buffers("all_reduce", send, recv);
    launch(stream, [&](cudaStream_t s) {
      STRATA_NCCL_CHECK(ncclAllReduce(send, recv, count, nccl_type(dtype), nccl_op(op), nccl_, s));
    });
  }
  void reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, int root,
              Stream* stream) override {
    check_reducible("reduce", dtype);
    check_root("reduce", root, world_);
    if (count == 0) return;
    check_buffer("reduce", "send", send, device_);
    if (rank_ == root) check_buffer("reduce", "recv", recv, device_);
    launch(stream, [&](cudaStream_t s) {
      STRATA_NCCL_CHECK(ncclReduce(send, recv, count, nccl_type(dtype), nccl_op(op), root, nccl_, s));
    });
  }

  // Host threads only: device work already enqueued on streams is not waited for.
  void barrier() override { host_->barrier(); }

  std::unique_ptr<Communicator> dup() override {
    if (mpi_ == MPI_COMM_NULL) return std::make_unique<NcclCommunicator>(device_);
    MPI_Comm c = MPI_COMM_NULL;
    STRATA_MPI_CHECK("dup", MPI_Comm_dup(mpi_, &c));
    return std::make_unique<NcclCommunicator>(c, device_);
  }

  void host_all_gather(const void* send, void* recv, std::size_t bytes) override {
    host_->host_all_gather(send, recv, bytes);
  }
  void host_broadcast(void* buf, std::size_t bytes, int root) override {
    host_->host_broadcast(buf, bytes, root);
  }

  double all_reduce_sum(double x) override { return host_->all_reduce_sum(x); }
  bool all_reduce_and(bool x) override { return host_->all_reduce_and(x); }
  double all_reduce_max(double x) override { return host_->all_reduce_max(x); }

 private:
  // The stream for nullptr-stream calls, then the NCCL communicator (`make` sets nccl_), with the device
  // current; on failure nothing is left behind but host_, which the member's destructor frees.
  template <class F>
  void init(F&& make) {
    ::strata::detail::CudaDeviceGuard guard(device_);
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&own_, cudaStreamNonBlocking));
    try {
      make();
    } catch (...) {
      (void)cudaStreamDestroy(own_);
      throw;
    }
  }

  void check_buffers(const char* coll, const void* send, void* recv) {
    check_buffer(coll, "send", send, device_);
    if (recv != send) check_buffer(coll, "recv", recv, device_);
  }

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

  MPI_Comm mpi_;  // MPI_COMM_NULL for one rank without MPI; owned by host_ otherwise
  int device_ = 0;
  int rank_ = 0, world_ = 1;
  std::unique_ptr<Communicator>
      host_;  // barrier, host collectives, host scalars (declared first: freed last)
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

std::unique_ptr<Communicator> make_local_nccl_communicator(const Device& dev) {
  if (dev.caps().backend != BackendKind::cuda)
    throw Error(::strata::detail::cat("an NCCL communicator needs a cuda device, not the ",
                                      to_string(dev.caps().backend), " backend's"));
  return std::make_unique<NcclCommunicator>(dev.caps().ordinal);
}

}  // namespace strata::comm::detail
