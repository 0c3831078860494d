// strata/tiering/tiering.h: the tier manager — where every byte of model state lives (device memory,
// pinned host memory, NVMe), how it moves, and what it costs; plus the memprof trace writer (tools/memprof reads the traces).
//
// Example:
//   #include "tiering/tiering.h"
//   strata::nvme::AioEngine engine(aio_options);
//   strata::nvme::SwapStore swap(engine, {.nvme_path = "/local_nvme", .capacity = 64ull << 30});
//   strata::tiering::TierManager tm(*dev, {.device_budget = 20ull << 30, .pinned_budget = 8ull << 30},
//   &swap); strata::tiering::TraceWriter trace(tm, {.path = "run.memprof.jsonl"});   // strata.memprof.path
//   auto s = tm.register_shard({.prefix = "layers.3", .chunk = 3, .numel = n,
//                               .homes = {.param = Tier::nvme, .grad = Tier::pinned,
//                                         .master = Tier::nvme, .optim = Tier::nvme}});
//   tm.set_step(0, Phase::forward);
//   tm.pin(s.param);
//   tm.fetch(s.param, Tier::device).enqueue_wait(*compute);  // NVMe -> pinned staging -> device
//   ...
//   tm.unpin(s.param);
//   std::cout << tm.snapshot().to_json().dump(2);            // {"schema": "strata.memprof", ...}
//
// One concern per header:
//   tiering/types.h              Tier, Kind, State, Phase, Stat (and DType from core)
//   tiering/fence.h              Fence: when freed memory may be reused (EventFence, Flag)
//   tiering/caching_allocator.h  PyTorch-style caching allocator; device and pinned-slab flavours
//   tiering/pool.h               TierPool: one interface for device, pinned and NVMe memory
//   tiering/accounting.h         per tier x kind bytes, moves per direction, the event ring
//   tiering/manager.h            TierManager: registry, moves, eviction, OutOfMemory
//   tiering/snapshot.h           Snapshot and its versioned JSON
//   tiering/trace_writer.h       TraceWriter: the memprof trace file
#pragma once

#include "tiering/accounting.h"
#include "tiering/caching_allocator.h"
#include "tiering/fence.h"
#include "tiering/manager.h"
#include "tiering/pool.h"
#include "tiering/snapshot.h"
#include "tiering/trace_writer.h"
#include "tiering/types.h"
