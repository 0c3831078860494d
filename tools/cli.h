// strata/tools/cli.h: how a `strata` subcommand plugs into the one executable.
//
// Example (tools/cmd_report.cpp):
//   static strata::cli::Command report("report", "Print what this build and machine support",
//       [](CLI::App& sub) { auto opts = std::make_shared<Opts>(); sub.add_option(...);
//                           return [opts] { return run_report(*opts); }; });
//
// Each tools/cmd_*.cpp file registers itself at static-initialisation time; tools/CMakeLists.txt compiles
// every cmd_*.cpp straight into the executable, so adding a subcommand touches no other file.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace strata::cli {

// Sets up options on `sub` and returns the action to run when the subcommand is chosen; the action
// returns the process exit code.
using Setup = std::function<std::function<int()>(CLI::App& sub)>;

struct Command {
  Command(std::string name, std::string help, Setup setup);
};

struct Registered {
  std::string name, help;
  Setup setup;
};
std::vector<Registered>& registry();

}  // namespace strata::cli
