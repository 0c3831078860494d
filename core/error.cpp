#include "core/error.h"

#include <cstdio>
#include <cstring>

#include "core/log.h"

namespace strata {
namespace detail {

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

std::string check_message(const char* file, int line, const char* stmt, std::string_view detail) {
  std::string msg = cat(file, ":", line, ": `", stmt, "` failed");
  if (!detail.empty()) msg += cat(": ", detail);
  return msg;
}

std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r returns the message pointer (which may or may not be buf).
  const char* s = strerror_r(err, buf, sizeof buf);
  return cat(s, " (errno ", err, ")");
}

void throw_check(const char* file, int line, const char* stmt, const std::string& detail) {
  throw Error(check_message(file, line, stmt, detail));
}

void throw_sys(const char* file, int line, const char* stmt, int err, const std::string& detail) {
  std::string d = detail.empty() ? errno_text(err) : cat(detail, ": ", errno_text(err));
  throw IoError(check_message(file, line, stmt, d));
}

void throw_backend(const char* file, int line, const char* stmt, const char* api, int code,
                   const char* text) {
  throw BackendError(check_message(file, line, stmt, cat(api, " error ", code, ": ", text)));
}

}  // namespace detail

std::string format_size(std::uint64_t bytes, int decimals) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", (unsigned long long)bytes);
  else
    std::snprintf(buf, sizeof buf, "%.*f %s", decimals, v, units[u]);
  return buf;
}

std::string format_bytes(std::size_t bytes) {
  if (bytes < 1024) return format_size(bytes);
  return format_size(bytes) + " (" + std::to_string(bytes) + " bytes)";
}

}  // namespace strata
