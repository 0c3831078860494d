// `strata launch`'s plan: pool, filters, ranks per host, the mpirun argv (Note [Launch resources] in
// tools/launch_plan.h).
#include "tools/launch_plan.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <fstream>
#include <set>
#include <sstream>

#include "comm/devices.h"
#include "core/error.h"

namespace strata::cli {
namespace {

using detail::cat;

constexpr const char* kUsage = "strata launch [options] -- train --config ds.json ...";

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return "";
  return std::string(s.substr(b, s.find_last_not_of(" \t\r") - b + 1));
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (true) {
    const std::size_t at = s.find(sep, pos);
    out.emplace_back(s.substr(pos, at == std::string_view::npos ? s.npos : at - pos));
    if (at == std::string_view::npos) return out;
    pos = at + 1;
  }
}

// A non-negative decimal integer, or -1.
long parse_count(std::string_view s) {
  long v = -1;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < 0) return -1;
  return v;
}

std::vector<int> range(int n) {
  std::vector<int> r(std::size_t(std::max(n, 0)));
  for (int i = 0; i < n; ++i) r[std::size_t(i)] = i;
  return r;
}

std::string join_ints(const std::vector<int>& v, const char* sep = ",") {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += sep;
    s += std::to_string(v[i]);
  }
  return s;
}

std::string describe_pool(const std::vector<HostSlots>& pool) {
  std::string s;
  for (const HostSlots& h : pool)
    s += cat(s.empty() ? "" : ", ", h.host, " (slots ", join_ints(h.slots), ")");
  return s;
}

// One "host[:slots]" item of an --include / --exclude list, checked against the pool.
struct FilterItem {
  std::string host;
  std::vector<int> slots;  // empty: every slot of the host
};

std::vector<FilterItem> parse_filter(const std::vector<HostSlots>& pool, const std::string& spec,
                                     const char* option) {
  const std::string form = cat(" (expected host[:slot,slot...] items separated by '@', e.g. --", option,
                               " localhost:0,1 or --", option, " \"worker-1:0,1@worker-2\")");
  if (trim(spec).empty()) throw ConfigError(cat("--", option, " \"", spec, "\" names no host", form));
  std::vector<FilterItem> out;
  for (const std::string& item : split(spec, '@')) {
    const auto colon = item.find(':');
    FilterItem f{item.substr(0, colon), {}};
    if (f.host.empty())
      throw ConfigError(cat("--", option, " \"", spec, "\": \"", item, "\" has no host name", form));
    const auto it =
        std::find_if(pool.begin(), pool.end(), [&](const HostSlots& h) { return h.host == f.host; });
    if (it == pool.end())
      throw ConfigError(cat("--", option, " \"", spec, "\": host \"", f.host,
                            "\" is not in the pool; the hosts are ", describe_pool(pool),
                            pool.size() == 1 && pool[0].host == "localhost"
                                ? " (without --hostfile this machine is \"localhost\")"
                                : ""));
    if (colon != std::string::npos) {
      for (const std::string& s : split(std::string_view(item).substr(colon + 1), ',')) {
        const long v = parse_count(s);
        if (v < 0)
          throw ConfigError(cat("--", option, " \"", spec, "\": slot \"", s, "\" of host \"", f.host,
                                "\" is not an integer >= 0", form));
        if (std::find(it->slots.begin(), it->slots.end(), int(v)) == it->slots.end())
          throw ConfigError(cat("--", option, " \"", spec, "\": host \"", f.host, "\" has no slot ", v,
                                "; its slots are ", join_ints(it->slots),
                                it->host == "localhost"
                                    ? " (one per visible GPU on cuda, one on the host backend; "
                                      "a hostfile line `localhost slots=N` gives N)"
                                    : ""));
        f.slots.push_back(int(v));
      }
    }
    out.push_back(std::move(f));
  }
  return out;
}

// Drops hosts without slots, sorts and dedupes each host's slots (pool order kept).
std::vector<HostSlots> tidy(std::vector<HostSlots> hosts) {
  std::vector<HostSlots> out;
  for (HostSlots& h : hosts) {
    std::sort(h.slots.begin(), h.slots.end());
    h.slots.erase(std::unique(h.slots.begin(), h.slots.end()), h.slots.end());
    if (!h.slots.empty()) out.push_back(std::move(h));
  }
  return out;
}

