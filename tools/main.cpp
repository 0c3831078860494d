// strata: the command users run (`strata report`, `strata nvme-tune`, `strata train`, ...).
#include <cstdio>
#include <map>

#include "comm/comm.h"
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

namespace {

// Prints the error (with the rank under mpirun) and, in a job of several ranks, ends every rank now: the
// others would otherwise wait for this one in their next collective.
int fail(int code, const char* what, const char* msg) {
  const strata::comm::RankInfo r = strata::comm::rank_from_env();
  if (r.world_size > 1) {
    std::fprintf(stderr, "strata: %s on rank %d of %d: %s\n", what, r.rank, r.world_size, msg);
    std::fflush(stderr);
    strata::comm::abort_all(code);
  }
  std::fprintf(stderr, "strata: %s: %s\n", what, msg);
  return code;
}

}  // namespace

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
    return fail(1, "error", e.what());
  } catch (const std::exception& e) {
    return fail(2, "internal error", e.what());
  }
  return 0;
}
