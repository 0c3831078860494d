// strata/comm/devices.h: which device ordinal each rank on a machine takes.
//
// Example (zero3's device options, at local rank r):
//   DeviceOptions d;
//   d.ordinal = comm::local_device_ordinal(int(cfg.strata.device), comm::rank_from_env().local_rank);
//
// Note [STRATA_LOCAL_DEVICES]:
// `strata launch` maps local ranks to GPUs through STRATA_LOCAL_DEVICES, a comma-separated list of device
// ordinals, one per rank on the machine ("2,3": local rank 0 opens GPU 2, local rank 1 GPU 3). It does
// not narrow CUDA_VISIBLE_DEVICES, as DeepSpeed's docs warn against: every rank keeps seeing every GPU,
// so peer access and NCCL's topology detection work as they would without the launcher. The ordinals
// count within whatever CUDA_VISIBLE_DEVICES the user set. Unset or empty: local rank r opens
// strata.device + r (what plain `mpirun -np N strata train` gives). A list may name one ordinal twice
// (two ranks sharing a GPU).
// The price of every GPU staying visible: CUDA's current device is per thread and starts at 0, so any
// thread of a rank that calls CUDA without choosing its device works on, and makes a context (memory)
// on, GPU 0 — another rank's GPU. Hence the rule of Note [thread device] in core/device.h: a rank uses
// the one device it opened, and every thread that touches it calls Device::bind_thread() first (the
// device's own stream workers, the tier manager's movers and the trace writer do; the cuda backend's
// entry points also make the device current, and give a thread back only a context it already had).
// Narrowing CUDA_VISIBLE_DEVICES per rank would make such a mistake harmless (ordinal 0 would then be the
// rank's own GPU) but lose what the paragraph above keeps (peer access, NCCL's topology detection), so
// the launcher keeps every GPU visible and the runtime keeps the rule.
#pragma once

#include <string_view>
#include <vector>

namespace strata::comm {

inline constexpr const char* kLocalDevicesEnv = "STRATA_LOCAL_DEVICES";

// "0,1,3" -> {0, 1, 3}. Throws ConfigError naming the bad entry (empty, not a number, negative) and
// the expected form; `source` names where the text came from ("STRATA_LOCAL_DEVICES", "--include").
std::vector<int> parse_device_list(std::string_view text, std::string_view source);

// The device ordinal for `local_rank`: the local_rank-th entry of STRATA_LOCAL_DEVICES when that is set,
// otherwise base + local_rank. Throws ConfigError when the list is malformed or has fewer entries than
// local_rank + 1.
int local_device_ordinal(int base, int local_rank);

}  // namespace strata::comm
