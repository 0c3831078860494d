// strata/tools/launch_plan.h: `strata launch`'s pure part — from the launcher's options and this
// machine's facts to the mpirun command line, with every error found before anything starts.
//
// Example (tools/cmd_launch.cpp):
//   LaunchOptions o;  o.num_gpus = 2;  o.command = {"train", "--config", "c.json", ...};
//   LaunchEnv env = ...;                      // environment, root?, cores, GPUs, paths (cmd_launch.cpp)
//   LaunchPlan p = plan_launch(o, env);       // throws ConfigError on a bad option
//   fork + execv(p.argv[0], ...)  or  puts(shell_join(p.argv))  for --dry-run
//   ... kill(mpirun, forwarded_stop_signal(SIGTERM)) on a stop signal (Note [Launcher signals]) ...
//   return launch_exit_status(wait_status, stop);
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

#include <csignal>
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
  // (zero3/engine_plan.cpp, Note [Cores]). Off: ranks unbound (--bind-to none).
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
  std::vector<std::string> subcommands;  // strata's subcommands (all but launch), named in errors
};

// The subcommands that run as the ranks of one job. Every other subcommand works in one process, and
// under mpirun every rank would run all of it (each writing the same files, each printing the same lines),
// so the launcher refuses them, saying to run them without it.
inline constexpr std::string_view kRankSubcommands[] = {"train"};

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

// Note [Launcher signals] (tools/cmd_launch.cpp has the whole of it): the launcher passes a stop signal on
// to the ranks as one that Open MPI's mpirun forwards to every rank without ending the job (its default
// list: SIGUSR1, SIGUSR2, SIGTSTP, SIGCONT, SIGALRM, SIGABRT), and a rank's `strata train` takes that
// signal as the stop signal it stands for (Note [Stop signals] in tools/cmd_train.cpp).

// What the launcher sends mpirun for a stop signal it got: SIGUSR1 for SIGTERM, SIGUSR2 for SIGINT; 0 for
// any other signal.
constexpr int forwarded_stop_signal(int sig) {
  return sig == SIGTERM ? SIGUSR1 : sig == SIGINT ? SIGUSR2 : 0;
}
// The stop signal a rank's SIGUSR1 / SIGUSR2 stands for (SIGTERM / SIGINT); any other signal is itself.
constexpr int stop_signal_from(int sig) {
  return sig == SIGUSR1 ? SIGTERM : sig == SIGUSR2 ? SIGINT : sig;
}

// The launcher's exit status from mpirun's wait status: mpirun's own exit code (the first failing rank's,
// so 128 + S when the ranks stopped on stop signal S), or 128 + the signal that ended mpirun. `stop` is the
// stop signal the launcher passed on (0: none); a rank (or mpirun) that got the forwarded signal before it
// could take it, still starting, dies of it, and 128 + SIGUSR1 / SIGUSR2 is then reported as 128 + `stop`,
// the status of a job stopped by the user's signal.
int launch_exit_status(int wait_status, int stop);

// `name`'s full path from a PATH-style list of directories ("" when no executable of that name is there).
std::string find_program(const std::string& name, const std::string& path_list);

// The argv as one line a POSIX shell reads back as the same words (single quotes where needed).
std::string shell_join(const std::vector<std::string>& argv);

}  // namespace strata::cli
