// Fuzzes the config parser: Config::load on the input as a ds_config.json file, then the resolved table,
// to_json() and the round trip the header promises (Config::parse(to_json()) gives the same config).
//
// Input: the config file's text. When it contains a line "--overrides--", the text after it is a JSON
// object of command-line overrides (lr, micro_batch, hidden_size, world_size, ...; config/config.h) and only
// the text before it is the file.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "config/config.h"
#include "fuzz/fuzz_util.h"

namespace {

constexpr std::string_view kTarget = "config";
constexpr std::string_view kSeparator = "\n--overrides--\n";

void run(std::string_view input) {
  std::string_view file = input, rest;
  if (std::size_t at = input.find(kSeparator); at != std::string_view::npos) {
    file = input.substr(0, at);
    rest = input.substr(at + kSeparator.size());
  }
  strata::Overrides overrides;
  if (!rest.empty()) {
    nlohmann::json o = nlohmann::json::parse(rest, nullptr, /*allow_exceptions=*/false);
    if (o.is_object())
      for (const auto& [k, v] : o.items()) overrides[k] = v;
  }
  const std::string path = strata::fuzz::write_file("ds_config.json", file.data(), file.size());
  strata::Config cfg = strata::Config::load(path, overrides, /*world_size=*/1);
  (void)cfg.resolved_table();
  for (const std::string& w : cfg.warnings()) (void)w.size();
  const nlohmann::json resolved = cfg.to_json();
  // Anything the parser accepted must parse back from its own resolved form to the same values.
  strata::Config again;
  try {
    again = strata::Config::parse(resolved, {}, cfg.world_size, "resolved");
  } catch (const strata::Error& e) {
    strata::fuzz::fail(kTarget, std::string("to_json() of an accepted config does not parse back: ") +
                                    e.what() + "\nresolved: " + resolved.dump());
  }
  if (again.to_json() != resolved)
    strata::fuzz::fail(kTarget, "to_json() does not round-trip:\nfirst:  " + resolved.dump() +
                                    "\nsecond: " + again.to_json().dump());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  strata::fuzz::expect_strata_errors(
      kTarget, [&] { run(std::string_view(reinterpret_cast<const char*>(data), size)); });
  return 0;
}
