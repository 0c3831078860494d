// model::init_chunk draws each tensor's values in parallel blocks (Note [Parallel initialisation] in
// model/chunk.cpp): the bytes do not depend on how many threads draw them.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include <tbb/task_arena.h>

#include "model/chunk.h"
#include "model/config.h"
#include "model/layout.h"

namespace strata::model {
namespace {

// Every chunk of `layout`, drawn inside an arena of `threads` threads.
std::vector<float> draw_all(const ModelLayout& layout, int threads) {
  std::vector<float> all(layout.total_padded_numel(), -1.0f);
  tbb::task_arena arena(threads);
  arena.execute([&] {
    for (int c = 0; c < layout.num_chunks(); ++c)
      init_chunk(layout, c, 11, all.data() + layout.chunk(c).flat_offset);
  });
  return all;
}

// The 10m preset's matrices span many blocks of pairs; tiny's are smaller than one.
TEST(InitChunk, OneThreadAndSeveralThreadsWriteTheSameBytes) {
  for (const char* name : {"10m", "tiny"}) {
    const ModelLayout layout(ModelConfig::preset(name), {1, 1});
    const std::vector<float> one = draw_all(layout, 1);
    for (int threads : {2, 5}) {
      const std::vector<float> many = draw_all(layout, threads);
      ASSERT_EQ(0, std::memcmp(one.data(), many.data(), one.size() * sizeof(float)))
          << name << ": 1 thread against " << threads;
    }
  }
}

}  // namespace
}  // namespace strata::model
