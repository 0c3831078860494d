// strata/zero3/communicator.h: the collectives the engine needs, behind one interface (DESIGN.md §1:
// single, MPI, NCCL). This build has the single-rank one; the engine's shard arithmetic is written for any
// world size, so adding a multi-rank communicator does not change the engine's bookkeeping.
//
// Example:
//   std::unique_ptr<Communicator> comm = make_single_rank();
//   comm->all_gather(gathered, shard, shard_bytes);        // rank r's shard lands at r * shard_bytes
//   comm->reduce_scatter_sum(shard, full, shard_numel);   // full = world * shard_numel floats
//   double total = comm->all_reduce_sum(local_sum_sq);
//
// Argument order is the same in every call (destination, source, count), as in nccl.h.
#pragma once

#include <cstddef>
#include <memory>

namespace strata::zero3 {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // dst (world * bytes) receives every rank's src (bytes) in rank order.
  virtual void all_gather(void* dst, const void* src, std::size_t bytes) = 0;
  // dst (count floats) = the sum over ranks of src[rank * count, (rank + 1) * count).
  virtual void reduce_scatter_sum(float* dst, const float* src, std::size_t count) = 0;
  virtual double all_reduce_sum(double x) = 0;
  virtual bool all_reduce_and(bool x) = 0;
  virtual void barrier() = 0;
};

// World size 1: every collective is a copy (or nothing).
std::unique_ptr<Communicator> make_single_rank();

// This rank's slice of a chunk of `padded_numel` elements (a multiple of world_size).
struct ShardRange {
  std::size_t offset = 0, numel = 0;
};
ShardRange shard_range(std::size_t padded_numel, int world_size, int rank);

}  // namespace strata::zero3
