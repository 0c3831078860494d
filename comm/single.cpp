// World size 1: the collectives are copies of the caller's own data (or nothing when in place).
#include <cstring>

#include "comm/comm.h"
#include "core/error.h"

namespace strata::comm {
namespace {

// send -> recv, `bytes`: on the stream (device memory) or now (host memory).
void copy(const void* send, void* recv, std::size_t bytes, Stream* stream) {
  if (send == recv || bytes == 0) return;
  if (stream)
    stream->copy_async(recv, send, bytes, CopyKind::device_to_device);
  else
    std::memmove(recv, send, bytes);
}

class SingleRank final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  const char* name() const override { return "single"; }

  void broadcast(const void* send, void* recv, std::size_t count, DType dtype, int root,
                 Stream* stream) override {
    STRATA_CHECK(root == 0, "broadcast root ", root, " of world 1");
    copy(send, recv, count * dtype_bytes(dtype), stream);
  }
  void all_gather(const void* send, void* recv, std::size_t send_count, DType dtype,
                  Stream* stream) override {
    copy(send, recv, send_count * dtype_bytes(dtype), stream);
  }
  // avg over one rank is the value itself; so are max and min.
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType dtype, ReduceOp,
                      Stream* stream) override {
    copy(send, recv, recv_count * dtype_bytes(dtype), stream);
  }
  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp,
                  Stream* stream) override {
    copy(send, recv, count * dtype_bytes(dtype), stream);
  }
  void reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp, int root,
              Stream* stream) override {
    STRATA_CHECK(root == 0, "reduce root ", root, " of world 1");
    copy(send, recv, count * dtype_bytes(dtype), stream);
  }
  void barrier() override {}
  std::unique_ptr<Communicator> dup() override { return std::make_unique<SingleRank>(); }

  void host_all_gather(const void* send, void* recv, std::size_t bytes) override {
    copy(send, recv, bytes, nullptr);
  }
  void host_broadcast(void*, std::size_t, int root) override {
    STRATA_CHECK(root == 0, "host_broadcast root ", root, " of world 1");
  }

  double all_reduce_sum(double x) override { return x; }
  bool all_reduce_and(bool x) override { return x; }
  double all_reduce_max(double x) override { return x; }
};

}  // namespace

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  return "?";
}

std::unique_ptr<Communicator> make_single_rank() {
  return std::make_unique<SingleRank>();
}

ShardRange shard_range(std::size_t padded_numel, int world_size, int rank) {
  STRATA_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "rank ", rank, " of world ", world_size);
  STRATA_CHECK(padded_numel % std::size_t(world_size) == 0, "chunk of ", padded_numel,
               " elements is not padded to a multiple of world size ", world_size);
  const std::size_t n = padded_numel / std::size_t(world_size);
  return {n * std::size_t(rank), n};
}

}  // namespace strata::comm
