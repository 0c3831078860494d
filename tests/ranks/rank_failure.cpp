// Two ranks train; rank 1 throws in the middle of step 2 (after its forward, before its backward), as a
// bad batch or a failed read would. The program's error path prints the rank's message and ends the
// job through comm::abort_all — rank 0, waiting in its next collective, must not hang (ctest's timeout
// catches that) and the job must fail with rank 1's message.
#include <cstdio>
#include <stdexcept>

#include "engine_util.h"

int main() {
  using namespace strata;
  const comm::RankInfo ri = comm::rank_from_env();
  try {
    std::unique_ptr<Device> host = open_device({.backend = "host"});
    std::unique_ptr<comm::Communicator> world = comm::make_communicator(*host);
    zero3::test::ScratchDir d("ranks-failure-r" + std::to_string(world->rank()));
    const Config cfg = zero3::test::make_config(
        OffloadDevice::cpu, OffloadDevice::cpu, d.path(),
        {{"train_micro_batch_size_per_gpu", 1}, {"gradient_accumulation_steps", 1}}, world->world_size());
    const model::ModelConfig mcfg = model::ModelConfig::preset("tiny");
    zero3::Engine e(cfg, mcfg,
                    {.backend = "host", .device_memory_cap = 0, .seq_len = 32, .communicator = world.get()});
    model::TokenFile file = model::TokenFile::open(zero3::test::make_tokens(d));
    model::DataLoader data(file, {.batch_size = 1,
                                  .seq_len = 32,
                                  .rank = world->rank(),
                                  .world = world->world_size(),
                                  .seed = 3,
                                  .vocab_size = 256});
    model::LlamaModel m(mcfg, e.model_options());
    e.train_batch(m, data);
    const model::Batch b = data.next();
    e.begin_pass();
    m.forward(e, b.inputs.data(), b.targets.data(), b.rows, b.seq_len);
    if (world->rank() == 1) throw Error("rank 1 fails in step 2 on purpose");
    m.backward(e, 1.0f);
    e.end_pass();
    e.step();
    std::fprintf(stderr, "rank %d finished step 2, which it must not reach\n", world->rank());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata: rank %d of %d: error: %s\n", ri.rank, ri.world_size, e.what());
    std::fflush(stderr);
    comm::abort_all(1);
  }
}
