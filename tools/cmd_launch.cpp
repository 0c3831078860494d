// `strata launch`: starts the ranks of a training run through Open MPI's mpirun, with DeepSpeed's
// launcher options (Note [Launch resources] in tools/launch_plan.h).
//
//   strata launch --num_gpus 2 -- train --config ds.json --model 10m --text book.txt --steps 100
//   strata launch --include localhost:2,3 -- train ...                 (ranks on GPUs 2 and 3)
//   strata launch --hostfile hosts --num_nodes 2 -- train ...          (two machines, all their slots)
//   strata launch --num_gpus 4 --dry-run -- train ...                  (print the mpirun command only)
//
// Every option and the command are checked before mpirun starts; then this process starts mpirun, passes
// a stop signal on to every rank (Note [Launcher signals]) and exits with the job's status.
//
// Only `strata train` runs as ranks; the other subcommands work in one process and are refused with the
// command line to run instead (kRankSubcommands in tools/launch_plan.h).
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
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

// Note [Launcher signals]: a SIGINT (Ctrl-C) or SIGTERM to the launcher must reach every rank as the stop
// request of Note [Stop signals] (tools/cmd_train.cpp: finish the step, save, exit 130 / 143), however long
// a step takes. Open MPI's mpirun cannot be that channel as it is: on SIGINT / SIGTERM it kills the ranks
// (SIGTERM, then SIGKILL within seconds), and it puts each rank in a process group of its own, so a
// terminal's Ctrl-C reaches mpirun alone. What it does pass on to every rank, the remote ones included,
// without ending the job is SIGUSR1 / SIGUSR2 (its default forwarded signals; checked with Open MPI 4.1).
// So the launcher does not become mpirun; it:
// - starts mpirun as its child in a process group of its own, so Ctrl-C at a terminal (SIGINT to the
//   foreground group) reaches the launcher only. mpirun's stdin is /dev/null (a process outside the
//   terminal's foreground group that read it would be stopped; no rank reads stdin). mpirun gets SIGTERM
//   when the launcher dies (PR_SET_PDEATHSIG), so a SIGKILL to the launcher or a closed terminal still ends
//   the job;
// - on the first SIGINT / SIGTERM sends mpirun SIGUSR2 / SIGUSR1 (forwarded_stop_signal), which each rank's
//   `strata train` takes as SIGINT / SIGTERM (stop_signal_from), and keeps waiting, for as long as the step
//   and the save take;
// - on a second signal sends mpirun SIGTERM: the job ends at once (mpirun kills the ranks, each of which
//   already counts it as its second signal), with exit status 128 + that signal;
// - exits with mpirun's status (launch_exit_status): 143 / 130 when the ranks stopped on the signal, a
//   rank's error status otherwise.
// The signals are caught by handlers that write their number to a pipe the launcher reads (self-pipe):
// a handler works whichever thread the signal lands on (the CUDA driver may have started threads, which a
// signal mask set here would not cover), and SIGCHLD, caught the same way, says when mpirun has ended.
int g_signal_pipe = -1;  // write end; set before the handlers are installed

extern "C" void on_launcher_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe, &b, 1);  // non-blocking: a full pipe drops it
  errno = saved;
}

