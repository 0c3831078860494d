// strata/nvme/options.h: the settings of the async I/O engine, with DeepSpeed's `aio` keys and defaults.
//
// Example:
//   strata::nvme::AioOptions opts;                 // DeepSpeed's defaults: 1 MiB blocks, depth 8, 1 thread
//   opts.backend = strata::nvme::parse_backend("io_uring");
//   opts.queue_depth = 32;
//   opts.validate();                               // ConfigError naming the key, the value and the range
//   std::string json = opts.to_config_json();      // {"aio": {...}, "strata": {"aio": {"backend": ...}}}
//
// The config parser (config/) fills this struct from ds_config.json; the keys below are the JSON key paths.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace strata::nvme {

// Which kernel interface moves the bytes. `auto_select` probes io_uring, then libaio, then falls back to
// psync, and logs what it chose. psync is plain pread/pwrite on worker threads: the test oracle and the
// fallback where neither asynchronous interface is permitted.
enum class Backend { auto_select, io_uring, libaio, psync };

// "auto" | "io_uring" | "libaio" | "psync"; anything else raises ConfigError listing the allowed values.
Backend parse_backend(std::string_view name);
const char* to_string(Backend b);

struct AioOptions {
  // strata.aio.backend: auto | io_uring | libaio | psync. Default auto. A named backend that the kernel
  // refuses raises BackendError at engine construction (auto never does: psync always works).
  Backend backend = Backend::auto_select;

  // aio.block_size: bytes per I/O piece; a request is cut into pieces of this size. Default 1048576
  // (DeepSpeed's). Must be a multiple of 4096 and at most 1 GiB; larger blocks mean fewer system calls,
  // smaller ones finer interleaving between threads.
  std::size_t block_size = 1048576;

  // aio.queue_depth: pieces kept in flight per thread (per io_uring ring / libaio context). Default 8
  // (DeepSpeed's). 1..4096. The psync backend has no queue; its concurrency is intra_op_parallelism.
  int queue_depth = 8;

  // aio.intra_op_parallelism (alias aio.thread_count): threads that each drive their own ring or context;
  // every request is split into this many contiguous parts, one per thread. Default 1 (DeepSpeed's). 1..64.
  int intra_op_parallelism = 1;

  // aio.single_submit: true submits each piece with its own system call; false (DeepSpeed's default)
  // submits every prepared piece in one call.
  bool single_submit = false;

  // aio.overlap_events: true (DeepSpeed's default) submits a new piece as soon as any completes, keeping
  // the queue full; false submits queue_depth pieces, waits for all of them, then submits the next batch.
  bool overlap_events = true;

  // strata.aio.use_direct: open files with O_DIRECT (default true). Buffers, offsets and lengths are then
  // aligned to what the file system reports (statx DIOALIGN); where a directory refuses O_DIRECT the
  // engine falls back to buffered I/O with one warning naming the path.
  bool use_direct = true;

  // strata.aio.sqpoll: io_uring only; a kernel thread polls the submission queue so that submitting needs
  // no system call. Default false: on machines with few cores the poller competes with the optimizer.
  bool sqpoll = false;

  // Raises ConfigError naming the key path, the value and the allowed range.
  void validate() const;

  // {"aio": {block_size, queue_depth, intra_op_parallelism, single_submit, overlap_events},
  //  "strata": {"aio": {"backend": ...}}}: ready to paste into a config.
  std::string to_config_json() const;
};

}  // namespace strata::nvme
