// `strata launch`: starts the ranks of a training run through Open MPI's mpirun, with DeepSpeed's
// launcher options (Note [Launch resources] in tools/launch_plan.h).
//
//   strata launch --num_gpus 2 -- train --config ds.json --model 10m --text book.txt --steps 100
//   strata launch --include localhost:2,3 -- train ...                 (ranks on GPUs 2 and 3)
//   strata launch --hostfile hosts --num_nodes 2 -- train ...          (two machines, all their slots)
//   strata launch --num_gpus 4 --dry-run -- train ...                  (print the mpirun command only)
//
// Every option and the command are checked before mpirun starts; then this process becomes mpirun
// (execv), so signals reach it and its exit status is the launch's.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "tools/cli.h"
#include "tools/launch_plan.h"

extern char** environ;

namespace strata::cli {
namespace {

using detail::cat;

struct LaunchArgs {
  LaunchOptions opts;
  int num_gpus = 0, num_nodes = 0;
  std::string master_addr;
  int master_port = 0;
  bool dry_run = false;
  CLI::Option *num_gpus_opt = nullptr, *num_nodes_opt = nullptr;
};

LaunchEnv this_machine() {
  LaunchEnv env;
  for (char** e = environ; e && *e; ++e) env.environ.emplace_back(*e);
  env.root = ::geteuid() == 0;
  env.cores = int(std::max(1u, std::thread::hardware_concurrency()));
  env.gpus = cuda_device_count();
  const char* path = std::getenv("PATH");
  env.mpirun = find_program("mpirun", path ? path : "");
  if (env.mpirun.empty())
    throw ConfigError(
        cat("mpirun is not on PATH (", path ? path : "unset",
            "): strata launch starts the ranks with Open MPI's mpirun; install it (Debian/Ubuntu: "
            "apt-get install openmpi-bin) or add its bin/ folder to PATH"));
  // The binary's own path (the same on every host, as mpirun requires); /proc/self/exe itself would name
  // mpirun in the ranks mpirun forks.
  char exe[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  STRATA_SYS_CHECK(n > 0, "readlink /proc/self/exe");
  env.exe.assign(exe, std::size_t(n));
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) == 0) env.hostname = host;
  for (const Registered& r : registry())
    if (r.name != "launch") env.subcommands.push_back(r.name);
  return env;
}

int run_launch(LaunchArgs& a, const std::vector<std::string>& unparsed) {
  LaunchOptions o = a.opts;
  if (a.num_gpus_opt->count()) o.num_gpus = a.num_gpus;
  if (a.num_nodes_opt->count()) o.num_nodes = a.num_nodes;
  o.unparsed = unparsed;
  const LaunchPlan plan = plan_launch(o, this_machine());
  const std::string line = shell_join(plan.argv);
  if (a.dry_run) {
    std::printf("%s\n", line.c_str());
    return 0;
  }
  STRATA_LOG_INFO("launch: ", plan.world_size, " rank(s) on ", plan.hosts.size(), " host(s): ", line);
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<char*> argv;
  for (const std::string& s : plan.argv) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  ::execv(argv[0], argv.data());
  throw BackendError(cat("could not start ", plan.argv[0], ": ", detail::errno_text(errno)));
}

Command launch(
    "launch",
    "Start a multi-rank run through mpirun with DeepSpeed's launcher options: strata launch [options] -- "
    "train ...",
    [](CLI::App& sub) {
      auto a = std::make_shared<LaunchArgs>();
      a->num_gpus_opt =
          sub.add_option("--num_gpus,--num_accelerators", a->num_gpus,
                         "Ranks per node, on GPUs 0..N-1 (default: every GPU visible here on cuda, "
                         "1 on the host backend, or the hostfile's slots)");
      a->num_nodes_opt =
          sub.add_option("--num_nodes", a->num_nodes, "Use the first K hosts of the hostfile (default: all)");
      sub.add_option("--include", a->opts.include,
                     "Only these hosts / slots: host[:slot,...] items joined by '@', e.g. localhost:0,1 or "
                     "\"worker-1:0,1@worker-2\" (slots are GPU ordinals)");
      sub.add_option("--exclude", a->opts.exclude,
                     "Leave out these hosts / slots (same syntax as --include)");
      sub.add_option("--hostfile", a->opts.hostfile,
                     "`hostname slots=N` lines ('#' comments); default: this machine only");
      sub.add_option("--backend", a->opts.backend,
                     "auto, host or cuda: passed on to `strata train --backend`");
      sub.add_option("--master_addr", a->master_addr,
                     "Accepted for DeepSpeed compatibility and ignored: MPI finds its peers itself");
      sub.add_option("--master_port", a->master_port,
                     "Accepted for DeepSpeed compatibility and ignored: MPI finds its peers itself");
      sub.add_flag("--bind_cores_to_rank", a->opts.bind_cores_to_rank,
                   "Bind each rank to its own cores, this host's cores split evenly among its ranks "
                   "(DeepSpeed's flag); strata.cpu_optim.cores then splits a rank's cores");
      sub.add_flag("--dry-run", a->dry_run, "Print the mpirun command line instead of running it");
      sub.add_option("command", a->opts.command,
                     "The strata subcommand every rank runs and its arguments, after \"--\"");
      // What follows "--" is the command; anything else left over is reported by plan_launch.
      sub.allow_extras();
      return [a, &sub] { return run_launch(*a, sub.remaining()); };
    });

}  // namespace
}  // namespace strata::cli