// Installs on_launcher_signal for SIGINT, SIGTERM and SIGCHLD and the pipe it writes to, for the lifetime
// of the object.
class LauncherSignals {
 public:
  LauncherSignals() {
    STRATA_SYS_CHECK(::pipe2(fds_, O_CLOEXEC) == 0, "pipe2");
    STRATA_SYS_CHECK(::fcntl(fds_[1], F_SETFL, O_NONBLOCK) == 0, "fcntl O_NONBLOCK");
    g_signal_pipe = fds_[1];
    struct sigaction sa = {};
    sa.sa_handler = on_launcher_signal;
    sigfillset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    for (std::size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &sa, &old_[i]);
  }
  ~LauncherSignals() {
    for (std::size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
    g_signal_pipe = -1;
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  LauncherSignals(const LauncherSignals&) = delete;
  LauncherSignals& operator=(const LauncherSignals&) = delete;

  // The next signal caught (blocks until one is).
  int next() {
    unsigned char b = 0;
    while (true) {
      const ssize_t n = ::read(fds_[0], &b, 1);
      if (n == 1) return b;
      STRATA_SYS_CHECK(n < 0 && errno == EINTR, "read the launcher's signal pipe");
    }
  }
  // In the child between fork and exec: the default actions back (only async-signal-safe calls).
  void reset_in_child() const {
    struct sigaction sa = {};
    sa.sa_handler = SIG_DFL;
    for (int sig : kSignals) ::sigaction(sig, &sa, nullptr);
  }

 private:
  static constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGCHLD};
  int fds_[2] = {-1, -1};
  struct sigaction old_[3] = {};
};

// Starts mpirun (Note [Launcher signals]), passes stop signals on and returns the launch's exit status.
int run_mpirun(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& s : args) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  LauncherSignals signals;
  // exec's failure comes back through this pipe (closed unwritten by a successful exec).
  int exec_err[2];
  STRATA_SYS_CHECK(::pipe2(exec_err, O_CLOEXEC) == 0, "pipe2");
  // Blocked across fork, so that no handler runs in the child before it resets them.
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {  // the child: async-signal-safe calls only
    signals.reset_in_child();
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(128 + SIGTERM);  // the launcher died before prctl
    const int null = ::open("/dev/null", O_RDONLY);
    if (null > STDIN_FILENO) ::dup2(null, STDIN_FILENO), ::close(null);
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    ::execv(argv[0], argv.data());
    const int err = errno;
    [[maybe_unused]] const ssize_t n = ::write(exec_err[1], &err, sizeof err);
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ::close(exec_err[1]);
  if (pid < 0) {
    ::close(exec_err[0]);
    throw BackendError(cat("could not start ", args[0], ": fork: ", detail::errno_text(fork_errno)));
  }
  ::setpgid(pid, pid);  // as the child does: whichever runs first (an error once it has exec'd is harmless)
  int err = 0;
  ssize_t n;
  while ((n = ::read(exec_err[0], &err, sizeof err)) < 0 && errno == EINTR) {
  }
  ::close(exec_err[0]);
  if (n == ssize_t(sizeof err)) {
    ::waitpid(pid, nullptr, 0);
    throw BackendError(cat("could not start ", args[0], ": ", detail::errno_text(err)));
  }

  int stop = 0, hard_stop = 0, status = 0;
  while (true) {
    const int sig = signals.next();
    if (sig == SIGCHLD) {
      const pid_t r = ::waitpid(pid, &status, WNOHANG);
      STRATA_SYS_CHECK(r >= 0, "waitpid mpirun");
      if (r == pid) break;
      continue;
    }
    const char* name = sig == SIGINT ? "SIGINT" : "SIGTERM";
    if (stop == 0) {
      stop = sig;
      STRATA_LOG_WARN("launch: ", name,
                      ": every rank finishes its step, saves its checkpoint (with --save) "
                      "and stops; a second signal ends the job at once");
      ::kill(pid, forwarded_stop_signal(sig));
    } else {
      hard_stop = sig;
      STRATA_LOG_WARN("launch: ", name, " again: ending the job now");
      ::kill(pid, SIGTERM);
    }
  }
  return hard_stop != 0 ? 128 + hard_stop : launch_exit_status(status, stop);
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
  return run_mpirun(plan.argv);
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
                     "What every rank runs, after \"--\": train and its arguments (the other subcommands "
                     "work in one process: run them without the launcher)");
      // What follows "--" is the command; anything else left over is reported by plan_launch.
      sub.allow_extras();
      return [a, &sub] { return run_launch(*a, sub.remaining()); };
    });

}  // namespace
}  // namespace strata::cli
