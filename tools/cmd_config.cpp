// `strata config FILE [--set name=value ...] [--world-size N]`: loads a DeepSpeed-style config the way
// training would, and prints every key's resolved value and where it came from (file, default, auto,
// alias). A bad config fails here with the same message training would give, before any work starts.
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "core/error.h"
#include "session/session.h"
#include "tools/cli.h"
#include "zero3/placement.h"

namespace strata::cli {
namespace {

struct ConfigOpts {
  std::string path;
  std::vector<std::string> sets;
  int world_size = 1;
  std::int64_t steps = -1;  // -1: the run's length is not given (it comes at training)
};

int run_config(const ConfigOpts& opts) {
  RunFacts run;
  if (opts.steps >= 0)
    run = {.total_steps = opts.steps, .from = detail::cat("--steps ", opts.steps)};
  else
    run.length_later = true;
  Config cfg = Config::load(opts.path, session::parse_sets(opts.sets), opts.world_size, run);
  std::fputs(cfg.resolved_table().c_str(), stdout);
  // Note [Loud auto] in config/config.cpp: the values chosen for the user, as strata train prints them.
  const std::vector<std::string> chosen = cfg.auto_report();
  if (!chosen.empty()) {
    std::printf("\nvalues chosen for \"auto\" (and left to the run):\n");
    for (const std::string& line : chosen) std::printf("  %s\n", line.c_str());
  }
  // How each chunk is updated as far as the config decides it (Note [Update routes] in
  // zero3/placement.cpp); strata train prints each chunk's, with the model and the device's room.
  std::printf(
      "\nupdate routes (docs/train.md, \"How each chunk is updated\"; strata train prints each chunk's):\n");
  for (const auto& [backend, by_ops] : {std::pair{"cuda", true}, std::pair{"host", false}})
    for (const zero3::ConfigRoute& r : zero3::config_routes(cfg, by_ops))
      std::printf("  %s, %s: %s\n", backend, r.which.c_str(), zero3::describe(r.route).c_str());
  std::printf(
      "  (gradients are summed on the device where the plan leaves room for an accumulator; the overlap with "
      "backward is decided with the host memory: strata.overlap_optimizer)\n");
  return 0;
}

Command config("config", "Check a DeepSpeed-style config and print every resolved value and its source",
               [](CLI::App& sub) {
                 auto o = std::make_shared<ConfigOpts>();
                 sub.add_option("file", o->path, "ds_config.json")->required();
                 sub.add_option("--set", o->sets, "Resolve an \"auto\" value or override: name=value");
                 sub.add_option("--world-size", o->world_size, "Ranks in the job (for batch-size inference)");
                 sub.add_option("--steps", o->steps,
                                "The run's optimizer steps, for a schedule whose total is \"auto\" (default: "
                                "left to strata train)")
                     ->check(CLI::NonNegativeNumber);
                 return [o] { return run_config(*o); };
               });

}  // namespace
}  // namespace strata::cli
