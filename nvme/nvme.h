// strata/nvme/nvme.h: the NVMe tier — async I/O engine, swap store, measurement and tuning.
//
// Example:
//   #include "nvme/nvme.h"
//   strata::nvme::AioOptions aio;                            // DeepSpeed's `aio` defaults
//   strata::nvme::AioEngine engine(aio);                     // io_uring if permitted, else libaio, else
//   psync engine.register_buffers(pinned_pool, pool_bytes);        // io_uring fixed buffers
//   strata::nvme::SwapStore swap(engine, {.nvme_path = "/local_nvme", .capacity = bytes_needed});
//   strata::nvme::SwapExtent e = swap.allocate(shard_bytes);
//   swap.wait(swap.write(e, shard));
//   strata::nvme::IoHandle h = swap.read(e, shard);          // overlap with compute, then
//   swap.wait(h);                                            // IoError names file, offset, length, errno
//
// Pieces, one concern per header:
//   nvme/options.h           AioOptions (aio.* keys, DeepSpeed defaults), Backend
//   nvme/file.h              File: O_DIRECT with queried alignment, buffered fallback
//   nvme/engine.h            AioEngine: submit / wait / poll / wait_all, fixed buffers, IoStats
//   nvme/extent_allocator.h  ExtentAllocator: best-fit extents, fragmentation stats
//   nvme/swap_store.h        SwapStore: per-run swap directory, extents by handle, leftovers of crashes
//   nvme/tune.h              measure() and the nvme-tune sweep
#pragma once

#include "nvme/engine.h"
#include "nvme/extent_allocator.h"
#include "nvme/file.h"
#include "nvme/options.h"
#include "nvme/swap_store.h"
#include "nvme/tune.h"
