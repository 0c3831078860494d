// plan_launch: the mpirun command line built from the launcher's options and this machine's facts, and
// every error it reports before anything starts.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "tests/common/scratch_dir.h"
#include "tools/launch_plan.h"

namespace strata::cli {
namespace {

LaunchEnv machine(int cores = 8, int gpus = 0) {
  LaunchEnv env;
  env.environ = {"PATH=/usr/bin",          "HOME=/root", "STRATA_LOG=debug", "OMP_NUM_THREADS=2",
                 "STRATA_LOCAL_DEVICES=7", "TERM=xterm"};
  env.cores = cores;
  env.gpus = gpus;
  env.mpirun = "/usr/bin/mpirun";
  env.exe = "/opt/strata/bin/strata";
  env.hostname = "node-0.cluster";
  env.subcommands = {"config", "report", "train"};
  return env;
}

LaunchOptions train(std::vector<std::string> extra = {}) {
  LaunchOptions o;
  o.command = {"train", "--config", "c.json"};
  o.command.insert(o.command.end(), extra.begin(), extra.end());
  o.unparsed = {"--"};
  return o;
}

std::string joined(const LaunchOptions& o, const LaunchEnv& env) {
  return shell_join(plan_launch(o, env).argv);
}

std::string config_error(const LaunchOptions& o, const LaunchEnv& env) {
  try {
    plan_launch(o, env);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

constexpr const char* kForward = "-x OMP_NUM_THREADS -x PATH -x STRATA_LOG";

TEST(Plan, TwoRanksOnTheHostBackend) {
  LaunchOptions o = train();
  o.num_gpus = 2;
  o.backend = "host";
  const LaunchPlan p = plan_launch(o, machine());
  EXPECT_EQ(p.world_size, 2);
  EXPECT_EQ(shell_join(p.argv), std::string("/usr/bin/mpirun --bind-to none -np 2 -H localhost:2 "
                                            "-x STRATA_LOCAL_DEVICES=0,1 ") +
                                    kForward +
                                    " /opt/strata/bin/strata train --config c.json --backend host");
}

TEST(Plan, BindCoresToRankSplitsTheHostsCores) {
  LaunchOptions o = train();
  o.num_gpus = 2;
  o.backend = "host";
  o.bind_cores_to_rank = true;
  EXPECT_EQ(joined(o, machine(8)), std::string("/usr/bin/mpirun --map-by slot:PE=4 --bind-to core -np 2 -H "
                                               "localhost:2 -x STRATA_LOCAL_DEVICES=0,1 ") +
                                       kForward +
                                       " /opt/strata/bin/strata train --config c.json --backend host");
}

TEST(Plan, BindCoresToRankRefusesMoreRanksThanCores) {
  LaunchOptions o = train();
  o.num_gpus = 3;
  o.backend = "host";
  o.bind_cores_to_rank = true;
  const std::string e = config_error(o, machine(2));
  EXPECT_NE(e.find("--bind_cores_to_rank: 3 ranks on a host of 2 cores"), std::string::npos) << e;
}

TEST(Plan, DefaultIsOneRankOnTheHostBackend) {
  EXPECT_EQ(plan_launch(train({"--backend", "host"}), machine(8, 4)).world_size, 1);
  EXPECT_EQ(plan_launch(train(), machine(8, 0)).world_size, 1);  // auto without a GPU
}

TEST(Plan, DefaultIsEveryVisibleGpu) {
  const LaunchPlan p = plan_launch(train(), machine(8, 4));
  EXPECT_EQ(p.world_size, 4);
  EXPECT_NE(shell_join(p.argv).find("-np 4 -H localhost:4 -x STRATA_LOCAL_DEVICES=0,1,2,3 "),
            std::string::npos);
}

TEST(Plan, IncludeMapsLocalRanksToTheListedGpus) {
  LaunchOptions o = train();
  o.include = "localhost:2,3";
  o.backend = "cuda";
  EXPECT_NE(joined(o, machine(8, 4)).find("-np 2 -H localhost:2 -x STRATA_LOCAL_DEVICES=2,3 "),
            std::string::npos);
}

TEST(Plan, ExcludeOnOneMachine) {
  LaunchOptions o = train();
  o.exclude = "localhost:0";
  EXPECT_NE(joined(o, machine(8, 3)).find("-np 2 -H localhost:2 -x STRATA_LOCAL_DEVICES=1,2 "),
            std::string::npos);
}

TEST(Plan, RootAddsAllowRunAsRoot) {
  LaunchEnv env = machine();
  env.root = true;
  EXPECT_EQ(joined(train(), env).rfind("/usr/bin/mpirun --allow-run-as-root --bind-to none ", 0), 0u);
}

TEST(Plan, MoreLocalRanksThanCoresOversubscribes) {
  LaunchOptions o = train();
  o.num_gpus = 3;
  EXPECT_EQ(joined(o, machine(2)).find("--oversubscribe"), std::string("/usr/bin/mpirun ").size());
  o.num_gpus = 2;
  EXPECT_EQ(joined(o, machine(2)).find("--oversubscribe"), std::string::npos);
}

TEST(Plan, ForwardsOnlyWhatRanksNeedAndSetsTheDeviceListItself) {
  LaunchEnv env = machine();
  env.environ.push_back("LD_LIBRARY_PATH=/opt/lib");
  env.environ.push_back("NCCL_SOCKET_IFNAME=eth0");
  env.environ.push_back("OPENBLAS_NUM_THREADS=1");
  const std::string line = joined(train(), env);
  EXPECT_NE(
      line.find("-x STRATA_LOCAL_DEVICES=0 -x LD_LIBRARY_PATH -x NCCL_SOCKET_IFNAME -x OMP_NUM_THREADS -x "
                "OPENBLAS_NUM_THREADS -x PATH -x STRATA_LOG /opt"),
      std::string::npos)
      << line;
  EXPECT_EQ(line.find("HOME"), std::string::npos);
  EXPECT_EQ(line.find("STRATA_LOCAL_DEVICES=7"), std::string::npos);
}

TEST(Plan, HostfileHostsWithTheSameSlotsShareOneContext) {
  test::ScratchDir dir("tools");
  std::ofstream(dir.file("hosts")) << "node-0 slots=2\nnode-1 slots=2\nnode-2 slots=2\n";
  LaunchOptions o = train({"--backend", "cuda"});
  o.hostfile = dir.file("hosts");
  o.num_nodes = 2;
  const LaunchPlan p = plan_launch(o, machine(2));
  EXPECT_EQ(p.world_size, 4);
  const std::string line = shell_join(p.argv);
  EXPECT_NE(line.find("-np 4 -H node-0:2,node-1:2 -x STRATA_LOCAL_DEVICES=0,1 "), std::string::npos) << line;
  EXPECT_EQ(line.find("--oversubscribe"), std::string::npos)
      << line;  // node-0 (this machine) runs 2 on 2 cores
}

TEST(Plan, HostsWithDifferentSlotsGetTheirOwnContext) {
  test::ScratchDir dir("tools");
  std::ofstream(dir.file("hosts")) << "worker-1 slots=4\nworker-2 slots=4\n";
  LaunchOptions o = train();
  o.hostfile = dir.file("hosts");
  o.include = "worker-1:0,1@worker-2:2";
  const LaunchPlan p = plan_launch(o, machine());
  EXPECT_EQ(p.world_size, 3);
  const std::string tail = std::string(" ") + kForward + " /opt/strata/bin/strata train --config c.json";
  EXPECT_EQ(shell_join(p.argv),
            "/usr/bin/mpirun --bind-to none -np 2 -H worker-1:2 -x STRATA_LOCAL_DEVICES=0,1" + tail +
                " : -np 1 -H worker-2:1 -x STRATA_LOCAL_DEVICES=2" + tail);
}

TEST(Plan, NumGpusOverridesHostfileSlots) {
  test::ScratchDir dir("tools");
  std::ofstream(dir.file("hosts")) << "worker-1 slots=8\nworker-2 slots=8\n";
  LaunchOptions o = train();
  o.hostfile = dir.file("hosts");
  o.num_gpus = 2;
  EXPECT_NE(joined(o, machine()).find("-np 4 -H worker-1:2,worker-2:2 "), std::string::npos);
}

TEST(Plan, BackendGivenTwiceMustAgree) {
  LaunchOptions o = train({"--backend=host"});
  o.backend = "host";
  EXPECT_EQ(plan_launch(o, machine()).argv.back(), "--backend=host");  // not appended again
  o.backend = "cuda";
  EXPECT_NE(
      config_error(o, machine()).find("--backend cuda for the launcher but --backend host in the command"),
      std::string::npos);
}

TEST(Plan, CommandAndOptionsQuoted) {
  LaunchOptions o = train({"--set", "betas=[0.9, 0.95]", "--text", "it's.txt"});
  EXPECT_NE(joined(o, machine()).find("--set 'betas=[0.9, 0.95]' --text 'it'\\''s.txt'"), std::string::npos);
}

// Each error: the bad value and what is allowed.
struct ErrorCase {
  const char* name;
  void (*edit)(LaunchOptions&, LaunchEnv&);
  const char* message;
};

class PlanError : public testing::TestWithParam<ErrorCase> {};

TEST_P(PlanError, NamesTheValueAndWhatIsAllowed) {
  LaunchOptions o = train();
  LaunchEnv env = machine();
  GetParam().edit(o, env);
  const std::string msg = config_error(o, env);
  EXPECT_NE(msg.find(GetParam().message), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(
    Plan, PlanError,
    testing::Values(
        ErrorCase{"NumGpusZero", [](LaunchOptions& o, LaunchEnv&) { o.num_gpus = 0; },
                  "--num_gpus 0: must be at least 1"},
        ErrorCase{"NumNodesZero", [](LaunchOptions& o, LaunchEnv&) { o.num_nodes = 0; },
                  "--num_nodes 0: must be at least 1"},
        ErrorCase{"NumNodesWithoutHostfile", [](LaunchOptions& o, LaunchEnv&) { o.num_nodes = 2; },
                  "--num_nodes 2 but no --hostfile names other machines"},
        ErrorCase{"IncludeAndExclude",
                  [](LaunchOptions& o, LaunchEnv&) { o.include = "localhost:0", o.exclude = "localhost:1"; },
                  "--include and --exclude exclude each other"},
        ErrorCase{"NumGpusAndInclude",
                  [](LaunchOptions& o, LaunchEnv&) { o.include = "localhost:0", o.num_gpus = 1; },
                  "--num_gpus and --include exclude each other"},
        ErrorCase{"IncludeMissingSlot", [](LaunchOptions& o, LaunchEnv&) { o.include = "localhost:0,1"; },
                  "host \"localhost\" has no slot 1; its slots are 0"},
        ErrorCase{"IncludeBadSyntax", [](LaunchOptions& o, LaunchEnv&) { o.include = "localhost:zero"; },
                  "slot \"zero\" of host \"localhost\" is not an integer >= 0"},
        ErrorCase{"ExcludeEverything", [](LaunchOptions& o, LaunchEnv&) { o.exclude = "localhost"; },
                  "--exclude localhost leaves no slot to run on"},
        ErrorCase{"HostfileMissing", [](LaunchOptions& o, LaunchEnv&) { o.hostfile = "/nonexistent/hosts"; },
                  "--hostfile /nonexistent/hosts: cannot read it"},
        ErrorCase{"NoCommand", [](LaunchOptions& o, LaunchEnv&) { o.command.clear(); },
                  "no command to run after the launcher's options"},
        ErrorCase{"LeftoverOption", [](LaunchOptions& o, LaunchEnv&) { o.unparsed = {"--num-gpus"}; },
                  "\"--num-gpus\" is not an option of strata launch"},
        ErrorCase{"NotASubcommand",
                  [](LaunchOptions& o, LaunchEnv&) {
                    o.command = {"python", "train.py"};
                  },
                  "\"python\" is not a strata subcommand (config, report, train); the launcher starts "
                  "`strata train ...` on every rank"},
        ErrorCase{"LaunchItself", [](LaunchOptions& o, LaunchEnv&) { o.command = {"launch"}; },
                  "strata launch cannot be the command its ranks run"},
        // Single-process subcommands: every rank would run all of it (the same files, the same output).
        ErrorCase{"SingleProcessCommand",
                  [](LaunchOptions& o, LaunchEnv&) {
                    o.command = {"report", "--json", "r.json"};
                  },
                  "`strata report` runs in one process, so the launcher does not start it on every rank"},
        ErrorCase{"SingleProcessCommandSaysWhatToRun",
                  [](LaunchOptions& o, LaunchEnv& e) {
                    e.subcommands.push_back("export");
                    o.command = {"export", "ckpt", "my model"};
                  },
                  "run it without the launcher: strata export ckpt 'my model'"},
        ErrorCase{"BadBackend", [](LaunchOptions& o, LaunchEnv&) { o.backend = "rocm"; },
                  "--backend rocm: expected auto, host or cuda"},
        ErrorCase{"CudaWithoutGpus", [](LaunchOptions& o, LaunchEnv&) { o.backend = "cuda"; },
                  "--backend cuda, but no CUDA GPU is visible on this machine"},
        ErrorCase{"MoreGpusThanVisible", [](LaunchOptions& o, LaunchEnv& e) { o.num_gpus = 3, e.gpus = 2; },
                  "--num_gpus 3 but 2 GPU(s) are visible on this machine"}),
    [](const testing::TestParamInfo<ErrorCase>& i) { return std::string(i.param.name); });

// Note [Launcher signals]: a stop signal goes to the ranks as one mpirun forwards, and comes back as itself.
TEST(LaunchSignals, StopSignalsRoundTrip) {
  for (int sig : {SIGINT, SIGTERM}) {
    const int forwarded = forwarded_stop_signal(sig);
    EXPECT_TRUE(forwarded == SIGUSR1 || forwarded == SIGUSR2) << sig;
    EXPECT_EQ(stop_signal_from(forwarded), sig);
  }
  EXPECT_NE(forwarded_stop_signal(SIGINT), forwarded_stop_signal(SIGTERM));
  EXPECT_EQ(forwarded_stop_signal(SIGHUP), 0);
  EXPECT_EQ(stop_signal_from(SIGTERM), SIGTERM);
}

TEST(LaunchSignals, ExitStatusIsTheJobs) {
  EXPECT_EQ(launch_exit_status(W_EXITCODE(0, 0), 0), 0);
  EXPECT_EQ(launch_exit_status(W_EXITCODE(1, 0), 0), 1);            // a rank's error
  EXPECT_EQ(launch_exit_status(W_EXITCODE(143, 0), SIGTERM), 143);  // the ranks stopped and saved
  EXPECT_EQ(launch_exit_status(W_EXITCODE(130, 0), SIGINT), 130);
  EXPECT_EQ(launch_exit_status(W_EXITCODE(1, 0), SIGTERM), 1);              // a failed save stays a failure
  EXPECT_EQ(launch_exit_status(W_EXITCODE(0, SIGKILL), 0), 128 + SIGKILL);  // mpirun killed
  // A rank (or mpirun) still starting dies of the forwarded signal: the user's signal is reported.
  EXPECT_EQ(launch_exit_status(W_EXITCODE(128 + SIGUSR1, 0), SIGTERM), 128 + SIGTERM);
  EXPECT_EQ(launch_exit_status(W_EXITCODE(0, SIGUSR2), SIGINT), 128 + SIGINT);
  EXPECT_EQ(launch_exit_status(W_EXITCODE(128 + SIGUSR1, 0), 0), 128 + SIGUSR1);  // not ours: as it is
}

TEST(FindProgram, SearchesThePathInOrder) {
  test::ScratchDir dir("tools");
  std::ofstream(dir.file("tool")) << "#!/bin/sh\n";
  EXPECT_EQ(find_program("tool", "/nonexistent:" + dir.path()), "");  // not executable
  std::filesystem::permissions(dir.file("tool"), std::filesystem::perms::owner_exec,
                               std::filesystem::perm_options::add);
  EXPECT_EQ(find_program("tool", "/nonexistent:" + dir.path()), dir.file("tool"));
  EXPECT_EQ(find_program("no-such-tool", dir.path()), "");
}

}  // namespace
}  // namespace strata::cli
