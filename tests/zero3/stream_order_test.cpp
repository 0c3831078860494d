// Device work in stream order (Note [Device work in stream order] in zero3/engine.h, Note [Gather] in
// zero3/engine_cache.cpp): an acquire makes the compute stream wait for the chunk's gather instead of
// waiting on the host, except for a gather from an NVMe home, whose read the host must see land. The
// losses are the same either way (the placement tests hold that); this holds where the host waits.
#include <gtest/gtest.h>

#include <string>

#include "engine_util.h"

namespace strata::zero3 {
namespace {

using test::make_config;
using test::make_tokens;
using test::ScratchDir;

TransferStats run(OffloadDevice param, const ScratchDir& d) {
  const Config cfg = make_config(param, OffloadDevice::cpu, d.path());
  const model::ModelConfig mcfg = test::block_model("stream-order-test", 2);
  Engine engine(cfg, mcfg, {.backend = "", .device_memory_cap = 0, .seq_len = 16});
  model::TokenFile file = model::TokenFile::open(make_tokens(d));
  model::DataLoader data(file,
                         {.batch_size = engine.micro_batch(), .seq_len = 16, .seed = 3, .vocab_size = 256});
  model::LlamaModel m(mcfg, engine.model_options());
  for (int i = 0; i < 2; ++i) engine.train_batch(m, data);
  return engine.transfer_stats();
}

TEST(StreamOrder, GathersFromPinnedMemoryAreWaitedForOnTheStream) {
  ScratchDir d("stream-order-cpu");
  const TransferStats t = run(OffloadDevice::cpu, d);
  EXPECT_GT(t.gathers, 0u);
  EXPECT_EQ(t.gather_host_waits, 0u);
}

TEST(StreamOrder, GathersFromNvmeAreWaitedForOnTheHost) {
  ScratchDir d("stream-order-nvme");
  const TransferStats t = run(OffloadDevice::nvme, d);
  EXPECT_GT(t.gather_host_waits, 0u);
  EXPECT_LE(t.gather_host_waits, t.gathers);
}

}  // namespace
}  // namespace strata::zero3
