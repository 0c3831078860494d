// strata/core/log.h: levelled logging to stderr.
//
// Example:
//   STRATA_LOG_INFO("swap dir ", dir, " holds ", n, " files");
//   STRATA_WARN_ONCE("O_DIRECT refused on ", path, "; using buffered I/O");
//   strata::log::set_rank(3);                 // lines become "[strata r3 info] ..."
//
// The level comes from STRATA_LOG (debug|info|warn|error, default info) or set_level(). Lines are written
// whole (one write per line) so threads do not interleave mid-line.
#pragma once

#include <atomic>
#include <string>

#include "core/error.h"

namespace strata::log {

enum class Level { debug = 0, info = 1, warn = 2, error = 3 };

Level level();
void set_level(Level l);
// Parses "debug" | "info" | "warn" | "error"; throws ConfigError naming the allowed values.
Level parse_level(const std::string& s);
// Rank shown in every line once set (-1: none).
void set_rank(int rank);
// As one rank of a multi-rank job: set_rank, and ranks other than 0 log warnings and errors only unless
// STRATA_LOG chooses the level (strata train and the Python package under mpirun).
void set_job_rank(int rank);
int rank();
void write(Level l, const std::string& msg);
inline bool enabled(Level l) {
  return int(l) >= int(level());
}

}  // namespace strata::log

#define STRATA_LOG_AT(lvl, ...)                                                                     \
  do {                                                                                              \
    if (::strata::log::enabled(lvl)) ::strata::log::write(lvl, ::strata::detail::cat(__VA_ARGS__)); \
  } while (0)
#define STRATA_LOG_DEBUG(...) STRATA_LOG_AT(::strata::log::Level::debug, __VA_ARGS__)
#define STRATA_LOG_INFO(...) STRATA_LOG_AT(::strata::log::Level::info, __VA_ARGS__)
#define STRATA_LOG_WARN(...) STRATA_LOG_AT(::strata::log::Level::warn, __VA_ARGS__)
#define STRATA_LOG_ERROR(...) STRATA_LOG_AT(::strata::log::Level::error, __VA_ARGS__)
// Warns the first time this statement is reached in the process, never again.
#define STRATA_WARN_ONCE(...)                                         \
  do {                                                                \
    static std::atomic<bool> strata_warned_{false};                   \
    if (!strata_warned_.exchange(true)) STRATA_LOG_WARN(__VA_ARGS__); \
  } while (0)
