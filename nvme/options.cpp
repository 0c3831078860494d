#include "nvme/options.h"

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "core/error.h"

namespace strata::nvme {

Backend parse_backend(std::string_view name) {
  if (name == "auto") return Backend::auto_select;
  if (name == "io_uring") return Backend::io_uring;
  if (name == "libaio") return Backend::libaio;
  if (name == "psync") return Backend::psync;
  throw ConfigError(
      strata::detail::cat("strata.aio.backend: \"", name, "\" is not one of auto, io_uring, libaio, psync"));
}

const char* to_string(Backend b) {
  switch (b) {
    case Backend::auto_select:
      return "auto";
    case Backend::io_uring:
      return "io_uring";
    case Backend::libaio:
      return "libaio";
    case Backend::psync:
      return "psync";
  }
  return "?";
}

void AioOptions::validate() const {
  constexpr std::size_t kMaxBlock = std::size_t(1) << 30;
  if (block_size == 0 || block_size % 4096 != 0 || block_size > kMaxBlock)
    throw ConfigError(strata::detail::cat("aio.block_size: ", block_size,
                                          " must be a positive multiple of 4096 no larger than 1 GiB (",
                                          kMaxBlock, "); DeepSpeed's default is 1048576"));
  if (queue_depth < 1 || queue_depth > kAioMaxQueueDepth)
    throw ConfigError(strata::detail::cat("aio.queue_depth: ", queue_depth, " is outside 1..",
                                          kAioMaxQueueDepth, "; DeepSpeed's default is 8"));
  if (intra_op_parallelism < 1 || intra_op_parallelism > kAioMaxIntraOpParallelism)
    throw ConfigError(strata::detail::cat("aio.intra_op_parallelism: ", intra_op_parallelism,
                                          " is outside 1..", kAioMaxIntraOpParallelism,
                                          "; DeepSpeed's default is 1"));
  if (sqpoll && backend != Backend::io_uring && backend != Backend::auto_select)
    throw ConfigError(strata::detail::cat(
        "strata.aio.sqpoll: true needs strata.aio.backend io_uring (or auto), not ", to_string(backend)));
}

std::string AioOptions::to_config_json() const {
  nlohmann::ordered_json j;
  j["aio"]["block_size"] = block_size;
  j["aio"]["queue_depth"] = queue_depth;
  j["aio"]["intra_op_parallelism"] = intra_op_parallelism;
  j["aio"]["single_submit"] = single_submit;
  j["aio"]["overlap_events"] = overlap_events;
  j["strata"]["aio"]["backend"] = to_string(backend);
  return j.dump(2);
}

}  // namespace strata::nvme
