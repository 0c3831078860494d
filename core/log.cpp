#include "core/log.h"

#include <unistd.h>

#include <cstdlib>
#include <mutex>

namespace strata::log {
namespace {

Level level_from_env() {
  const char* s = std::getenv("STRATA_LOG");
  if (!s || !*s) return Level::info;
  try {
    return parse_level(s);
  } catch (const ConfigError&) {
    return Level::info;  // a bad value must not stop the program before main can report it
  }
}

std::atomic<int> g_level{int(level_from_env())};
std::atomic<int> g_rank{-1};

const char* name(Level l) {
  switch (l) {
    case Level::debug:
      return "debug";
    case Level::info:
      return "info";
    case Level::warn:
      return "warn";
    case Level::error:
      return "error";
  }
  return "?";
}

}  // namespace

Level level() {
  return Level(g_level.load(std::memory_order_relaxed));
}
void set_level(Level l) {
  g_level.store(int(l));
}
void set_rank(int r) {
  g_rank.store(r);
}
int rank() {
  return g_rank.load();
}

void set_job_rank(int r) {
  set_rank(r);
  if (r != 0 && !std::getenv("STRATA_LOG")) set_level(Level::warn);
}

Level parse_level(const std::string& s) {
  if (s == "debug") return Level::debug;
  if (s == "info") return Level::info;
  if (s == "warn" || s == "warning") return Level::warn;
  if (s == "error") return Level::error;
  throw ConfigError(detail::cat("STRATA_LOG: \"", s, "\" is not one of debug, info, warn, error"));
}

void write(Level l, const std::string& msg) {
  std::string line = rank() >= 0 ? detail::cat("[strata r", rank(), " ", name(l), "] ")
                                 : detail::cat("[strata ", name(l), "] ");
  line += msg;
  line += '\n';
  // One write(2) per line keeps lines whole across threads and processes.
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n <= 0) break;
    p += n;
    left -= size_t(n);
  }
}

}  // namespace strata::log
