// strata/tools/launch_plan.h: `strata launch`'s pure part — from the launcher's options and this
// machine's facts to the mpirun command line, with every error found before anything starts.
//
// Example (tools/cmd_launch.cpp):
//   LaunchOptions o;  o.num_gpus = 2;  o.command = {"train", "--config", "c.json", ...};
//   LaunchEnv env = ...;                      // environment, root?, cores, GPUs, paths (cmd_launch.cpp)
//   LaunchPlan p = plan_launch(o, env);       // throws ConfigError on a bad option
//   execv(p.argv[0], ...)  or  puts(shell_join(p.argv))  for --dry-run
//
// Note [Launch resources] (DeepSpeed's launcher/runner.py semantics):
// - The pool: the hostfile's hosts with slots 0..N-1 each (`hostname slots=N` lines), or without a
//   hostfile this machine alone as "localhost" with one slot per visible GPU (cuda; auto with a GPU) or
//   one slot (host backend; auto without a GPU).
// - --include / --exclude ("host1:0,1@host2"; a host without ":slots" means all its slots) pick from the
//   pool; they exclude each other and --num_nodes / --num_gpus. --num_nodes K keeps the first K hosts;
//   --num_gpus N gives every kept host slots 0..N-1.
// - Each host runs one rank per kept slot; its local rank i opens the device named by the i-th slot
//   (STRATA_LOCAL_DEVICES, comm/devices.h). Hosts whose slot lists differ get their own mpirun app
//   context (`: -np ...`), since the variable is set per context.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::cli {

// The options of `strata launch` as given (tools/cmd_launch.cpp declares them, with their help).
struct LaunchOptions {
  std::optional<int> num_gpus, num_nodes;  // unset: the pool's own slots / every host
  std::string include, exclude, hostfile;  // "" = not given
  std::string backend;                     // "" | auto | host | cuda; passed on to `train --backend`
  // DeepSpeed's --bind_cores_to_rank: each rank of a host bound to its own cores, the host's cores split
  // evenly among its ranks (mpirun --map-by slot:PE=n --bind-to core); the engine then runs on those
  // (zero3/engine.cpp, Note [Cores]). Off: ranks unbound (--bind-to none).
  bool bind_cores_to_rank = false;
  std::vector<std::string> command;   // the strata subcommand and its arguments, e.g. {"train", ...}
  std::vector<std::string> unparsed;  // what the option parser left over ("--" only, when well formed)
};

// Facts about this machine and process the plan depends on (filled by cmd_launch.cpp, by tests by hand).
struct LaunchEnv {
  std::vector<std::string> environ;      // "NAME=value", the launcher's environment
  bool root = false;                     // geteuid() == 0: Open MPI then needs --allow-run-as-root
  int cores = 1;                         // on this machine
  int gpus = 0;                          // CUDA devices visible here (0 without the cuda backend)
  std::string mpirun = "mpirun";         // path of Open MPI's mpirun
  std::string exe;                       // absolute path of this strata binary, run on every rank
  std::string hostname;                  // this machine's name (its hosts run "locally")
  std::vector<std::string> subcommands;  // strata's subcommands a launch may run (all but launch)
};

// One host of the pool and the device ordinals ("slots") its ranks take, in order.
struct HostSlots {
  std::string host;
  std::vector<int> slots;
  bool operator==(const HostSlots&) const = default;
};

struct LaunchPlan {
  std::vector<HostSlots> hosts;   // after --include / --exclude / --num_nodes / --num_gpus
  int world_size = 0;             // ranks in all
  std::vector<std::string> argv;  // argv[0] is env.mpirun
};

// Parses DeepSpeed's hostfile format: one `hostname slots=N` per line (N >= 1), '#' starts a comment,
// blank lines ignored. `name` (the file's path) is used in errors, which name the line. Throws
// ConfigError on a bad line, a host listed twice or no host at all.
std::vector<HostSlots> parse_hostfile(std::string_view text, const std::string& name);
// Reads and parses the file; ConfigError when it cannot be read.
std::vector<HostSlots> read_hostfile(const std::string& path);

// Applies an --include or --exclude filter ("host1:0,1@host2") to the pool (Note [Launch resources]).
// Throws ConfigError naming a host or slot the pool lacks. Hosts left with no slot are dropped.
std::vector<HostSlots> include_hosts(const std::vector<HostSlots>& pool, const std::string& spec);
std::vector<HostSlots> exclude_hosts(const std::vector<HostSlots>& pool, const std::string& spec);

// The whole plan; throws ConfigError (naming the bad value and what is allowed) before anything runs.
LaunchPlan plan_launch(const LaunchOptions& opts, const LaunchEnv& env);

// `name`'s full path from a PATH-style list of directories ("" when no executable of that name is there).
std::string find_program(const std::string& name, const std::string& path_list);

// The argv as one line a POSIX shell reads back as the same words (single quotes where needed).
std::string shell_join(const std::vector<std::string>& argv);

}  // namespace strata::cli
