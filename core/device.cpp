#include "core/device.h"

#include <unistd.h>

#include "core/device_impl.h"
#include "core/error.h"
#include "core/log.h"

namespace strata {

const char* to_string(BackendKind k) {
  return k == BackendKind::cuda ? "cuda" : "host";
}

bool cuda_backend_built() {
#ifdef STRATA_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count(std::string* why) {
#ifdef STRATA_WITH_CUDA
  return detail::cuda_count(why);
#else
  if (why) *why = "cuda backend not built (configured with STRATA_CUDA=OFF or no nvcc found)";
  return 0;
#endif
}

std::unique_ptr<Device> open_device(const DeviceOptions& opts) {
  if (opts.backend == "host") return detail::make_host_device(opts);
  if (opts.backend == "cuda" || opts.backend == "auto") {
    std::string why;
    int n = cuda_device_count(&why);
    if (n > 0) {
      if (opts.ordinal < 0 || opts.ordinal >= n)
        throw ConfigError(detail::cat("strata.device: ", opts.ordinal, " is not a visible CUDA device (", n,
                                      " visible: 0..", n - 1,
                                      "); set strata.device or CUDA_VISIBLE_DEVICES"));
#ifdef STRATA_WITH_CUDA
      return detail::make_cuda_device(opts);
#endif
    }
    if (opts.backend == "cuda")
      throw BackendError(detail::cat("strata.backend: \"cuda\" was asked for but no GPU can be used (", why,
                                     "); use backend \"host\" or \"auto\" to run on the host backend"));
    STRATA_LOG_INFO("backend auto: no CUDA GPU (", why, "); using the host backend");
    return detail::make_host_device(opts);
  }
  throw ConfigError(detail::cat("strata.backend: \"", opts.backend, "\" is not one of auto, host, cuda"));
}

namespace detail {

std::string device_oom_message(const DeviceCaps& caps, std::size_t in_use, std::size_t requested,
                               const char* what, const std::string& backend_detail) {
  std::size_t free = caps.capacity > in_use ? caps.capacity - in_use : 0;
  std::string m = cat("out of device memory on ", to_string(caps.backend), ":", caps.ordinal, " (", caps.name,
                      ") allocating ", format_bytes(requested));
  if (what && *what) m += cat(" for ", what);
  m += cat(". Device capacity ", format_bytes(caps.capacity), ", in use ", format_bytes(in_use), ", free ",
           format_bytes(free), ".");
  if (!backend_detail.empty()) m += cat(" ", backend_detail, ".");
  if (caps.capacity < caps.physical_bytes)
    m += cat(" The capacity is capped by strata.device_memory_cap (physical ",
             format_bytes(caps.physical_bytes), "): raise it,");
  else
    m += " To fit,";
  m += " offload more state (zero_optimization.offload_param.device / offload_optimizer.device: cpu or "
       "nvme), or lower stage3_max_live_parameters / stage3_prefetch_bucket_size or the micro batch size.";
  return m;
}

std::size_t physical_ram_bytes() {
  long pages = ::sysconf(_SC_PHYS_PAGES);
  long page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? std::size_t(pages) * std::size_t(page) : 0;
}

}  // namespace detail
}  // namespace strata
