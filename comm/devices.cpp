// Local rank -> device ordinal (Note [STRATA_LOCAL_DEVICES] in comm/devices.h).
#include "comm/devices.h"

#include <charconv>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "core/log.h"

namespace strata::comm {

using ::strata::detail::cat;

std::vector<int> parse_device_list(std::string_view text, std::string_view source) {
  std::vector<int> out;
  std::size_t pos = 0;
  while (true) {
    const std::size_t comma = text.find(',', pos);
    const std::string_view item = text.substr(pos, comma == std::string_view::npos ? text.npos : comma - pos);
    int v = -1;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || v < 0)
      throw ConfigError(cat(source, "=\"", text, "\": \"", item,
                            "\" is not a device ordinal; expected a comma-separated list of integers >= 0, "
                            "one per rank on this machine, e.g. \"0,1\" or \"2,3\""));
    out.push_back(v);
    if (comma == std::string_view::npos) return out;
    pos = comma + 1;
  }
}

int local_device_ordinal(int base, int local_rank) {
  const char* env = std::getenv(kLocalDevicesEnv);
  if (!env || !*env) return base + local_rank;
  const std::vector<int> list = parse_device_list(env, kLocalDevicesEnv);
  if (local_rank < 0 || std::size_t(local_rank) >= list.size())
    throw ConfigError(cat(kLocalDevicesEnv, "=\"", env, "\" lists ", list.size(),
                          " device(s) but this is local rank ", local_rank,
                          ": list one ordinal per rank started on this machine (strata launch sets it "
                          "from --include / --num_gpus; unset it to use strata.device + local rank)"));
  if (base != 0)
    STRATA_WARN_ONCE("strata.device = ", base, " is ignored: ", kLocalDevicesEnv, "=\"", env,
                     "\" chooses each local rank's device");
  return list[std::size_t(local_rank)];
}

}  // namespace strata::comm
