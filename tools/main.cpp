// strata: the command users run (`strata report`, `strata nvme-tune`, `strata train`, ...).
#include <cstdio>
#include <map>

#include "core/error.h"
#include "core/log.h"
#include "tools/cli.h"

namespace strata::cli {

std::vector<Registered>& registry() {
  static std::vector<Registered> r;
  return r;
}

Command::Command(std::string name, std::string help, Setup setup) {
  registry().push_back({std::move(name), std::move(help), std::move(setup)});
}

}  // namespace strata::cli

int main(int argc, char** argv) {
  CLI::App app{
      "Strata: train models larger than GPU memory by tiering state across GPU, pinned host "
      "memory and NVMe"};
  app.require_subcommand(1);
  std::map<CLI::App*, std::function<int()>> actions;
  for (auto& c : strata::cli::registry()) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    actions[sub] = c.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, run] : actions)
      if (sub->parsed()) return run();
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "strata: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