bool is_local(const std::string& host, const std::string& hostname) {
  if (host == "localhost" || host == "127.0.0.1" || host == "::1" || host == hostname) return true;
  const auto shorter = [](const std::string& h) { return h.substr(0, h.find('.')); };
  return !hostname.empty() && shorter(host) == shorter(hostname);
}

// Variables every rank needs from the launcher's environment (mpirun gives remote ranks only what -x
// names): Strata's own, the library search paths, thread counts of the BLAS / OpenMP runtimes, NCCL's.
bool forwarded(const std::string& name) {
  if (name == comm::kLocalDevicesEnv) return false;  // set per app context
  if (name == "PATH" || name == "LD_LIBRARY_PATH") return true;
  for (const char* prefix : {"STRATA_", "OMP_", "OPENBLAS_", "MKL_", "NCCL_"})
    if (name.starts_with(prefix)) return true;
  return false;
}

// The value of `--backend` in the command ("" when absent).
std::string command_backend(const std::vector<std::string>& cmd) {
  std::string b;
  for (std::size_t i = 1; i < cmd.size(); ++i) {
    if (cmd[i] == "--backend" && i + 1 < cmd.size()) b = cmd[i + 1];
    if (cmd[i].starts_with("--backend=")) b = cmd[i].substr(10);
  }
  return b;
}

void check_command(const LaunchOptions& o, const LaunchEnv& env) {
  for (const std::string& u : o.unparsed)
    if (u != "--")
      throw ConfigError(cat("\"", u,
                            "\" is not an option of strata launch (strata launch --help lists them); put the "
                            "command every rank runs after \"--\": ",
                            kUsage));
  if (o.command.empty()) throw ConfigError(cat("no command to run after the launcher's options: ", kUsage));
  const std::string& sub = o.command[0];
  if (sub == "launch") throw ConfigError(cat("strata launch cannot be the command its ranks run: ", kUsage));
  if (std::find(std::begin(kRankSubcommands), std::end(kRankSubcommands), sub) != std::end(kRankSubcommands))
    return;
  const auto& subs = env.subcommands;
  if (std::find(subs.begin(), subs.end(), sub) != subs.end())
    throw ConfigError(cat("`strata ", sub,
                          "` runs in one process, so the launcher does not start it on every rank (each rank "
                          "would run all of it, writing the same files and printing the same lines); run it "
                          "without the launcher: strata ",
                          shell_join(o.command)));
  std::string names;
  for (const std::string& s : subs) names += cat(names.empty() ? "" : ", ", s);
  throw ConfigError(cat("\"", sub, "\" is not a strata subcommand",
                        names.empty() ? "" : cat(" (", names, ")"),
                        "; the launcher starts `strata train ...` on every rank: ", kUsage));
}

}  // namespace

std::vector<HostSlots> parse_hostfile(std::string_view text, const std::string& name) {
  std::vector<HostSlots> hosts;
  int line_no = 0;
  for (const std::string& raw : split(text, '\n')) {
    ++line_no;
    const std::string line = trim(std::string_view(raw).substr(0, raw.find('#')));
    if (line.empty()) continue;
    std::istringstream in(line);
    std::string host, slots, extra;
    in >> host >> slots >> extra;
    const long n = slots.starts_with("slots=") ? parse_count(std::string_view(slots).substr(6)) : -1;
    if (n < 1 || n > 1 << 20 || !extra.empty())
      throw ConfigError(
          cat("hostfile ", name, " line ", line_no, ": \"", line,
              "\" is not `hostname slots=N` with N >= 1 (DeepSpeed's format; '#' starts a comment)"));
    if (std::any_of(hosts.begin(), hosts.end(), [&](const HostSlots& h) { return h.host == host; }))
      throw ConfigError(cat("hostfile ", name, " line ", line_no, ": host \"", host,
                            "\" is listed twice; give each host one line with its total slots"));
    hosts.push_back({host, range(int(n))});
  }
  if (hosts.empty())
    throw ConfigError(
        cat("hostfile ", name, " lists no host; expected `hostname slots=N` lines, e.g. `worker-1 slots=8`"));
  return hosts;
}

std::vector<HostSlots> read_hostfile(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw ConfigError(
        cat("--hostfile ", path, ": cannot read it (", detail::errno_text(errno),
            "); give a file of `hostname slots=N` lines, or leave --hostfile out to run on this machine"));
  std::ostringstream text;
  text << in.rdbuf();
  return parse_hostfile(text.str(), path);
}

