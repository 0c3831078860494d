#include "zero3/communicator.h"

#include <cstring>

#include "core/error.h"

namespace strata::zero3 {
namespace {

class SingleRank final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  void all_gather(void* dst, const void* src, std::size_t bytes) override {
    if (dst != src) std::memmove(dst, src, bytes);
  }
  void reduce_scatter_sum(float* dst, const float* src, std::size_t count) override {
    if (dst != src) std::memmove(dst, src, count * sizeof(float));
  }
  double all_reduce_sum(double x) override { return x; }
  bool all_reduce_and(bool x) override { return x; }
  void barrier() override {}
};

}  // namespace

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

}  // namespace strata::zero3