std::vector<HostSlots> include_hosts(const std::vector<HostSlots>& pool, const std::string& spec) {
  const std::vector<FilterItem> items = parse_filter(pool, spec, "include");
  std::vector<HostSlots> out;
  for (const HostSlots& h : pool) {  // pool order, later items for one host win (DeepSpeed's behaviour)
    HostSlots kept{h.host, {}};
    for (const FilterItem& f : items)
      if (f.host == h.host) kept.slots = f.slots.empty() ? h.slots : f.slots;
    out.push_back(std::move(kept));
  }
  return tidy(std::move(out));
}

std::vector<HostSlots> exclude_hosts(const std::vector<HostSlots>& pool, const std::string& spec) {
  const std::vector<FilterItem> items = parse_filter(pool, spec, "exclude");
  std::vector<HostSlots> out = pool;
  for (HostSlots& h : out)
    for (const FilterItem& f : items) {
      if (f.host != h.host) continue;
      if (f.slots.empty()) h.slots.clear();
      for (int s : f.slots) h.slots.erase(std::remove(h.slots.begin(), h.slots.end(), s), h.slots.end());
    }
  return tidy(std::move(out));
}

LaunchPlan plan_launch(const LaunchOptions& o, const LaunchEnv& env) {
  check_command(o, env);
  if (o.num_gpus && *o.num_gpus < 1)
    throw ConfigError(cat("--num_gpus ", *o.num_gpus, ": must be at least 1 (ranks per node)"));
  if (o.num_nodes && *o.num_nodes < 1)
    throw ConfigError(cat("--num_nodes ", *o.num_nodes, ": must be at least 1"));
  if (!o.include.empty() && !o.exclude.empty())
    throw ConfigError("--include and --exclude exclude each other: give one of them");
  if ((o.num_gpus || o.num_nodes) && (!o.include.empty() || !o.exclude.empty()))
    throw ConfigError(
        cat(o.num_gpus ? "--num_gpus" : "--num_nodes", " and --", o.include.empty() ? "exclude" : "include",
            " exclude each other (as in DeepSpeed): pick the slots with --include / --exclude or "
            "count them with --num_nodes / --num_gpus"));

  // The backend decides the default slots on this machine; --backend is passed on to train.
  std::vector<std::string> command = o.command;
  const std::string in_command = command_backend(command);
  for (const std::string& v : {o.backend, in_command})
    if (!v.empty() && v != "auto" && v != "host" && v != "cuda")
      throw ConfigError(cat("--backend ", v, ": expected auto, host or cuda"));
  if (!o.backend.empty()) {
    if (!in_command.empty() && in_command != o.backend)
      throw ConfigError(cat("--backend ", o.backend, " for the launcher but --backend ", in_command,
                            " in the command; give it once"));
    if (in_command.empty()) command.insert(command.end(), {"--backend", o.backend});
  }
  const std::string backend = !o.backend.empty() ? o.backend : !in_command.empty() ? in_command : "auto";
  const bool gpus_here = backend == "cuda" || (backend == "auto" && env.gpus > 0);

  std::vector<HostSlots> pool;
  if (!o.hostfile.empty()) {
    pool = read_hostfile(o.hostfile);
  } else {
    if (o.num_nodes && *o.num_nodes > 1)
      throw ConfigError(
          cat("--num_nodes ", *o.num_nodes,
              " but no --hostfile names other machines; give a hostfile of `hostname slots=N` lines"));
    if (backend == "cuda" && env.gpus == 0 && !o.num_gpus)
      throw ConfigError(
          "--backend cuda, but no CUDA GPU is visible on this machine (`strata report` says why); "
          "use --backend host, or give --num_gpus N");
    pool = {{"localhost", range(gpus_here ? env.gpus : 1)}};
  }

  std::vector<HostSlots> hosts = pool;
  if (!o.include.empty()) hosts = include_hosts(pool, o.include);
  if (!o.exclude.empty()) hosts = exclude_hosts(pool, o.exclude);
  if (hosts.empty())
    throw ConfigError(
        cat("--exclude ", o.exclude, " leaves no slot to run on (the pool: ", describe_pool(pool), ")"));
  if (o.num_nodes) {
    if (std::size_t(*o.num_nodes) > hosts.size())
      throw ConfigError(cat("--num_nodes ", *o.num_nodes, " but the hostfile lists ", hosts.size(),
                            " host(s): ", describe_pool(hosts)));
    hosts.resize(std::size_t(*o.num_nodes));
  }
  if (o.num_gpus) {
    if (o.hostfile.empty() && gpus_here && env.gpus > 0 && *o.num_gpus > env.gpus)
      throw ConfigError(cat("--num_gpus ", *o.num_gpus, " but ", env.gpus,
                            " GPU(s) are visible on this machine; use at most ", env.gpus,
                            " (or --backend host, whose ranks need no GPU)"));
    for (HostSlots& h : hosts) h.slots = range(*o.num_gpus);
  }

  LaunchPlan plan;
  plan.hosts = hosts;
  int local_ranks = 0;
  for (const HostSlots& h : hosts) {
    plan.world_size += int(h.slots.size());
    if (is_local(h.host, env.hostname)) local_ranks += int(h.slots.size());
  }

  std::vector<std::string> fwd;
  for (const std::string& kv : env.environ) {
    const std::string name = kv.substr(0, kv.find('='));
    if (forwarded(name)) fwd.push_back(name);
  }
  std::sort(fwd.begin(), fwd.end());
  fwd.erase(std::unique(fwd.begin(), fwd.end()), fwd.end());

  std::vector<std::string>& a = plan.argv;
  a.push_back(env.mpirun);
  if (env.root) a.push_back("--allow-run-as-root");
  if (local_ranks > env.cores) a.push_back("--oversubscribe");
  if (o.bind_cores_to_rank) {
    // The busiest host sets the share: every rank gets as many cores as a rank there can (the hosts of a
    // pool are alike, as DeepSpeed assumes).
    std::size_t most = 0;
    for (const HostSlots& h : hosts) most = std::max(most, h.slots.size());
    const int per_rank = env.cores / int(most);
    if (per_rank < 1)
      throw ConfigError(cat("--bind_cores_to_rank: ", most, " ranks on a host of ", env.cores,
                            " cores leave none per rank; run at most ", env.cores,
                            " ranks per host, or leave --bind_cores_to_rank out"));
    a.insert(a.end(), {"--map-by", cat("slot:PE=", per_rank), "--bind-to", "core"});
  } else {
    // Each rank runs many threads (CPU optimizer, BLAS, I/O); Open MPI's default binding for <= 2 ranks
    // would hold all of a rank's threads to one core.
    a.insert(a.end(), {"--bind-to", "none"});
  }
  // One app context per run of hosts with the same slot list (STRATA_LOCAL_DEVICES is per context).
  for (std::size_t i = 0; i < hosts.size();) {
    std::size_t j = i;
    std::string host_list;
    while (j < hosts.size() && hosts[j].slots == hosts[i].slots) {
      host_list += cat(j > i ? "," : "", hosts[j].host, ":", hosts[j].slots.size());
      ++j;
    }
    if (i > 0) a.push_back(":");
    a.insert(a.end(), {"-np", std::to_string((j - i) * hosts[i].slots.size()), "-H", host_list, "-x",
                       cat(comm::kLocalDevicesEnv, "=", join_ints(hosts[i].slots))});
    for (const std::string& name : fwd) a.insert(a.end(), {"-x", name});
    a.push_back(env.exe);
    a.insert(a.end(), command.begin(), command.end());
    i = j;
  }
  return plan;
}

int launch_exit_status(int wait_status, int stop) {
  const int code = WIFSIGNALED(wait_status) ? 128 + WTERMSIG(wait_status)
                   : WIFEXITED(wait_status) ? WEXITSTATUS(wait_status)
                                            : 1;
  if (stop != 0 && (code == 128 + SIGUSR1 || code == 128 + SIGUSR2)) return 128 + stop;
  return code;
}

std::string find_program(const std::string& name, const std::string& path_list) {
  const auto executable = [](const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (name.find('/') != std::string::npos) return executable(name) ? name : "";
  for (const std::string& dir : split(path_list, ':')) {
    const std::string p = (dir.empty() ? "." : dir) + "/" + name;
    if (executable(p)) return p;
  }
  return "";
}

std::string shell_join(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& w : argv) {
    if (!out.empty()) out += ' ';
    const bool plain = !w.empty() && std::all_of(w.begin(), w.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) ||
             std::string_view("_@%+=:,./-").find(c) != std::string_view::npos;
    });
    if (plain) {
      out += w;
      continue;
    }
    out += '\'';
    for (char c : w) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    out += '\'';
  }
  return out;
}

}  // namespace strata::cli
